"""tests.auth_site (the django_user authenticator, an sqlite database at ACP_TEST_DATABASE) with
what a start checks taken from the environment (tests/test_startup_live.py):
REQUIRED_PERMISSION from ACP_TEST_REQUIRED_PERMISSION, and the default channel layer's BACKEND
from ACP_TEST_LAYER_BACKEND.

    DJANGO_SETTINGS_MODULE=tests.startup_site ACP_TEST_DATABASE=/tmp/x.sqlite3 python -m tests.startup_site

migrates the database and creates the permission `auth.use_agent` as a row of its own (no model
declares it), as a site's data migration would.
"""

from __future__ import annotations

import os

from tests.auth_site import *  # noqa: F403
from tests.auth_site import ACP_CHANNELS

ACP_CHANNELS = {**ACP_CHANNELS, "REQUIRED_PERMISSION": os.environ.get("ACP_TEST_REQUIRED_PERMISSION", "auth.view_user")}
if backend := os.environ.get("ACP_TEST_LAYER_BACKEND"):
    CHANNEL_LAYERS = {"default": {"BACKEND": backend}}

#: A permission only the database holds.
DATABASE_PERMISSION = ("auth", "use_agent")


def create_database_permission() -> None:
    import django

    django.setup()
    from django.contrib.auth.models import Permission, User
    from django.contrib.contenttypes.models import ContentType
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    app_label, codename = DATABASE_PERMISSION
    content_type = ContentType.objects.get_for_model(User)
    assert content_type.app_label == app_label
    Permission.objects.get_or_create(codename=codename, content_type=content_type, defaults={"name": "Use the agent"})


if __name__ == "__main__":
    create_database_permission()
