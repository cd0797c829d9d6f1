"""`acp-client login URL` and `logout URL`, and `StoredLogin`: the stored sign-in as the
`TokenSource` that `acp-client URL` and `acp-bridge URL` use when given no other credentials.

login: discovery (`_oauth_discovery`), then the authorization code flow with PKCE through a
loopback redirect in the user's browser, or the device flow when asked (`--device`) or when no
browser can be opened here and the server offers it; the tokens go to the store
(`_token_store`). logout: revocation where the server offers it, and the record removed.

`StoredLogin` hands out the stored access token, renews it with the refresh token when it
expires within a minute or the server refused it, and stores what it got (the new refresh token
replacing the old one), under the record's file lock so that two clients of one user do not
both spend the same refresh token.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import sys
import threading
import time
import webbrowser
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, TextIO

import httpx

from acp_channels import __version__

from ._oauth_discovery import AuthorizationServer, ProtectedResource, default_scopes, discover, resource_for
from ._oauth_flows import (
    LoopbackReceiver,
    OAuthError,
    TokenResponse,
    authorization_url,
    exchange_code,
    pkce_pair,
    poll_device_token,
    refresh_tokens,
    request_device_authorization,
    revoke,
)
from ._token_store import LoginRecord, TokenStore

__all__ = ["DEFAULT_CLIENT_ID", "LoginOptions", "StoredLogin", "login", "logout"]

logger = logging.getLogger("acp_channels.client")

#: The client id `acp-client` signs in as unless told otherwise (--client-id): a site that
#: wants its users to sign in with acp-client registers a public client of this id, with the
#: loopback redirect http://127.0.0.1/callback (any port) and, for the device flow, that grant.
DEFAULT_CLIENT_ID: Final = "acp-client"
#: Renew the access token this long before it expires: a request under way must not meet it.
REFRESH_MARGIN: Final = 60.0
#: How long the browser has to come back to the loopback redirect.
BROWSER_WAIT: Final = 300.0
HTTP_TIMEOUT: Final = 30.0


def _http(timeout: float = HTTP_TIMEOUT, transport: httpx.AsyncBaseTransport | None = None) -> httpx.AsyncClient:
    """The HTTP client of the exchanges (`transport`: tests put a fake authorization server there)."""
    return httpx.AsyncClient(
        timeout=httpx.Timeout(timeout),
        follow_redirects=False,
        headers={"User-Agent": f"acp-client/{__version__}"},
        transport=transport,
    )


# -- the stored sign-in as a TokenSource ----------------------------------------------------------------


class StoredLogin:
    """The `TokenSource` of a stored `acp-client login` (see the module docstring)."""

    def __init__(
        self,
        record: LoginRecord,
        store: TokenStore,
        *,
        margin: float = REFRESH_MARGIN,
        timeout: float = HTTP_TIMEOUT,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.resource = record.resource
        self.store = store
        self.margin = margin
        self.timeout = timeout
        self.transport = transport
        self._record = record
        #: Refreshes this source made itself (not those another client stored): tests, logs.
        self.refreshes = 0

    @classmethod
    def for_url(cls, url: str, store: TokenStore | None = None) -> StoredLogin | None:
        """The stored sign-in for the server at `url`, or None."""
        store = store if store is not None else TokenStore()
        record = store.load(resource_for(url))
        return cls(record, store) if record is not None else None

    def __repr__(self) -> str:
        return f"StoredLogin({self.resource!r}, issuer={self._record.issuer!r})"

    async def token(self) -> str:
        record = self._record
        if record.refresh_token is not None and record.expires_within(self.margin):
            renewed = await self._renew(record.access_token)
            if renewed is not None:
                return renewed
        return self._record.access_token

    async def refresh(self, rejected: str) -> str | None:
        return await self._renew(rejected)

    async def _renew(self, rejected: str) -> str | None:
        """A token to replace `rejected`: one another client stored meanwhile, else a refresh."""
        record = await asyncio.to_thread(self._renew_locked, rejected)
        if record is None:
            return None
        self._record = record
        return record.access_token

    def _renew_locked(self, rejected: str) -> LoginRecord | None:
        """In a thread: under the record's lock, read it again and renew it if still needed."""
        with self.store.locked(self.resource):
            stored = self.store.load(self.resource)
            if stored is None:
                logger.info("no stored sign-in for %s any more (signed out)", self.resource)
                return None
            if stored.access_token != rejected and not stored.expires_within(self.margin):
                return stored  # another client renewed it
            if stored.refresh_token is None:
                logger.info("the stored sign-in for %s has no refresh token", self.resource)
                return None
            try:
                answer = asyncio.run(self._refresh(stored))
            except OAuthError as error:
                # invalid_grant: the refresh token expired or was revoked; only a new sign-in helps.
                logger.info("the authorization server refused the refresh: %s", error.error)
                return None
            renewed = stored.renewed(answer.access_token, answer.refresh_token, answer.expires_in, answer.scope)
            self.store.save(renewed)
            self.refreshes += 1
            logger.info("renewed the access token for %s", self.resource)
            return renewed

    async def _refresh(self, stored: LoginRecord) -> TokenResponse:
        assert stored.refresh_token is not None
        async with _http(self.timeout, self.transport) as http:
            return await refresh_tokens(
                http,
                stored.token_endpoint,
                client_id=stored.client_id,
                refresh_token=stored.refresh_token,
                resource=stored.resource,
            )


# -- login and logout ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoginOptions:
    url: str
    scopes: Sequence[str] = ()
    device: bool = False
    open_browser: bool = True
    client_id: str = DEFAULT_CLIENT_ID
    browser_wait: float = BROWSER_WAIT


def browser_available() -> bool:
    """Whether `webbrowser` can show a page to the user here: one is named (BROWSER), or a
    desktop. On a terminal without one (ssh), Python's fallbacks are text browsers in this very
    terminal: the device flow, where offered, serves better."""
    if os.environ.get("BROWSER"):
        return True
    if sys.platform in ("darwin", "win32"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def open_in_browser(url: str) -> threading.Event:
    """Open `url` with `webbrowser` in a thread of its own (a BROWSER command may run until the
    browser exits; the login must go on meanwhile). The event is set once it tried."""
    tried = threading.Event()

    def run() -> None:
        try:
            webbrowser.open(url)
        except Exception as exc:  # a broken BROWSER setting must not end the login: the URL is printed
            logger.info("could not open a browser: %s", type(exc).__name__)
        finally:
            tried.set()

    threading.Thread(target=run, name="acp-client browser", daemon=True).start()
    return tried


async def login(
    options: LoginOptions,
    *,
    store: TokenStore | None = None,
    out: TextIO | None = None,
    opener: Callable[[str], object] = open_in_browser,
    transport: httpx.AsyncBaseTransport | None = None,
) -> LoginRecord:
    """Sign in to the server at `options.url` and store the tokens (LoginError when it fails)."""
    store = store if store is not None else TokenStore()
    say = out if out is not None else sys.stderr
    async with _http(transport=transport) as http:
        resource, server = await discover(http, options.url)
        scopes = default_scopes(resource, options.scopes)
        # No browser here (an ssh session): the device flow where offered, else the URL to open.
        browser = options.open_browser and browser_available()
        offered = server.device_authorization_endpoint is not None
        device = options.device or (options.open_browser and not browser and offered)
        print(f"Signing in to {resource.resource} at {server.issuer} (scopes: {' '.join(scopes)})", file=say)
        if device:
            answer = await _device_flow(http, resource, server, options, scopes, say)
        else:
            answer = await _code_flow(http, resource, server, options, scopes, say, opener if browser else None)
    now = time.time()
    record = LoginRecord(
        resource=resource.resource,
        issuer=server.issuer,
        client_id=options.client_id,
        token_endpoint=server.token_endpoint,
        access_token=answer.access_token,
        refresh_token=answer.refresh_token,
        expires_at=now + answer.expires_in if answer.expires_in is not None else None,
        scope=answer.scope if answer.scope is not None else " ".join(scopes),
        revocation_endpoint=server.revocation_endpoint,
        obtained_at=now,
    )
    store.save(record)
    return record


async def _code_flow(
    http: httpx.AsyncClient,
    resource: ProtectedResource,
    server: AuthorizationServer,
    options: LoginOptions,
    scopes: list[str],
    say: TextIO,
    opener: Callable[[str], object] | None,
) -> TokenResponse:
    """The authorization code flow; `opener` opens the browser (None: the URL is printed)."""
    verifier, challenge = pkce_pair()
    state = secrets.token_urlsafe(24)
    page = f"Signed in to {resource.resource}: you can close this window and go back to the terminal."
    async with LoopbackReceiver(state, success_page=page).listening() as receiver:
        url = authorization_url(
            server,
            client_id=options.client_id,
            redirect_uri=receiver.redirect_uri,
            scopes=scopes,
            state=state,
            code_challenge=challenge,
            resource=resource.resource,
        )
        if opener is not None:
            print(f"Opening the browser. If it does not open, go to this URL on this machine:\n  {url}", file=say)
            opener(url)
        else:
            print(f"Open this URL in a browser on this machine to sign in:\n  {url}", file=say)
        print(f"Waiting for the browser (at most {options.browser_wait:g}s; Ctrl-C stops)…", file=say, flush=True)
        code = await receiver.wait(options.browser_wait)
    return await exchange_code(
        http,
        server,
        client_id=options.client_id,
        code=code,
        redirect_uri=receiver.redirect_uri,
        verifier=verifier,
        resource=resource.resource,
    )


async def _device_flow(
    http: httpx.AsyncClient,
    resource: ProtectedResource,
    server: AuthorizationServer,
    options: LoginOptions,
    scopes: list[str],
    say: TextIO,
) -> TokenResponse:
    device = await request_device_authorization(
        http, server, client_id=options.client_id, scopes=scopes, resource=resource.resource
    )
    print(f"To sign in, open {device.verification_uri} in any browser and enter the code {device.user_code}", file=say)
    if device.verification_uri_complete:
        print(f"  (or open {device.verification_uri_complete})", file=say)
    minutes = max(1, round(device.expires_in / 60))
    print(f"Waiting for the approval (the code expires in {minutes} min; Ctrl-C stops)…", file=say, flush=True)
    return await poll_device_token(http, server, device, client_id=options.client_id, resource=resource.resource)


async def logout(
    url: str, *, store: TokenStore | None = None, transport: httpx.AsyncBaseTransport | None = None
) -> tuple[LoginRecord | None, bool]:
    """Forget the stored sign-in for `url`: (the record there was, whether the server revoked
    its tokens). Revocation is asked where the server lists an endpoint for it; the record is
    removed either way."""
    store = store if store is not None else TokenStore()
    resource = resource_for(url)
    record = store.load(resource)
    revoked = False
    if record is not None and record.revocation_endpoint is not None:
        endpoint, client_id = record.revocation_endpoint, record.client_id
        async with _http(transport=transport) as http:
            # The refresh token first: revoking it revokes its access tokens too (RFC 7009 §2.1).
            if record.refresh_token is not None:
                refresh = record.refresh_token
                revoked = await revoke(http, endpoint, client_id=client_id, token=refresh, hint="refresh_token")
            access = await revoke(http, endpoint, client_id=client_id, token=record.access_token, hint="access_token")
            revoked = revoked or access
    with contextlib.suppress(OSError):
        store.remove(resource)
    return record, revoked
