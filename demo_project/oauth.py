"""The demo as an OAuth 2 protected resource: `ACP_DEMO_OAUTH=1 ./dev.sh demo`.

django-oauth-toolkit is the authorization server, on the same site (`/o/authorize/`,
`/o/token/`, the device flow at `/o/device-authorization/` and `/o/device/`), with a SQLite
database under the state directory (ACP_DEMO_STATE_DIR, by default .venv/demo-oauth).
`python -m demo_project.oauth setup` (dev.sh runs it at start) migrates, creates the demo user
(demo/demo) and two public clients with PKCE: `acp-client`, the id `acp-client login` signs in
as by default (which may use the device flow too: demo_project/oauth_device.py), and `acp-demo`
for trying the code flow by hand; then it prints how to sign in.
`python -m demo_project.oauth token [SCOPES]` prints a fresh access token of the demo user (the
shortcut: no browser). Loopback only, like the rest of the demo.
"""

from __future__ import annotations

import os
import secrets
import sys
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:  # Django is imported once configured: the settings module imports this one
    from django.http import HttpRequest, JsonResponse
    from django.urls import URLPattern, URLResolver

USERNAME: Final = "demo"
PASSWORD: Final = "demo"  # the demo's, on loopback
CLIENT_ID: Final = "acp-demo"
#: The client id `acp-client login` uses unless told otherwise (DEFAULT_CLIENT_ID there).
TERMINAL_CLIENT_ID: Final = "acp-client"
REDIRECT_URIS: Final = "http://127.0.0.1/callback http://localhost/callback"
SCOPES: Final = {
    "acp:connect": "open and use connections to the agent",
    "acp:session:observe": "watch a live session (attach as observer)",
    "acp:session:control": "take part in a live session (attach as controller)",
}
ALL_SCOPES: Final = " ".join(SCOPES)


def state_dir() -> Path:
    root = Path(__file__).resolve().parent.parent
    return Path(os.environ.get("ACP_DEMO_STATE_DIR") or root / ".venv" / "demo-oauth")


def origin() -> str:
    """Where the demo serves (dev.sh: HOST, PORT), for the issuer URL the metadata names."""
    return (
        os.environ.get("ACP_DEMO_ORIGIN")
        or f"http://{os.environ.get('HOST', '127.0.0.1')}:{os.environ.get('PORT', '8000')}"
    )


def configure(settings: dict[str, Any]) -> None:
    """Turn the demo settings (a settings module's globals) into the OAuth demo's."""
    state = state_dir()
    state.mkdir(parents=True, exist_ok=True)
    settings["INSTALLED_APPS"] = [
        *settings["INSTALLED_APPS"],
        "django.contrib.sessions",
        "django.contrib.messages",
        "oauth2_provider",
    ]
    settings["MIDDLEWARE"] = [
        *settings["MIDDLEWARE"],
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "django.contrib.messages.middleware.MessageMiddleware",
    ]
    settings["DATABASES"] = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(state / "db.sqlite3")}}
    settings["DEFAULT_AUTO_FIELD"] = "django.db.models.BigAutoField"
    settings["TEMPLATES"] = [
        {
            "BACKEND": "django.template.backends.django.DjangoTemplates",
            "DIRS": [Path(__file__).resolve().parent / "templates"],
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
    settings["LOGIN_URL"] = "/accounts/login/"
    settings["OAUTH2_PROVIDER"] = {
        "SCOPES": SCOPES,
        "DEFAULT_SCOPES": ["acp:connect"],
        "PKCE_REQUIRED": True,
        "ACCESS_TOKEN_EXPIRE_SECONDS": 3600,
        # The device flow (demo_project/oauth_device.py): the page where the user enters the code
        # (made absolute on the request's URL), prefilled from the complete URI; a poll a second.
        "OAUTH2_VALIDATOR_CLASS": "demo_project.oauth_device.DemoValidator",
        "OAUTH_DEVICE_VERIFICATION_URI": "/o/device/",
        "OAUTH_DEVICE_VERIFICATION_URI_COMPLETE": "/o/device/?user_code={user_code}",
        "OAUTH_PRE_TOKEN_VALIDATION": [],  # DemoValidator.validate_device_code does its work
        "DEVICE_FLOW_INTERVAL": 1,
    }
    acp = settings["ACP_CHANNELS"]
    for key in ("ALLOW_ANONYMOUS", "TOKEN_LOOKUP", "TOKENS"):
        acp.pop(key, None)
    acp["AUTHENTICATE"] = "acp_channels.oauth.access_token"
    acp.setdefault("OAUTH_AUTHORIZATION_SERVERS", [origin() + "/o"])


def urls() -> list[URLPattern | URLResolver]:
    """DOT's endpoints, a login page, and RFC 8414 metadata of the authorization server."""
    from django.contrib.auth.views import LoginView
    from django.urls import include, path

    from demo_project.oauth_device import DeviceAuthorization

    return [
        path("o/device-authorization/", DeviceAuthorization.as_view()),  # before DOT's own
        path("o/", include("oauth2_provider.urls", namespace="oauth2_provider")),
        path("accounts/login/", LoginView.as_view(template_name="demo_login.html"), name="login"),
        path(".well-known/oauth-authorization-server/o", authorization_server_metadata),
    ]


def authorization_server_metadata(request: HttpRequest) -> JsonResponse:
    """RFC 8414 for DOT at /o (DOT serves OpenID discovery only with OIDC on)."""
    from django.http import JsonResponse

    issuer = f"{request.scheme}://{request.get_host()}/o"
    response = JsonResponse(
        {
            "issuer": issuer,
            "authorization_endpoint": f"{issuer}/authorize/",
            "token_endpoint": f"{issuer}/token/",
            "revocation_endpoint": f"{issuer}/revoke_token/",
            "introspection_endpoint": f"{issuer}/introspect/",
            "device_authorization_endpoint": f"{issuer}/device-authorization/",
            "scopes_supported": list(SCOPES),
            "response_types_supported": ["code"],
            "grant_types_supported": [
                "authorization_code",
                "refresh_token",
                "urn:ietf:params:oauth:grant-type:device_code",
            ],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": ["none", "client_secret_basic", "client_secret_post"],
        }
    )
    response["Access-Control-Allow-Origin"] = "*"
    return response


def setup() -> None:
    """Migrate, and create the demo user and the public clients once."""
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from oauth2_provider.models import get_application_model

    call_command("migrate", verbosity=0, interactive=False)
    users = get_user_model()._default_manager
    if not users.filter(username=USERNAME).exists():
        users.create_user(USERNAME, password=PASSWORD)
    for client_id, name in ((CLIENT_ID, "ACP demo (public, PKCE)"), (TERMINAL_CLIENT_ID, "acp-client (public, PKCE)")):
        get_application_model().objects.update_or_create(
            client_id=client_id,
            defaults={
                "name": name,
                "client_type": "public",
                "authorization_grant_type": "authorization-code",
                "redirect_uris": REDIRECT_URIS,
                "skip_authorization": True,
                "algorithm": "",
            },
        )


def issue(scope: str = ALL_SCOPES, seconds: float = 3600, username: str = USERNAME) -> str:
    """A new access token of `username` for the demo client (what the code flow would give)."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone
    from oauth2_provider.models import get_access_token_model, get_application_model

    token = secrets.token_urlsafe(32)
    get_access_token_model().objects.create(
        user=get_user_model()._default_manager.get(username=username),
        application=get_application_model().objects.get(client_id=CLIENT_ID),
        token=token,
        scope=scope,
        expires=timezone.now() + timedelta(seconds=seconds),
    )
    return token


def instructions() -> str:
    here = origin()
    return f"""\
OAuth demo: {here}/acp accepts access tokens of django-oauth-toolkit ({here}/o/), scopes {ALL_SCOPES}.
  metadata:     {here}/.well-known/oauth-protected-resource
  user:         {USERNAME} / {PASSWORD}
  clients:      {TERMINAL_CLIENT_ID} and {CLIENT_ID} (public, authorization code + PKCE, redirect \
http://127.0.0.1/callback; {TERMINAL_CLIENT_ID} also the device flow)
Sign in with the terminal client (your browser, or --device for a code to enter at {here}/o/device/):
  .venv/bin/acp-client login {here}
  .venv/bin/acp-client {here}
A token now (the demo user's, one hour):
  ACP_TOKEN=$(ACP_DEMO_OAUTH=1 .venv/bin/python -m demo_project.oauth token) .venv/bin/acp-client {here}
The code flow: open {here}/o/authorize/?response_type=code&client_id={CLIENT_ID}\
&redirect_uri=http://127.0.0.1/callback&scope=acp:connect&code_challenge=<S256 of a verifier>\
&code_challenge_method=S256, log in, take `code` from the redirect, then
  curl -d grant_type=authorization_code -d client_id={CLIENT_ID} -d code=<code> \\
       -d redirect_uri=http://127.0.0.1/callback -d code_verifier=<the verifier> {here}/o/token/
"""


def main(argv: list[str]) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_project.settings")
    os.environ["ACP_DEMO_OAUTH"] = "1"
    import django

    django.setup()
    command = argv[0] if argv else ""
    if command == "setup":
        setup()
        print(instructions(), file=sys.stderr)
        return 0
    if command == "token":
        print(issue(" ".join(argv[1:]) or ALL_SCOPES))
        return 0
    print("usage: python -m demo_project.oauth setup | token [SCOPE ...]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
