"""Experiment, not a recommended deployment: the demo application served by Django with no
middleware and without django.db's request signal receivers.

Each Django middleware built on MiddlewareMixin (CorsMiddleware, SecurityMiddleware,
CommonMiddleware in the demo) runs its process_request / process_response through
sync_to_async, and the db receivers of request_started / request_finished are sync too: under
ASGI each of those calls is a hop to a thread of the request's ThreadSensitiveContext, whose
thread lives as long as the response (an SSE stream holds one). This module removes all of them
but `sync_to_async(response.close)`, which Django's ASGIHandler always does, to measure what
the view layer costs without them: `python -m bench.run --servers ours-daphne-lean`.
"""

from __future__ import annotations

import os

os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings_lean"

from acp_channels._routing import build_asgi_application
from django.core import signals
from django.db import close_old_connections, reset_queries

signals.request_started.disconnect(reset_queries)
signals.request_started.disconnect(close_old_connections)
signals.request_finished.disconnect(close_old_connections)

application = build_asgi_application()
