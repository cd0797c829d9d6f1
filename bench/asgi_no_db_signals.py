"""Experiment, not a recommended deployment: the demo application with django.db's request
signal receivers (reset_queries, close_old_connections) disconnected.

Django's ASGIHandler runs each request inside asgiref's ThreadSensitiveContext; the first
sync_to_async of a request (sending request_started to those sync receivers) starts a thread
that lives until the response ends, so every open SSE stream holds an OS thread and every POST
starts and joins one. The demo project has no database, so the receivers do nothing; without
them a stream holds no thread while it is open (`sync_to_async(response.close)` at its end still
starts one). `python -m bench.run --servers ours-daphne-nodb` measures the difference.
"""

from __future__ import annotations

from demo_project.asgi import application
from django.core import signals
from django.db import close_old_connections, reset_queries

signals.request_started.disconnect(reset_queries)
signals.request_started.disconnect(close_old_connections)
signals.request_finished.disconnect(close_old_connections)

__all__ = ["application"]
