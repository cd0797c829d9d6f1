"""The OAuth 2 exchanges of `acp-client login`: the authorization code flow with PKCE through a
loopback redirect (RFC 6749 §4.1, RFC 7636, RFC 8252 §7.3), the device flow (RFC 8628), the
refresh token grant (RFC 6749 §6) and revocation (RFC 7009). Every token request names the
resource (RFC 8707), so the authorization server binds the token to it.

Each function takes the `httpx.AsyncClient` to use; errors are `LoginError` (the authorization
server's `error` and `error_description`, never a token or a code).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import html
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx

from ._oauth_discovery import AuthorizationServer, LoginError
from ._token_source import check_token

__all__ = [
    "DEVICE_CODE_GRANT",
    "DeviceAuthorization",
    "LoopbackReceiver",
    "OAuthError",
    "TokenResponse",
    "authorization_url",
    "exchange_code",
    "pkce_pair",
    "poll_device_token",
    "refresh_tokens",
    "request_device_authorization",
    "revoke",
]

DEVICE_CODE_GRANT: Final = "urn:ietf:params:oauth:grant-type:device_code"
#: RFC 8628 §3.2 and RFC 8628 §3.5: the polling interval when the server names none, and what
#: `slow_down` adds to it.
DEFAULT_INTERVAL: Final = 5.0
SLOW_DOWN_STEP: Final = 5.0
#: The longest request line and headers the loopback receiver reads from the browser.
MAX_REQUEST_HEAD: Final = 16 * 1024
CALLBACK_PATH: Final = "/callback"


class OAuthError(LoginError):
    """The authorization server answered a token request with an error (RFC 6749 §5.2)."""

    def __init__(self, what: str, error: str, description: str | None = None) -> None:
        self.error = error
        self.description = description
        detail = f": {description}" if description else ""
        super().__init__(f"{what}: {error}{detail}")


def pkce_pair() -> tuple[str, str]:
    """A PKCE verifier (64 characters of base64url, within RFC 7636's 43 to 128) and its S256
    challenge."""
    verifier = secrets.token_urlsafe(48)
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return verifier, base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


@dataclass(frozen=True)
class TokenResponse:
    """A successful token response (RFC 6749 §5.1), checked."""

    access_token: str
    refresh_token: str | None
    expires_in: float | None
    scope: str | None

    @classmethod
    def parse(cls, document: Any, what: str) -> TokenResponse:
        if not isinstance(document, dict):
            raise LoginError(f"{what}: the answer is not a JSON object")
        access_token = document.get("access_token")
        if not isinstance(access_token, str) or str(document.get("token_type", "")).lower() != "bearer":
            raise LoginError(f"{what}: the answer has no bearer access_token")
        check_token(access_token)
        refresh_token = document.get("refresh_token")
        expires_in = document.get("expires_in")
        scope = document.get("scope")
        return cls(
            access_token=access_token,
            refresh_token=refresh_token if isinstance(refresh_token, str) and refresh_token else None,
            expires_in=float(expires_in) if isinstance(expires_in, int | float) and expires_in >= 0 else None,
            scope=scope if isinstance(scope, str) else None,
        )


async def token_request(http: httpx.AsyncClient, endpoint: str, form: dict[str, str], what: str) -> TokenResponse:
    """POST a token request (a public client: `client_id` in the form, no secret)."""
    try:
        response = await http.post(endpoint, data=form, headers={"Accept": "application/json"})
    except httpx.HTTPError as exc:
        raise LoginError(f"{what}: {type(exc).__name__}: {exc}") from exc
    document = _json(response)
    if response.status_code == 200:
        return TokenResponse.parse(document, what)
    raise oauth_error(what, response.status_code, document)


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def oauth_error(what: str, status: int, document: Any) -> LoginError:
    """The error of an RFC 6749 §5.2 answer (or of a status without one)."""
    if isinstance(document, dict) and isinstance(document.get("error"), str):
        description = document.get("error_description")
        return OAuthError(what, document["error"], str(description)[:300] if description else None)
    return LoginError(f"{what}: HTTP {status}")


def _with_resource(form: dict[str, str], resource: str | None) -> dict[str, str]:
    return {**form, "resource": resource} if resource else form


# -- authorization code with PKCE, through a loopback redirect ----------------------------------------


def authorization_url(
    server: AuthorizationServer,
    *,
    client_id: str,
    redirect_uri: str,
    scopes: Iterable[str],
    state: str,
    code_challenge: str,
    resource: str | None,
) -> str:
    """Where the browser goes to sign in and authorize (RFC 6749 §4.1.1, RFC 7636 §4.3)."""
    if server.authorization_endpoint is None:
        raise LoginError(f"{server.metadata_url} names no authorization_endpoint")
    if server.code_challenge_methods and "S256" not in server.code_challenge_methods:
        raise LoginError(f"{server.issuer} does not support PKCE with S256 (code_challenge_methods_supported)")
    query = _with_resource(
        {
            "response_type": "code",
            "client_id": client_id,
            "redirect_uri": redirect_uri,
            "scope": " ".join(scopes),
            "state": state,
            "code_challenge": code_challenge,
            "code_challenge_method": "S256",
        },
        resource,
    )
    separator = "&" if urlsplit(server.authorization_endpoint).query else "?"
    return f"{server.authorization_endpoint}{separator}{urlencode(query)}"


async def exchange_code(
    http: httpx.AsyncClient,
    server: AuthorizationServer,
    *,
    client_id: str,
    code: str,
    redirect_uri: str,
    verifier: str,
    resource: str | None,
) -> TokenResponse:
    form = {
        "grant_type": "authorization_code",
        "code": code,
        "redirect_uri": redirect_uri,
        "client_id": client_id,
        "code_verifier": verifier,
    }
    return await token_request(http, server.token_endpoint, _with_resource(form, resource), "the code exchange")


@dataclass
class Callback:
    """What the browser brought back to the loopback redirect."""

    code: str | None = None
    error: str | None = None
    description: str | None = None


class LoopbackReceiver:
    """The redirect target of the code flow: an HTTP listener on 127.0.0.1, a free port, path
    /callback (RFC 8252 §7.3). It answers the browser with a short page and hands over the
    code of the answer whose `state` is the one sent; an answer with another state is refused
    (400) and the wait goes on."""

    def __init__(self, state: str, *, success_page: str) -> None:
        self.state = state
        self.success_page = success_page
        self.port = 0
        self.refused = 0  # answers with a wrong state (tests)
        self._server: asyncio.Server | None = None
        self._result: asyncio.Future[Callback] | None = None

    @property
    def redirect_uri(self) -> str:
        return f"http://127.0.0.1:{self.port}{CALLBACK_PATH}"

    @contextlib.asynccontextmanager
    async def listening(self) -> AsyncIterator[LoopbackReceiver]:
        self._result = asyncio.get_running_loop().create_future()
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        try:
            yield self
        finally:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    async def wait(self, timeout: float) -> str:
        """The authorization code (LoginError for an error answer or no answer in time)."""
        assert self._result is not None, "use `async with receiver.listening()`"
        try:
            callback = await asyncio.wait_for(asyncio.shield(self._result), timeout)
        except TimeoutError:
            raise LoginError(f"no answer from the browser within {timeout:g}s") from None
        if callback.code is None:
            detail = f": {callback.description}" if callback.description else ""
            raise LoginError(f"the authorization server refused: {callback.error}{detail}")
        return callback.code

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            writer.close()
            return
        status, page = self._answer(head[:MAX_REQUEST_HEAD].decode("latin-1"))
        body = f"<!doctype html><meta charset=utf-8><title>acp-client</title><p>{html.escape(page)}</p>\n".encode()
        writer.write(
            f"HTTP/1.1 {status}\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {len(body)}\r\n"
            "Cache-Control: no-store\r\nConnection: close\r\n\r\n".encode("latin-1")
            + body
        )
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()

    def _answer(self, head: str) -> tuple[str, str]:
        method, _, rest = head.partition(" ")
        target = rest.partition(" ")[0]
        parts = urlsplit(target)
        if method != "GET" or parts.path != CALLBACK_PATH:
            return "404 Not Found", "Not found."
        query = {name: values[0] for name, values in parse_qs(parts.query).items()}
        if not secrets.compare_digest(query.get("state", "").encode(), self.state.encode()):
            self.refused += 1
            return "400 Bad Request", "This answer is not for the sign-in under way (its state does not match)."
        assert self._result is not None
        if self._result.done():
            return "200 OK", "Already answered: you can close this window."
        if "code" in query:
            self._result.set_result(Callback(code=query["code"]))
            return "200 OK", self.success_page
        error = query.get("error", "no code in the answer")
        self._result.set_result(Callback(error=error, description=query.get("error_description")))
        return "400 Bad Request", f"Sign-in failed: {error}. You can close this window."


# -- the device flow (RFC 8628) ---------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceAuthorization:
    """The device authorization response (RFC 8628 §3.2)."""

    device_code: str
    user_code: str
    verification_uri: str
    verification_uri_complete: str | None
    expires_in: float
    interval: float


async def request_device_authorization(
    http: httpx.AsyncClient, server: AuthorizationServer, *, client_id: str, scopes: Iterable[str], resource: str | None
) -> DeviceAuthorization:
    what = "the device authorization"
    endpoint = server.device_authorization_endpoint
    if endpoint is None:
        raise LoginError(f"{server.issuer} does not offer the device flow (no device_authorization_endpoint)")
    form = _with_resource({"client_id": client_id, "scope": " ".join(scopes)}, resource)
    try:
        response = await http.post(endpoint, data=form, headers={"Accept": "application/json"})
    except httpx.HTTPError as exc:
        raise LoginError(f"{what}: {type(exc).__name__}: {exc}") from exc
    document = _json(response)
    if response.status_code != 200:
        raise oauth_error(what, response.status_code, document)
    required = ("device_code", "user_code", "verification_uri")
    if not isinstance(document, dict) or not all(
        isinstance(document.get(key), str) and document[key] for key in required
    ):
        raise LoginError(f"{what}: the answer lacks device_code, user_code or verification_uri")
    complete = document.get("verification_uri_complete")
    expires_in = document.get("expires_in")
    interval = document.get("interval")
    return DeviceAuthorization(
        device_code=document["device_code"],
        user_code=document["user_code"],
        verification_uri=document["verification_uri"],
        verification_uri_complete=complete if isinstance(complete, str) and complete else None,
        expires_in=float(expires_in) if isinstance(expires_in, int | float) and expires_in > 0 else 600.0,
        interval=float(interval) if isinstance(interval, int | float) and interval > 0 else DEFAULT_INTERVAL,
    )


async def poll_device_token(
    http: httpx.AsyncClient,
    server: AuthorizationServer,
    device: DeviceAuthorization,
    *,
    client_id: str,
    resource: str | None,
    sleep: Callable[[float], Awaitable[None]] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> TokenResponse:
    """Poll the token endpoint until the user approved (RFC 8628 §3.4 and RFC 8628 §3.5): every
    `interval` seconds, 5 more after each `slow_down`, until `expires_in` has passed (`sleep`, `clock`:
    asyncio's and the monotonic clock unless a test moves time itself)."""
    sleep = sleep if sleep is not None else asyncio.sleep
    deadline = clock() + device.expires_in
    interval = device.interval
    form = _with_resource(
        {"grant_type": DEVICE_CODE_GRANT, "device_code": device.device_code, "client_id": client_id}, resource
    )
    while True:
        if clock() + interval > deadline:
            raise LoginError(f"the code {device.user_code} expired before it was approved")
        await sleep(interval)
        try:
            return await token_request(http, server.token_endpoint, form, "the device token request")
        except OAuthError as error:
            if error.error == "authorization_pending":
                continue
            if error.error == "slow_down":
                interval += SLOW_DOWN_STEP
                continue
            if error.error == "access_denied":
                raise LoginError("the sign-in was denied at the authorization server") from None
            if error.error == "expired_token":
                raise LoginError(f"the code {device.user_code} expired before it was approved") from None
            raise


# -- refresh and revocation ------------------------------------------------------------------------------


async def refresh_tokens(
    http: httpx.AsyncClient, token_endpoint: str, *, client_id: str, refresh_token: str, resource: str | None
) -> TokenResponse:
    form = {"grant_type": "refresh_token", "refresh_token": refresh_token, "client_id": client_id}
    return await token_request(http, token_endpoint, _with_resource(form, resource), "the token refresh")


async def revoke(http: httpx.AsyncClient, endpoint: str, *, client_id: str, token: str, hint: str) -> bool:
    """Revoke `token` (RFC 7009; `hint` is `refresh_token` or `access_token`): whether the
    server said it did (200)."""
    form = {"token": token, "token_type_hint": hint, "client_id": client_id}
    try:
        response = await http.post(endpoint, data=form)
    except httpx.HTTPError:
        return False
    return response.status_code == 200
