"""System checks of the OAuth settings (acp_channels.oauth): E070-E074, W070.

Registered by apps.py. The OAuth settings are in use when AUTHENTICATE is
`acp_channels.oauth.access_token` or any OAUTH_* key is set; then django-oauth-toolkit (the
`oauth` extra) must be installed and in INSTALLED_APPS.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from typing import Any, Final
from urllib.parse import urlsplit

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register

from acp_channels._conf import acp_settings

OAUTH_SETTINGS: Final = ("OAUTH_RESOURCE", "OAUTH_AUTHORIZATION_SERVERS", "OAUTH_SCOPES")
AUTHENTICATOR: Final = "acp_channels.oauth.access_token"
EXTRA_HINT: Final = "pip install 'acp-channels[oauth]' (django-oauth-toolkit), or remove the OAuth settings."
APP_HINT: Final = (
    'Add "oauth2_provider" to INSTALLED_APPS and run migrate (docs/authentication.md, '
    '"OAuth with django-oauth-toolkit").'
)


@register(Tags.compatibility)
def check_oauth(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    raw = getattr(settings, "ACP_CHANNELS", {})
    if not isinstance(raw, dict):
        return []  # E000 says so
    errors = _check_values()
    uses_authenticator = acp_settings.AUTHENTICATE == AUTHENTICATOR
    named = [name for name in OAUTH_SETTINGS if name in raw]
    if not uses_authenticator and not named:
        return errors
    what = "ACP_CHANNELS['AUTHENTICATE'] is the OAuth authenticator" if uses_authenticator else f"{named[0]} is set"
    if importlib.util.find_spec("oauth2_provider") is None:
        return [
            *errors,
            Error(f"{what}, but django-oauth-toolkit is not installed.", hint=EXTRA_HINT, id="acp_channels.E073"),
        ]
    if uses_authenticator and "oauth2_provider" not in installed_apps():
        errors.append(
            Error(f"{what}, but oauth2_provider is not in INSTALLED_APPS.", hint=APP_HINT, id="acp_channels.E074")
        )
    if uses_authenticator and not acp_settings.OAUTH_AUTHORIZATION_SERVERS:
        errors.append(
            Warning(
                "The OAuth authenticator is configured without OAUTH_AUTHORIZATION_SERVERS: clients cannot "
                "discover where to get a token (/.well-known/oauth-protected-resource names none).",
                hint="Set ACP_CHANNELS['OAUTH_AUTHORIZATION_SERVERS'] to the issuer URL(s), e.g. "
                '["https://example.com/o"].',
                id="acp_channels.W070",
            )
        )
    return errors


def installed_apps() -> list[str]:
    return list(settings.INSTALLED_APPS)


def _check_values() -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    resource = acp_settings.OAUTH_RESOURCE
    if resource is not None and not _is_url(resource):
        errors.append(
            Error(
                f"ACP_CHANNELS['OAUTH_RESOURCE'] must be an absolute http(s) URL or None, not {resource!r}.",
                id="acp_channels.E070",
            )
        )
    servers = acp_settings.OAUTH_AUTHORIZATION_SERVERS
    if not isinstance(servers, list | tuple) or not all(_is_url(server) for server in servers):
        errors.append(
            Error(
                f"ACP_CHANNELS['OAUTH_AUTHORIZATION_SERVERS'] must be a list of issuer URLs, not {servers!r}.",
                id="acp_channels.E071",
            )
        )
    scopes = acp_settings.OAUTH_SCOPES
    if not isinstance(scopes, Mapping) or not all(
        key in ("connect", "observe", "control") and isinstance(value, str) and value and " " not in value
        for key, value in scopes.items()
    ):
        errors.append(
            Error(
                "ACP_CHANNELS['OAUTH_SCOPES'] must map 'connect', 'observe' or 'control' to a scope "
                f"(a word without spaces), not {scopes!r}.",
                id="acp_channels.E072",
            )
        )
    return errors


def _is_url(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    parts = urlsplit(value)
    return parts.scheme in ("http", "https") and bool(parts.netloc) and not parts.fragment
