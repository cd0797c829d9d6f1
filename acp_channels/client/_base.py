"""What the HTTP and WebSocket transports share: the inbox of received frames, the end state
(failing, closing), and turning a received text into a frame (malformed text becomes a
JSON-RPC error object). Reconnecting is shared one layer up (reconnect.py)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeAlias, TypeVar

from acp_channels import _protocol as protocol
from acp_channels._protocol import Batch, Malformed, MalformedEntry, Single

from ._errors import ClientUsageError, HttpStatusError, TransportClosedError, TransportError, status_error
from ._token_source import BearerCredentials, invalid_token_challenge

__all__ = [
    "FrameValue",
    "Inbox",
    "RawFrame",
    "TransportBase",
    "cancel_and_wait",
    "frame_value_for_send",
    "received",
    "received_value",
    "response_only",
]

#: A JSON-RPC frame as Python values: one message (a dict) or a batch (a list).
FrameValue: TypeAlias = dict[str, Any] | list[Any]

_END: Final = object()

#: Request headers whose values are credentials: never shown in an error message.
CREDENTIAL_HEADERS: Final = frozenset({"authorization", "proxy-authorization", "cookie"})


def credential_secrets(headers: Mapping[str, str], extra: Iterable[str] = ()) -> tuple[str, ...]:
    """The strings an error message must not show: credential header values (whole, and
    without their scheme: `Bearer abc` and `abc`) and `extra` secrets, longest first."""
    found: set[str] = {secret for secret in extra if secret}
    for name, value in headers.items():
        if name.lower() in CREDENTIAL_HEADERS and value.strip():
            found.add(value.strip())
            _, _, credentials = value.strip().partition(" ")
            if credentials.strip():
                found.add(credentials.strip())
    return tuple(sorted(found, key=len, reverse=True))


def received(text: str) -> tuple[FrameValue, str | None]:
    """The frame a received text stands for, and the text when it is that frame's exact form.
    Malformed text is passed up as the error the reference would answer it with: -32700 (with
    `data.line`) for bad JSON, -32600 otherwise (then there is no text to keep)."""
    frame = protocol.parse_frame(text)
    if isinstance(frame, Malformed):
        return frame.error, None
    value: FrameValue = protocol.frame_value(frame)
    return value, text


def received_value(text: str) -> FrameValue:
    return received(text)[0]


@dataclass(frozen=True, slots=True)
class RawFrame:
    """A received frame with its text as it arrived (a relay forwards `text` unchanged)."""

    value: FrameValue
    text: str


def response_only(value: FrameValue) -> bool:
    """A single response-shaped object, or a batch of nothing else (docs/wire-contract.md §4.1): what
    goes on the response lane, which may pass calls still being sent."""
    if isinstance(value, dict):
        return protocol.is_response_shaped(value)
    return all(protocol.is_response_shaped(entry) for entry in value)


def frame_value_for_send(frame: Any) -> FrameValue:
    """Check that `frame` is something the transports can send: a dict or a non-empty list."""
    if isinstance(frame, dict):
        return frame
    if isinstance(frame, list) and frame:
        return frame
    raise ClientUsageError("a frame is a JSON-RPC message (dict) or a non-empty batch (list)")


def split_batch(value: list[Any]) -> list[dict[str, Any]]:
    """Batch entries as messages for a message-level reader (the `acp` SDK takes no arrays).
    An entry that is not even an object becomes an -32600 error object."""
    frame = protocol.frame_from_value(value)
    assert isinstance(frame, Batch)
    return [
        entry
        if isinstance(entry, dict)
        else entry.value
        if isinstance(entry, MalformedEntry) and isinstance(entry.value, dict)
        else protocol.error_response(None, protocol.INVALID_REQUEST, "Invalid Request", {"entry": entry.value})
        for entry in frame.entries
    ]


class Inbox:
    """Received frames in arrival order, then the end: None after a local close, or the error
    that ended the transport (raised once to a reader, then as TransportClosedError)."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._split: collections.deque[dict[str, Any]] = collections.deque()
        self._ended = False
        self._error: TransportError | None = None
        self._error_raised = False

    def put(self, value: FrameValue, text: str | None = None) -> None:
        """Queue a received frame; `text` is its exact received form, when it has one."""
        if not self._ended:
            self._queue.put_nowait((value, text))

    def end(self, error: TransportError | None = None) -> None:
        if not self._ended:
            self._ended = True
            self._error = error
            self._queue.put_nowait(_END)

    async def get_frame(self) -> FrameValue | None:
        item = await self._next()
        return None if item is None else item[0]

    async def get_raw(self) -> RawFrame | None:
        item = await self._next()
        if item is None:
            return None
        value, text = item
        return RawFrame(value, text if text is not None else protocol.dumps(value))

    async def _next(self) -> tuple[FrameValue, str | None] | None:
        item = await self._queue.get()
        if item is _END:
            self._queue.put_nowait(_END)  # every later reader sees the end too
            if self._error is None:
                return None
            if not self._error_raised:
                self._error_raised = True
                raise self._error
            raise TransportClosedError(f"transport failed: {self._error}") from self._error
        pair: tuple[FrameValue, str | None] = item
        return pair

    async def get_message(self) -> dict[str, Any] | None:
        while not self._split:
            frame = await self.get_frame()
            if frame is None or isinstance(frame, dict):
                return frame
            self._split.extend(split_batch(frame))
        return self._split.popleft()


def single_of(value: FrameValue) -> Single | None:
    frame = protocol.frame_from_value(value)
    return frame if isinstance(frame, Single) else None


T = TypeVar("T")


async def cancel_and_wait(tasks: Iterable[asyncio.Task[Any] | None]) -> None:
    """Cancel every task, then wait until each has ended (whatever it raised)."""
    running = [task for task in tasks if task is not None]
    for task in running:
        task.cancel()
    for task in running:
        with contextlib.suppress(BaseException):
            await task


class TransportBase:
    """The end state both transports share: the inbox, the first fatal error, closing. A
    transport says how it fails (`_fail`) and what closing stops (`_shut_down`)."""

    #: What a closed transport says when no failure ended it.
    closed_text = "transport is closed"

    def __init__(
        self,
        endpoint: str,
        headers: Mapping[str, str] | None,
        timeout: float | None,
        max_message_size: int,
        *,
        secrets: Iterable[str] = (),
        credentials: BearerCredentials | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.connection_id: str | None = None
        self._headers = dict(headers or {})
        secrets = tuple(secrets)
        self._secrets = credential_secrets(self._headers, secrets)
        #: The bearer token, put on each request as it is built (None: `headers` say it all).
        self._credentials = credentials
        # A token or an Authorization header (a cookie may be only a load balancer's).
        self._credentials_sent = (
            any(name.lower() == "authorization" for name in self._headers) or any(secrets) or credentials is not None
        )
        self._timeout = timeout
        self._max_message_size = max_message_size
        self._inbox = Inbox()
        self.error: TransportError | None = None
        self._failed = asyncio.Event()
        self._close_started = False
        #: Set when close() starts: cuts short what waits for the server.
        self._closing = asyncio.Event()
        self._close_done = asyncio.Event()

    @property
    def closed(self) -> bool:
        return self._close_started or self.error is not None

    async def wait_failed(self) -> TransportError:
        """Wait until the transport fails; returns the error."""
        await self._failed.wait()
        assert self.error is not None
        return self.error

    async def receive_frame(self) -> FrameValue | None:
        return await self._inbox.get_frame()

    async def receive(self) -> dict[str, Any] | None:
        return await self._inbox.get_message()

    async def receive_raw(self) -> RawFrame | None:
        return await self._inbox.get_raw()

    async def _unless_failed(self, awaitable: Awaitable[T], *stops: asyncio.Event) -> T:
        """Await `awaitable` unless the transport fails (or one of `stops` is set) first; then
        cancel it and raise what cut it short."""
        task = asyncio.ensure_future(awaitable)
        waiters = [asyncio.ensure_future(event.wait()) for event in (self._failed, *stops)]
        try:
            await asyncio.wait({task, *waiters}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        if task.done() and not task.cancelled():
            return task.result()
        if self.error is not None:
            raise self.error  # what cut this operation short
        raise self._closed_error()

    def redact(self, text: str) -> str:
        """`text` with every credential this transport sends replaced by `***` (every token a
        token source handed out too)."""
        secrets = self._secrets if self._credentials is None else (*self._credentials.secrets, *self._secrets)
        for secret in secrets:
            text = text.replace(secret, "***")
        return text

    async def _authorized(
        self, headers: Mapping[str, str], *, ending: bool = False
    ) -> tuple[dict[str, str], str | None]:
        """`headers` with the current bearer token, and that token (None: no credentials of ours).
        A token source that fails is a `TransportError`. `ending`: for the DELETE that ends the
        connection, which goes after a failure or a close (the source's calls are bounded anyway)."""
        if self._credentials is None:
            return dict(headers), None
        asked = self._credentials.authorized(headers)
        return await (asked if ending else self._unless_failed(asked, self._closing))

    async def _token_replaced(
        self, status: int, challenge: str | None, rejected: str | None, *, ending: bool = False
    ) -> bool:
        """A request sent with `rejected` was answered `status`: whether to send it again once
        with a new token (a 401 whose challenge says `error="invalid_token"`, and the token
        source has a new token, or already replaced that one)."""
        if status != 401 or rejected is None or self._credentials is None or not invalid_token_challenge(challenge):
            return False
        asked = self._credentials.replaced(rejected)
        return await (asked if ending else self._unless_failed(asked, self._closing))

    def _status_error(self, what: str, status_code: int, body: str, www_authenticate: str | None) -> HttpStatusError:
        """The error for an unexpected status (401/403: `AuthenticationError`), credentials redacted."""
        return status_error(
            what,
            status_code,
            self.redact(body),
            www_authenticate=self.redact(www_authenticate) if www_authenticate is not None else None,
            credentials_sent=self._credentials_sent,
        )

    def _closed_error(self) -> TransportClosedError:
        if self.error is not None:
            error = TransportClosedError(f"transport failed: {self.error}")
            error.__cause__ = self.error
            return error
        return TransportClosedError(self.closed_text)

    def _raise_if_unusable(self) -> None:
        self._raise_if_failed()
        if self._close_started:
            raise TransportClosedError("transport is closed")

    def _raise_if_failed(self) -> None:
        if self.error is not None:
            raise self._closed_error()

    def _record_failure(self, error: TransportError, logger: logging.Logger) -> bool:
        """Make `error` the end of the transport; False when it already ended (first one wins).
        The caller stops its own work, then ends the inbox."""
        if self.error is not None or self._close_started:
            return False
        self.error = error
        logger.debug("ACP %s transport failed: %s", type(self).__name__, error)
        self._failed.set()
        return True

    def _fail(self, error: TransportError) -> TransportError:
        """Make `error` the end of the transport (the first one wins, see `_record_failure`) and
        stop its work; returns `error`, for raising."""
        raise NotImplementedError

    async def close(self) -> None:
        """Close the transport (see `_shut_down`); a second call waits for the first to finish."""
        if self._close_started:
            await self._close_done.wait()
            return
        self._close_started = True
        self._closing.set()
        try:
            await self._shut_down()
        finally:
            if self._credentials is not None:
                await self._credentials.aclose()
            self._close_done.set()

    async def _shut_down(self) -> None:
        """What closing does: stop the transport's work, tell the server, end the inbox."""
        raise NotImplementedError
