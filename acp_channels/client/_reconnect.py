"""Reconnecting a dropped SSE stream or WebSocket without losing or repeating a message
(docs/resumable-streams.md), and what both transports share for it:

* `Backoff`, the default `ReconnectPolicy`: exponential delays, then a fatal error after a
  bounded time since the drop;
* `ReconnectEvent`, what `HttpClient(on_reconnect=...)` is told (reconnecting, resumed,
  restarted, gave up), so a terminal or a log can say so;
* `ReconnectingTransport`, the layer both transports build on: asking the policy, telling the
  caller, and restarting a connection the server forgot (with the `SessionLedger`).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias

from acp_channels import _protocol as protocol

from ._base import FrameValue, TransportBase
from ._errors import TransportError, TransportTimeoutError
from ._session_ledger import SessionLedger, intercepted, restart_error
from ._shared_sessions import ATTACH_SESSION_HEADER, Attachment
from ._token_source import BearerCredentials, auth_expiring_notice

__all__ = [
    "DEFAULT_BACKOFF",
    "Backoff",
    "ReconnectCallback",
    "ReconnectEvent",
    "ReconnectPolicy",
    "ReconnectingTransport",
    "StreamDrop",
    "gone_detail",
]

logger = logging.getLogger("acp_channels.client")


@dataclass(frozen=True, slots=True)
class StreamDrop:
    """A stream (SSE) or socket (WebSocket) that was established has ended or broken."""

    session_id: str | None
    """The session of an SSE stream or of a POST sent again; None for the connection stream and
    for a WebSocket."""
    attempt: int
    """1 for the first retry since the stream was last (re)established."""
    error: TransportError
    """Why it ended, or why the last retry failed."""
    last_event_id: str | None
    """What the retry sends as `Last-Event-ID` (SSE: the last event id; WebSocket: the count of
    messages received)."""
    elapsed: float = 0.0
    """Seconds since the stream dropped (since the first failure after it was established)."""
    what: str = ""
    """The stream in words: "connection stream", "session stream 's1'", "WebSocket"."""


#: Decides whether to retry: seconds to wait before the retry, or None to give up (fatal).
ReconnectPolicy: TypeAlias = Callable[[StreamDrop], float | None]


@dataclass(frozen=True, slots=True)
class Backoff:
    """Retry at once, then after `initial` seconds, doubling up to `maximum`, until
    `give_up_after` seconds have passed since the drop (then the drop is fatal).

    An attempt under way is not cut short by the deadline: each is bounded by the client's
    `timeout`, so the client gives up at most `give_up_after + timeout` after the drop.
    `jitter` spreads retries of many clients (a delay is shortened by up to that fraction)."""

    initial: float = 0.1
    maximum: float = 5.0
    give_up_after: float = 30.0
    multiplier: float = 2.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        if self.initial < 0 or self.maximum < 0 or self.give_up_after < 0:
            raise ValueError("Backoff: delays and give_up_after must not be negative")
        if self.multiplier < 1 or not 0 <= self.jitter <= 1:
            raise ValueError("Backoff: multiplier >= 1 and 0 <= jitter <= 1")

    def delay(self, attempt: int) -> float:
        """The delay before retry number `attempt` (1: at once), without jitter."""
        if attempt <= 1:
            return 0.0
        return float(min(self.maximum, self.initial * self.multiplier ** (attempt - 2)))

    def __call__(self, drop: StreamDrop) -> float | None:
        remaining = self.give_up_after - drop.elapsed
        if remaining <= 0:
            return None
        delay = self.delay(drop.attempt)
        if self.jitter and delay:
            delay *= 1 - random.random() * self.jitter
        return min(delay, remaining)


#: The policy `HttpClient` uses unless told otherwise.
DEFAULT_BACKOFF: Final = Backoff()

ReconnectKind: TypeAlias = Literal["reconnecting", "resumed", "restarted", "gave-up"]


@dataclass(frozen=True, slots=True)
class ReconnectEvent:
    """Something `HttpClient` did about a dropped stream or socket.

    * "reconnecting": `what` dropped (`error`); retry number `attempt` follows after `delay` s.
    * "resumed": `what` is back; nothing was lost or repeated.
    * "restarted": the server had forgotten the connection; a new one (`connection_id`, the
      old one in `previous_connection_id`) was initialized with the same params and the
      sessions in `sessions_loaded` were `session/load`ed (`sessions_lost`: the ones that
      could not be, with why). Messages the agent sent after the drop were lost, and every
      request still unanswered was answered with an error (`requests_failed` of them).
    * "gave-up": the drop is fatal (`error` is what the transport now fails with).
    """

    kind: ReconnectKind
    what: str
    error: TransportError | None = None
    attempt: int = 0
    delay: float = 0.0
    connection_id: str | None = None
    previous_connection_id: str | None = None
    sessions_loaded: tuple[str, ...] = ()
    sessions_lost: tuple[tuple[str, str], ...] = ()
    requests_failed: int = 0

    def __str__(self) -> str:
        if self.kind == "reconnecting":
            when = f" in {self.delay:.2g}s" if self.delay else ""
            return f"reconnecting… ({self.what}, attempt {self.attempt}{when}): {self.error}"
        if self.kind == "resumed":
            return f"resumed the {self.what}: nothing lost"
        if self.kind == "restarted":
            loaded = ", ".join(self.sessions_loaded) or "none"
            lost = "; ".join(f"{session}: {why}" for session, why in self.sessions_lost)
            return (
                f"restarted: connection {self.previous_connection_id} was gone, now {self.connection_id}; "
                f"sessions loaded: {loaded}"
                + (f"; not loaded: {lost}" if lost else "")
                + f"; {self.requests_failed} unanswered requests failed; messages after the drop were lost"
            )
        return f"gave up on the {self.what}: {self.error}"


ReconnectCallback: TypeAlias = Callable[[ReconnectEvent], None]


def gone_detail(connection_id: str | None, refusal: str) -> str:
    """Why a 404 to a resume is fatal, for `ResumeRefusedError`."""
    return f"connection {connection_id} is gone on the server (ended, or forgotten); not restarting: {refusal}"


class ReconnectingTransport(TransportBase):
    """What both transports do when their connection breaks: ask the `ReconnectPolicy` when to
    retry, tell the `on_reconnect` callback, and restart a connection the server forgot. A
    transport says how it connects again (`_connect_again`) and sends a restart's own request
    (`_send_private`); the rest of a restart is the same over both."""

    def __init__(
        self,
        endpoint: str,
        headers: Mapping[str, str] | None,
        timeout: float | None,
        max_message_size: int,
        *,
        secrets: Iterable[str],
        reconnect: ReconnectPolicy | None,
        restart: bool,
        on_reconnect: ReconnectCallback | None,
        attach: Mapping[str, str] | None = None,
        credentials: BearerCredentials | None = None,
    ) -> None:
        super().__init__(endpoint, headers, timeout, max_message_size, secrets=secrets, credentials=credentials)
        #: The headers of the initialize POST or first upgrade that attach to a session (or none).
        self._attach_headers = dict(attach or {})
        #: `detach()`: the connection goes without being ended (no DELETE; a socket's 1001).
        self._leave_on_server = False
        self._reconnect = reconnect
        self._restart = restart
        self._on_reconnect = on_reconnect
        #: Streams (or the socket) being reconnected right now, by name.
        self._reconnecting: set[str] = set()
        self._ledger = SessionLedger(attach_session_id=self._attach_headers.get(ATTACH_SESSION_HEADER))
        #: Sessions a restart is loading: their replayed history is not delivered again.
        self._loading: set[str] = set()
        #: Waiters for the replies to a restart's own requests, by id.
        self._private_replies: dict[str, asyncio.Future[dict[str, Any]]] = {}

    @property
    def reconnecting(self) -> bool:
        """A stream or the socket dropped and is being reconnected (or the connection restarted)."""
        return bool(self._reconnecting)

    @property
    def attachment(self) -> Attachment | None:
        """What the client attached to, once the initialize result said (None: not an attachment)."""
        return self._ledger.attachment

    @property
    def load_session(self) -> bool:
        """The agent advertised `agentCapabilities.loadSession` in its initialize result."""
        return self._ledger.load_session

    async def detach(self) -> None:
        """Leave without ending any session: an attachment is closed as always (for it, that is
        detaching); the connection's own client goes without ending the connection, which the
        server then keeps (its DETACHED_SECONDS)."""
        if not self._attach_headers:
            self._leave_on_server = True
        await self.close()

    def _tell(self, event: ReconnectEvent) -> None:
        """Log `event` and hand it to the `on_reconnect` callback (whose failures are only logged)."""
        if event.kind == "reconnecting":
            self._reconnecting.add(event.what)
        elif event.kind in ("resumed", "gave-up"):
            self._reconnecting.discard(event.what)
        else:
            self._reconnecting.clear()
        level = logging.WARNING if event.kind in ("restarted", "gave-up") else logging.INFO
        logger.log(level, "%s", self.redact(str(event)))
        if self._on_reconnect is not None:
            try:
                self._on_reconnect(event)
            except Exception:
                logger.exception("the on_reconnect callback failed")

    def _policy_delay(self, drop: StreamDrop) -> float | None:
        """Seconds before retry `drop.attempt` (told as "reconnecting"), or None: the policy gives up."""
        assert self._reconnect is not None
        delay = self._reconnect(drop)
        if delay is not None:
            self._tell(ReconnectEvent("reconnecting", drop.what, drop.error, drop.attempt, delay))
        return delay

    def _give_up(self, what: str, error: TransportError, attempt: int = 0) -> None:
        """Fail with `error`, telling the caller that reconnecting `what` stopped."""
        if not self.closed:
            self._tell(ReconnectEvent("gave-up", what, error, attempt))
        self._fail(error)

    def _intercepted(self, value: FrameValue) -> bool:
        """Whether a received frame is the transport's, not the caller's: a restart's own (see
        `intercepted`), or the server's notice that the token expires soon (a refresh starts)."""
        if auth_expiring_notice(value):
            assert isinstance(value, dict)
            if self._credentials is not None:
                self._credentials.refresh_ahead(value.get("params"))
            return True
        return intercepted(value, self._private_replies, self._loading)

    async def _restart_in_place(self, what: str, previous: str | None) -> ReconnectEvent:
        """A new connection in place of `previous`, which the server forgot; the caller holds
        the transport's send locks. Every request still unanswered is answered with an error,
        the transport connects and initializes again with the same params, and every open
        session is `session/load`ed. Returns the event to tell once the locks are released."""
        failed = self._ledger.take_outstanding()
        for request_id in failed:
            self._inbox.put(restart_error(request_id))
        await self._connect_again()
        loaded: list[str] = []
        lost: list[tuple[str, str]] = []
        for session_id in list(self._ledger.sessions):
            message = self._ledger.load_request(session_id)
            self._loading.add(session_id)
            try:
                reply = await self._private_call(message)
            finally:
                self._loading.discard(session_id)
            if "error" in reply:
                error = reply["error"]
                lost.append((session_id, str(error.get("message", error) if isinstance(error, dict) else error)))
                del self._ledger.sessions[session_id]
            else:
                loaded.append(session_id)
        return ReconnectEvent(
            "restarted",
            what,
            connection_id=self.connection_id,
            previous_connection_id=previous,
            sessions_loaded=tuple(loaded),
            sessions_lost=tuple(lost),
            requests_failed=len(failed),
        )

    async def _private_call(self, message: protocol.Message) -> dict[str, Any]:
        """Send a request of the restart's own and wait for its reply (kept from the caller)."""
        waiter: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._private_replies[message["id"]] = waiter
        try:
            answered = await self._send_private(message)
            if answered is not None:
                return answered
            try:
                async with asyncio.timeout(self._timeout):
                    return await self._unless_failed(asyncio.shield(waiter), self._closing)
            except TimeoutError as exc:
                raise TransportTimeoutError(
                    f"restart: no answer to {message['method']} within {self._timeout:g}s"
                ) from exc
        finally:
            self._private_replies.pop(message["id"], None)

    async def _connect_again(self) -> None:
        """A restart's new connection, initialized with the ledger's `initialize` params."""
        raise NotImplementedError

    async def _send_private(self, message: protocol.Message) -> dict[str, Any] | None:
        """Send a restart's own request; its reply when the answer to the sending carried it,
        else None (it arrives as a received frame, see `_intercepted`)."""
        raise NotImplementedError
