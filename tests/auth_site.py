"""A site with Django users for the session-cookie tests: the demo project plus sessions,
AuthenticationMiddleware and an sqlite database (ACP_TEST_DATABASE, a file path), with the
django_user authenticator and REQUIRED_PERMISSION "auth.view_user".

    DJANGO_SETTINGS_MODULE=tests.auth_site ACP_TEST_DATABASE=/tmp/x.sqlite3 python -m tests.auth_site

migrates the database, creates alice and bob (with the permission) and carol (without), and
prints {username: session cookie value} as JSON: a real login session each.
"""

from __future__ import annotations

import json
import os

from demo_project.settings import *  # noqa: F403
from demo_project.settings import ACP_CHANNELS, INSTALLED_APPS, MIDDLEWARE

INSTALLED_APPS = [*INSTALLED_APPS, "django.contrib.sessions"]
MIDDLEWARE = [
    *MIDDLEWARE,
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ.get("ACP_TEST_DATABASE", "")}}
ACP_CHANNELS = {
    **ACP_CHANNELS,
    "AUTHENTICATE": "acp_channels.auth.django_user",
    "REQUIRED_PERMISSION": "auth.view_user",
}
PERMITTED = ("alice", "bob")
USERS = (*PERMITTED, "carol")


def prepare() -> dict[str, str]:
    import django

    django.setup()
    from django.contrib.auth.models import Permission, User
    from django.core.management import call_command
    from django.test import Client

    call_command("migrate", verbosity=0, interactive=False)
    permission = Permission.objects.get(content_type__app_label="auth", codename="view_user")
    cookies: dict[str, str] = {}
    for name in USERS:
        user = User.objects.create_user(name, password=None)
        if name in PERMITTED:
            user.user_permissions.add(permission)
        client = Client()
        client.force_login(user)
        cookies[name] = client.cookies["sessionid"].value
    return cookies


if __name__ == "__main__":
    print(json.dumps(prepare()))
