"""ASGI entry point: `daphne demo_project.asgi:application`. Static files (the browser page's
script and styles, acp_channels' acp-client.js) are served by Django's ASGIStaticFilesHandler:
no build step, no collectstatic."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_project.settings")

import django

# Before the imports below: they need the apps loaded (as django.core.asgi.get_asgi_application).
django.setup(set_prefix=False)

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from acp_channels import AcpASGIHandler, build_asgi_application  # noqa: E402

application = build_asgi_application(http_application=ASGIStaticFilesHandler(AcpASGIHandler()))
