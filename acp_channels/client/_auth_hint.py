"""What to do about a refusal, in a line: the way the server asks to be signed in to, read from
its `WWW-Authenticate` challenge, and what the client sent.

* `Bearer ... resource_metadata="..."` (an OAuth protected resource, RFC 9728): sign in with
  `acp-client login URL`;
* `Bearer` without it: a token (ACP_TOKEN or --token);
* `Cookie` (the logged-in users of the site, `acp_channels.auth.django_user`): log in on the
  site's pages in a browser; the terminal client cannot use that session;
* a token sent and refused (`error="invalid_token"`): it expired or was revoked, and how to get
  a new one; `error="insufficient_scope"`: the scope it lacks.
"""

from __future__ import annotations

from typing import Literal

from ._errors import AuthenticationError
from ._oauth_discovery import Challenge, parse_challenges

__all__ = ["Credential", "refusal_hint"]

#: Where the credentials the client sent came from: a stored `acp-client login`, a token
#: (ACP_TOKEN, --token), an Authorization header (-H), or none.
Credential = Literal["login", "token", "header"] | None


def _bearer(challenges: list[Challenge]) -> Challenge | None:
    return next((challenge for challenge in challenges if challenge.scheme == "bearer"), None)


def refusal_hint(error: AuthenticationError, kind: str, *, url: str = "URL", credential: Credential = None) -> str:
    """The hint after a 401/403 (`kind`: the transport, "http" or "ws"; `url`: as the user gave it)."""
    challenges = parse_challenges(error.www_authenticate)
    bearer = _bearer(challenges)
    oauth = bearer is not None and bool(bearer.params.get("resource_metadata"))
    login = f"acp-client login {url}"
    if error.status_code == 401 and not error.credentials_sent:
        if oauth:
            return f"The server signs users in with OAuth: run `{login}`, then this again (or set ACP_TOKEN)."
        if any(challenge.scheme == "cookie" for challenge in challenges) and bearer is None:
            return (
                "The server signs users in on its web pages (a session cookie): log in with the site's page "
                "in a browser; the terminal client cannot use that session."
            )
        return "The server requires authentication with a bearer token: set ACP_TOKEN (or pass --token)."
    if error.status_code == 401:
        invalid = bearer is not None and bearer.params.get("error") == "invalid_token"
        if credential == "login":
            return (
                f"The server refused the stored sign-in (expired or revoked), and it could not be renewed: `{login}`."
            )
        if invalid or credential == "token":
            how = "set a new one"
            if oauth:
                how = f"run `{login}` and leave ACP_TOKEN and --token out, or set a new ACP_TOKEN"
            return f"The server refused the token (expired, revoked or wrong): {how}."
        return "The server refused the credentials: check ACP_TOKEN, --token or the Authorization header."
    if not error.credentials_sent and kind == "ws":
        # Servers such as daphne refuse any WebSocket upgrade with 403, a wrong path too.
        return (
            "The server refused the WebSocket (403): it requires authentication "
            f"(`{login}` where it signs users in with OAuth, else set ACP_TOKEN or pass --token), "
            "or the URL is wrong."
        )
    if bearer is not None and bearer.params.get("error") == "insufficient_scope":
        scope = bearer.params.get("scope", "")
        if credential == "login" or oauth:
            return f"The token lacks a scope the server asks for ({scope}): run `{login} --scope '{scope}'`."
        return f"The token lacks a scope the server asks for ({scope}): get one that has it."
    if kind == "ws":
        # Servers such as daphne can refuse a WebSocket upgrade only with 403.
        return "The server refused the WebSocket (403): the token is wrong or not allowed here."
    return "The server refused access (403): these credentials are not allowed here."
