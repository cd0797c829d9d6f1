"""Settings for bench/asgi_lean.py (an experiment): the demo settings without middleware."""

from demo_project.settings import *  # noqa: F403

MIDDLEWARE: list[str] = []
