"""A site with the built-in tokens (acp_channels.tokens) for the token tests: the demo project
plus Django users, the admin and an sqlite database (ACP_TEST_DATABASE, a file path), with the
bearer_token authenticator, no TOKEN_LOOKUP, and REQUIRED_PERMISSION "acp_tokens.use_agent".

    DJANGO_SETTINGS_MODULE=tests.tokens_site ACP_TEST_DATABASE=/tmp/x.sqlite3 python -m tests.tokens_site

migrates the database, creates alice and bob (with the permission) and carol (without), issues
tokens with `manage.py acp_token create` as an operator would, and prints
{name: [token id, secret]} as JSON.
"""

from __future__ import annotations

import io
import json
import os

from demo_project.settings import *  # noqa: F403
from demo_project.settings import ACP_CHANNELS, INSTALLED_APPS, MIDDLEWARE

INSTALLED_APPS = [
    *INSTALLED_APPS,
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.admin",
    "acp_channels.tokens",
]
MIDDLEWARE = [
    *MIDDLEWARE,
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
ROOT_URLCONF = "tests.tokens_urls"
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ.get("ACP_TEST_DATABASE", "")}}
ACP_CHANNELS = {
    "AUTHENTICATE": "acp_channels.auth.bearer_token",
    "REQUIRED_PERMISSION": "acp_tokens.use_agent",
    **ACP_CHANNELS,  # the environment's ACP_<KEY> (ACP_REVALIDATE_SECONDS) still wins
}
PERMITTED = ("alice", "bob")
USERS = (*PERMITTED, "carol")
#: The tokens `prepare` issues: (name, user, acp_token create options).
TOKENS = (
    ("alice", "alice", []),
    ("alice-2", "alice", []),
    ("alice-ws", "alice", []),
    ("bob", "bob", []),
    ("carol", "carol", []),
    ("observer", "alice", ["--scope", "acp:session:observe"]),
    ("expired", "bob", ["--expires", "2020-01-01"]),
    ("alice-expiring", "alice", []),  # its expiry is set in the database by a test
)


def prepare() -> dict[str, tuple[int, str]]:
    import django

    django.setup()
    from django.contrib.auth.models import Permission, User
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    permission = Permission.objects.get(content_type__app_label="acp_tokens", codename="use_agent")
    for name in USERS:
        user = User.objects.create_user(name, password=None)
        if name in PERMITTED:
            user.user_permissions.add(permission)
    issued: dict[str, tuple[int, str]] = {}
    for name, user_name, options in TOKENS:
        out, err = io.StringIO(), io.StringIO()
        call_command("acp_token", "create", user_name, "--name", name, *options, stdout=out, stderr=err)
        token_id = int(err.getvalue().split()[1])
        issued[name] = (token_id, out.getvalue().strip())
    return issued


if __name__ == "__main__":
    print(json.dumps(prepare()))
