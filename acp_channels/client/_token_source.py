"""Bearer tokens that change while a connection lives: the `TokenSource` protocol a caller hands
to `HttpClient(token=...)`, and `BearerCredentials`, what the transports ask for the token to put
on each request they build and tell when the server refused one.

A refusal the source can answer is a 401 whose `WWW-Authenticate` challenge says
`error="invalid_token"` (RFC 6750: expired, revoked, malformed): the credentials call
`refresh(rejected)` once for every request that was refused with the same token (a lock; a
request whose token was replaced meanwhile only retries with the new one), and the request is
sent again once. The server's notice `_acp-channels/auth_expiring` starts a refresh ahead of
time, in the background. A plain string is a source that never refreshes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Awaitable, Mapping
from typing import Any, Final, Protocol, TypeVar, runtime_checkable

from ._errors import ClientUsageError, TransportError, TransportTimeoutError

__all__ = [
    "AUTH_EXPIRING_METHOD",
    "BearerCredentials",
    "TokenSource",
    "auth_expiring_notice",
    "check_token",
    "invalid_token_challenge",
]

logger = logging.getLogger("acp_channels.client")

#: The server's notice, on the connection-level stream, that the connection's credential expires
#: soon (`params.expiresAt`, RFC 3339). Transport-level: the application never sees it.
AUTH_EXPIRING_METHOD: Final = "_acp-channels/auth_expiring"
#: RFC 6750's error code for a token that is expired, revoked or otherwise not valid.
_INVALID_TOKEN: Final = re.compile(r'\berror\s*=\s*"?invalid_token\b"?', re.IGNORECASE)
#: RFC 6455 subprotocol names are RFC 2616 tokens: visible ASCII except these separators.
_SEPARATORS: Final = frozenset('()<>@,;:\\"/[]?={}')
T = TypeVar("T")


@runtime_checkable
class TokenSource(Protocol):
    """Where `HttpClient` gets its bearer token when it can change (an OAuth access token that
    expires). Both methods are awaited on the client's event loop, each within its `timeout`.

    Contract: once `refresh` has returned a token, `token()` returns that one (or a newer one);
    a token it returned is never shown by the client (logs, errors, reprs)."""

    async def token(self) -> str:
        """The access token to send now (a source that knows its token is about to expire may
        refresh first). Read for every request when it is built."""
        ...

    async def refresh(self, rejected: str) -> str | None:
        """The server refused `rejected` (a 401 with `error="invalid_token"`), or said it expires
        soon: a new token, or None when none can be had (then the 401 stands). Called once for
        all the requests refused with the same token."""
        ...


def check_token(token: str, *, subprotocol: bool = False) -> None:
    """Refuse a token that cannot travel intact: empty, or with a space, a control character or
    a non-ASCII one (it goes in a header); as a WebSocket subprotocol also any RFC 6455
    separator. The message gives the position, never the token."""
    if not isinstance(token, str) or not token:
        raise ClientUsageError("the token is empty")
    for position, char in enumerate(token, 1):
        if not "\x21" <= char <= "\x7e":
            raise ClientUsageError(
                f"the token has a space, a control or a non-ASCII character (character {position}); "
                "a token is printable ASCII without spaces"
            )
        if subprotocol and char in _SEPARATORS:
            raise ClientUsageError(
                f"the token cannot travel as a WebSocket subprotocol: character {position} is one of "
                "()<>@,;:\\\"/[]?={} (RFC 6455 allows letters, digits and !#$%&'*+-.^_`|~; base64url fits)"
            )


def invalid_token_challenge(challenge: str | None) -> bool:
    """A `WWW-Authenticate` value that says the token is not valid (`error="invalid_token"`)."""
    return challenge is not None and _INVALID_TOKEN.search(challenge) is not None


def auth_expiring_notice(value: Any) -> bool:
    """The server's `_acp-channels/auth_expiring` notification (not for the application)."""
    return isinstance(value, dict) and value.get("method") == AUTH_EXPIRING_METHOD and "id" not in value


class BearerCredentials:
    """The bearer token the transports put on their requests: a fixed string, or a
    `TokenSource`'s current one, refreshed when the server refuses it or says it expires."""

    def __init__(self, token: str | TokenSource, *, timeout: float | None) -> None:
        if isinstance(token, str):
            check_token(token)
            self._fixed: str | None = token
            self._source: TokenSource | None = None
        elif isinstance(token, TokenSource):
            self._fixed = None
            self._source = token
        else:
            raise ClientUsageError("token is a string or a TokenSource (async token() and refresh(rejected))")
        self._timeout = timeout
        self._lock = asyncio.Lock()
        #: The last token handed out or obtained by a refresh.
        self._latest: str | None = token if isinstance(token, str) else None
        #: Refused (or expiring) tokens and what replaced them: a source that still hands one out
        #: is corrected (its contract says it should not).
        self._replaced: dict[str, str] = {}
        #: Every token handed out: what an error message must not show.
        self._seen: set[str] = {token} if isinstance(token, str) else set()
        self._ahead: asyncio.Task[None] | None = None
        self._ahead_of: set[str] = set()
        #: Refreshes made (tests and logs).
        self.refreshes = 0

    @property
    def refreshable(self) -> bool:
        """A source that can replace a refused token (a fixed string cannot)."""
        return self._source is not None

    @property
    def secrets(self) -> tuple[str, ...]:
        """Every token handed out so far (each with its `Bearer ` form), longest first."""
        found = self._seen | {f"Bearer {token}" for token in self._seen}
        return tuple(sorted(found, key=len, reverse=True))

    async def token(self) -> str:
        """The token to put on a request being built now (waits for a refresh under way)."""
        if self._fixed is not None:
            return self._fixed
        assert self._source is not None
        async with self._lock:  # a refresh under way decides what goes out next
            pass
        token = await self._bounded(self._source.token(), "token()")
        self._check(token, "token()")
        token = self._replaced.get(token, token)
        self._latest = token
        return token

    async def authorized(self, headers: Mapping[str, str]) -> tuple[dict[str, str], str]:
        """`headers` with `Authorization: Bearer <token>`, and the token."""
        token = await self.token()
        return {**headers, "Authorization": f"Bearer {token}"}, token

    async def replaced(self, rejected: str) -> bool:
        """The server refused `rejected`: whether a request sent with it may go again with the
        current token. The first caller for a token asks the source (`refresh`); the others wait
        for it and find the token replaced. False: no new token (a fixed one, or the source has
        none), and the refusal stands."""
        if self._source is None:
            return False
        async with self._lock:
            if rejected in self._replaced or (self._latest is not None and self._latest != rejected):
                return True  # refreshed meanwhile: only retry
            return await self._refresh(rejected, "refused")

    def refresh_ahead(self, params: Any) -> None:
        """The server said the connection's credential expires soon (`_acp-channels/auth_expiring`):
        refresh in the background, once per notice, without holding up delivery."""
        if self._source is None or (self._ahead is not None and not self._ahead.done()):
            return
        expires_at = params.get("expiresAt") if isinstance(params, dict) else None
        key = str(expires_at)
        if key in self._ahead_of:
            return  # the same expiry, told again
        self._ahead_of.add(key)
        logger.info("the server says the token expires at %s: refreshing it now", expires_at)
        self._ahead = asyncio.create_task(self._refresh_ahead(), name="acp-client token refresh")

    async def _refresh_ahead(self) -> None:
        async with self._lock:
            current = self._latest
            if current is None:
                return
            await self._refresh(current, "expiring")  # when it has none, a refusal asks again

    async def aclose(self) -> None:
        """Stop a refresh under way in the background."""
        if self._ahead is not None and not self._ahead.done():
            self._ahead.cancel()
            with contextlib.suppress(BaseException):
                await self._ahead

    async def _refresh(self, rejected: str, why: str) -> bool:
        """Ask the source for a token to replace `rejected` (the lock held). False: none."""
        assert self._source is not None
        try:
            new = await self._bounded(self._source.refresh(rejected), "refresh()")
            if new is None:
                logger.info("the token source has no new token (the %s token stays refused)", why)
                return False
            self._check(new, "refresh()")
        except TransportError as exc:  # the refusal stands
            logger.warning("%s", exc)
            return False
        if new == rejected:
            logger.info("the token source gave the %s token again: nothing to retry with", why)
            return False
        self._replaced[rejected] = new
        self._latest = new
        self.refreshes += 1
        logger.info("the token source refreshed the %s token", why)
        return True

    def _check(self, token: Any, what: str) -> None:
        if not isinstance(token, str):
            raise TransportError(f"the token source's {what} returned {type(token).__name__}, not a str")
        try:
            check_token(token)
        except ClientUsageError as exc:
            raise TransportError(f"the token source's {what} returned an unusable token: {exc}") from None
        self._seen.add(token)

    async def _bounded(self, call: Awaitable[T], what: str) -> T:
        """Await a source's `call` within the client's timeout; its failure as a `TransportError`
        naming only the exception's type (its text might hold a token)."""
        try:
            async with asyncio.timeout(self._timeout):
                return await call
        except TimeoutError as exc:
            raise TransportTimeoutError(f"the token source's {what}: no answer within {self._timeout:g}s") from exc
        except (TransportError, asyncio.CancelledError):
            raise
        except Exception as exc:
            raise TransportError(f"the token source's {what} failed: {type(exc).__name__}") from exc
