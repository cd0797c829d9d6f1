"""ASGI entry point: `daphne demo_project.asgi:application`."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_project.settings")

from acp_channels.routing import build_asgi_application

application = build_asgi_application()
