"""The relay: frames from the editor's stdin go to the remote `/acp`, frames from the remote go
to stdout, each as the exact text it arrived as (one line per frame; a batch stays one line).

Routing (connection and session streams, `Acp-Session-Id` on POSTs, the order of calls and of
responses) is `HttpClient`'s job; the relay adds what a stdio agent owes its editor:

* every request it forwarded is answered: by the remote, or, when the remote goes away or the
  bridge is stopped, by a JSON-RPC error the bridge writes itself (`REMOTE_LOST`);
* a line that is not JSON-RPC is answered at once, as a stdio agent would (-32700 / -32600);
* responses the editor sends pass requests the editor sent before them that are still being
  delivered (HTTP: the transport's two lanes), so an agent waiting on a permission never waits
  behind the prompt that asked for it;
* a `session/prompt` without an operation id gets one (`params._meta["acp-channels/operationId"]`,
  a UUID), as `HttpClient` gives the prompts it serializes itself: the server runs it once however
  often it arrives, so a POST whose answer was lost is sent again (HTTP) and a reattach resends
  it (WebSocket) safely. Only such frames are serialized again; every other one goes unchanged.

A dropped stream or socket is resumed by `HttpClient` without the editor noticing (nothing is
lost or written twice); `log_reconnect` says so on stderr ("reconnecting…", "resumed …").
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import logging
import signal
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from acp_channels import _protocol as protocol
from acp_channels._protocol import Malformed
from acp_channels.client import ClientUsageError, HttpClient, ReconnectEvent, TransportError
from acp_channels.client._base import FrameValue, response_only
from acp_channels.client._shared_sessions import with_operation_ids

from ._attach import HELD_BYTES_LIMIT, Attachment, LocalAnswer
from ._stdio import LineSink, LineSource, LineTooLong

__all__ = ["BRIDGE_ERROR", "Bridge", "BridgeEnd", "log_reconnect"]

logger = logging.getLogger("acp_channels.bridge")

#: The JSON-RPC error code of answers the bridge writes itself (internal error); `data.acpBridge`
#: says why: "remote-lost", "interrupted", "stdin-closed", "refused", and with `--attach`
#: "attach-refused" and "attached" (_attach.py).
BRIDGE_ERROR: Final = protocol.INTERNAL_ERROR
#: Bytes read from stdin and not yet handed to the transport, before reading pauses.
_QUEUED_BYTES_LIMIT: Final = 64 * 1024 * 1024


class BridgeEnd(enum.Enum):
    """How a run ended, and the exit status it stands for."""

    STDIN_CLOSED = 0
    """The editor closed stdin (or stopped reading stdout): the connection was closed."""
    REMOTE_LOST = 1
    """The remote went away, refused us, or the network failed."""
    INTERRUPTED = 128
    """SIGINT or SIGTERM: the connection was closed first (exit status 128 + signal number)."""


@dataclass(slots=True)
class _Outgoing:
    value: FrameValue
    text: str
    request_ids: list[Any]
    #: With `--attach`: answered by the bridge (or a handover done) before `value` is sent, if at all.
    local: LocalAnswer | None = None


class _PendingRequests:
    """Ids of requests the editor sent that the remote has not answered (ids of any JSON type)."""

    def __init__(self) -> None:
        self._ids: dict[str, collections.deque[Any]] = {}
        self.empty = asyncio.Event()
        self.empty.set()

    def __len__(self) -> int:
        return sum(len(ids) for ids in self._ids.values())

    def add(self, request_id: Any) -> None:
        self._ids.setdefault(protocol.id_key(request_id), collections.deque()).append(request_id)
        self.empty.clear()

    def answered(self, request_id: Any) -> bool:
        """Mark one request of that id answered; False when none was pending (answered already)."""
        key = protocol.id_key(request_id)
        ids = self._ids.get(key)
        if not ids:
            return False
        ids.popleft()
        if not ids:
            del self._ids[key]
            if not self._ids:
                self.empty.set()
        return True

    def take_all(self) -> list[Any]:
        taken = [request_id for ids in self._ids.values() for request_id in ids]
        self._ids.clear()
        self.empty.set()
        return taken


def _requests(frame: protocol.Frame) -> list[Any]:
    return [message["id"] for message in protocol.frame_messages(frame) if "method" in message and "id" in message]


def _responses(value: FrameValue) -> Iterable[Any]:
    messages = value if isinstance(value, list) else (value,)
    for message in messages:
        if isinstance(message, dict) and "method" not in message and "id" in message:
            yield message["id"]


def _with_operation_ids(value: FrameValue, text: str) -> tuple[FrameValue, str]:
    """The frame to send, and its text: a frame with a `session/prompt` request that names no
    operation is given an operation id (a new UUID) for each such prompt and serialized again;
    any other frame is `value` and `text` unchanged (its bytes go as the editor wrote them)."""
    stamped = with_operation_ids(value)
    if isinstance(value, list):
        assert isinstance(stamped, list)
        changed = any(new is not old for new, old in zip(stamped, value, strict=True))
    else:
        changed = stamped is not value
    if not changed:
        return value, text
    logger.debug("an operation id given to a session/prompt")
    return stamped, protocol.dumps(stamped)


def _one_line(text: str) -> str:
    # Newlines can only be whitespace between JSON tokens (strings escape theirs): a space keeps
    # the same JSON on one line, which newline-delimited stdio needs.
    return text.replace("\r", " ").replace("\n", " ") if "\n" in text or "\r" in text else text


class Bridge:
    """One editor (stdin/stdout) relayed to one remote connection (`client`)."""

    def __init__(
        self,
        client: HttpClient,
        source: LineSource,
        sink: LineSink,
        *,
        drain_timeout: float = 10.0,
        close_timeout: float = 10.0,
        attach: Attachment | None = None,
    ) -> None:
        self.client = client
        self.attach = attach
        self._source = source
        self._sink = sink
        self._drain_timeout = drain_timeout
        self._close_timeout = close_timeout
        self._pending = _PendingRequests()
        self._lanes: list[asyncio.Queue[_Outgoing | None]] = [asyncio.Queue()]
        if client.kind == "http":
            self._lanes.append(asyncio.Queue())  # responses: their own lane, as the transport has
        self._queued_bytes = 0
        self._room = asyncio.Event()
        self._room.set()
        self._idle = asyncio.Event()  # every lane empty and not sending
        self._idle.set()
        self._sending = 0
        self._stdin_closed = asyncio.Event()
        self._stdout_closed = asyncio.Event()
        self._remote_lost = asyncio.Event()
        self._interrupted = asyncio.Event()
        self.failure: TransportError | None = None
        self._connected = False  # something came from the remote
        self.signal: signal.Signals | None = None

    # ------------------------------------------------------------------------------ the run

    def interrupt(self, signum: signal.Signals) -> None:
        """Stop: answer what is pending, close the remote connection, end (from a signal handler)."""
        if self.signal is None:
            self.signal = signum
        self._interrupted.set()

    async def run(self) -> BridgeEnd:
        """Relay until stdin closes, the remote goes away or `interrupt` is called."""
        tasks = [
            asyncio.create_task(self._read_editor(), name="acp-bridge stdin"),
            asyncio.create_task(self._read_remote(), name="acp-bridge remote"),
            *(asyncio.create_task(self._send_lane(lane), name="acp-bridge lane") for lane in self._lanes),
        ]
        try:
            end = await self._until_end()
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(BaseException):
                    await task
        return end

    async def _until_end(self) -> BridgeEnd:
        stops = [self._stdin_closed, self._stdout_closed, self._remote_lost, self._interrupted]
        await _first_of(*stops)
        if self._stdin_closed.is_set() and not (self._remote_lost.is_set() or self._interrupted.is_set()):
            await self._drain()
        if self._interrupted.is_set():
            assert self.signal is not None
            name = self.signal.name
            logger.info("%s: closing the remote connection", name)
            await self._answer_pending(f"acp-bridge: interrupted by {name}", "interrupted")
            await self._close()
            return BridgeEnd.INTERRUPTED
        if self._remote_lost.is_set():
            count = len(self._pending)
            reason = str(self.failure) if self.failure is not None else "the connection ended"
            what = "remote connection lost" if self._connected else "could not connect"
            message, why = f"acp-bridge: {what}: {reason}", "remote-lost"
            if self.attach is not None and (refused := self.attach.refused_message(self.failure, self._connected)):
                message, why = refused, "attach-refused"
            answered = f" ({count} pending requests answered with an error)" if count else ""
            logger.error("%s%s", message.removeprefix("acp-bridge: "), answered)
            await self._answer_pending(message, why)
            await self._close()
            return BridgeEnd.REMOTE_LOST
        await self._answer_pending("acp-bridge: stdin was closed before the remote answered", "stdin-closed")
        await self._close()
        logger.info("connection closed")
        return BridgeEnd.STDIN_CLOSED

    async def _drain(self) -> None:
        """After stdin EOF: let what was read go out and be answered, for a bounded time."""

        async def drained() -> None:
            await self._idle.wait()
            await self._pending.empty.wait()

        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._drain_timeout):
                await _first_of(drained(), self._remote_lost, self._interrupted, self._stdout_closed)

    async def _close(self) -> None:
        try:
            async with asyncio.timeout(self._close_timeout):
                if self.attach is not None:
                    await self.client.detach()  # the session goes on for its other clients
                else:
                    await self.client.close()
        except TimeoutError:
            logger.warning("the remote did not confirm the close within %gs", self._close_timeout)

    def _lose_remote(self, error: TransportError) -> None:
        if self.failure is None:
            self.failure = error
        self._remote_lost.set()

    # ------------------------------------------------------------------- editor -> remote

    async def _read_editor(self) -> None:
        while True:
            try:
                line = await self._source.read_line()
            except LineTooLong as exc:
                await self._write_value(protocol.error_response(None, protocol.INVALID_REQUEST, f"acp-bridge: {exc}"))
                continue
            if line is None:
                logger.debug("stdin closed")
                self._stdin_closed.set()
                return
            try:
                text = line.decode().strip()
            except UnicodeDecodeError as exc:
                await self._write_value(protocol.error_response(None, protocol.PARSE_ERROR, f"Parse error: {exc}"))
                continue
            if text:
                await self._forward(text)

    async def _forward(self, text: str) -> None:
        frame = protocol.parse_frame(text)
        if isinstance(frame, Malformed):
            await self._write_value(frame.error)  # what the remote would answer; nothing is sent
            return
        value: FrameValue = protocol.frame_value(frame)
        value, text = _with_operation_ids(value, text)
        request_ids = _requests(frame)
        local = self.attach.from_editor(frame) if self.attach is not None else None
        if isinstance(local, str):  # something an attached bridge does not do: refused, nothing sent
            for request_id in request_ids:
                await self._write_value(_bridge_error(request_id, local, "attached"))
            return
        for request_id in request_ids:
            self._pending.add(request_id)
        response_lane = len(self._lanes) > 1 and not request_ids and response_only(value)
        await self._room.wait()
        self._queued_bytes += len(text)
        if self._queued_bytes > _QUEUED_BYTES_LIMIT:
            self._room.clear()
        self._idle.clear()
        self._lanes[1 if response_lane else 0].put_nowait(_Outgoing(value, text, request_ids, local))

    async def _send_lane(self, lane: asyncio.Queue[_Outgoing | None]) -> None:
        while (item := await lane.get()) is not None:
            self._sending += 1
            try:
                if item.local is None:
                    await self.client.send(item.value, raw=item.text)
                elif await self._answer_locally(item.local, item.request_ids) and item.local.handover_only:
                    await self.client.send(item.value, raw=item.text)
            except ClientUsageError as exc:
                # Refused before sending (e.g. a call before `initialize` over HTTP): answered here.
                await self._refuse(item.request_ids, str(exc))
            except TransportError as exc:
                self._lose_remote(exc)
                return
            finally:
                self._sending -= 1
                self._queued_bytes -= len(item.text)
                if self._queued_bytes <= _QUEUED_BYTES_LIMIT:
                    self._room.set()
                if self._sending == 0 and all(queue.empty() for queue in self._lanes):
                    self._idle.set()

    async def _answer_locally(self, local: LocalAnswer, request_ids: list[Any]) -> bool:
        """`--attach`: once the attachment is open, answer `local` and hand the editor the session
        (what was held for it; the rest follows as it comes). False: no attachment (answered so)."""
        attach = self.attach
        assert attach is not None
        if not attach.initialize_sent:
            raise ClientUsageError("the first message must be `initialize` (it opens the attachment)")
        await _first_of(attach.settled, self._remote_lost, self._interrupted)
        if self._remote_lost.is_set() or self._interrupted.is_set() or not attach.settled.is_set():
            return False  # the end answers it
        if not attach.attached:
            raise ClientUsageError(f"not attached: {attach.refusal}")
        async with attach.lock:
            if local.request_id is not None and self._pending.answered(local.request_id):
                await self._write_value({"jsonrpc": "2.0", "id": local.request_id, "result": local.result})
            if not attach.handed_over.is_set():
                for text in attach.take_held():
                    await self._write(text)
                attach.handed_over.set()
        return True

    async def _refuse(self, request_ids: list[Any], reason: str) -> None:
        for request_id in request_ids:
            if self._pending.answered(request_id):
                await self._write_value(_bridge_error(request_id, f"acp-bridge: {reason}", "refused"))
        if not request_ids:
            logger.warning("dropped a message the transport refused: %s", reason)

    # ------------------------------------------------------------------- remote -> editor

    async def _read_remote(self) -> None:
        while True:
            try:
                raw = await self.client.receive_raw()
            except TransportError as exc:
                self._lose_remote(exc)
                return
            if raw is None:
                return  # closed by us
            if not self._connected:
                self._connected = True
                logger.info("connected: connection %s", self.client.connection_id or "(the server named none)")
            for request_id in _responses(raw.value):
                self._pending.answered(request_id)
            if self.attach is not None and not await self._from_attached_session(raw.value, _one_line(raw.text)):
                continue
            await self._write(_one_line(raw.text))

    async def _from_attached_session(self, value: FrameValue, text: str) -> bool:
        """`--attach`: False when the bridge took care of a frame from the remote (held until the
        editor has the session, answered otherwise, or the end of the session)."""
        attach = self.attach
        assert attach is not None
        if attach.is_initialize_reply(value):
            assert isinstance(value, dict)
            if (instead := attach.initialize_reply(value, self.client.attachment)) is not None:
                await self._write_value(_bridge_error(value.get("id"), instead, "attach-refused"))
                self._lose_remote(TransportError(attach.refusal or instead))
            else:
                await self._write(text)
            attach.settled.set()  # after the editor has the answer: a session/new is answered after it
            return False
        if (ended := attach.terminated(value)) is not None:
            if attach.handed_over.is_set():
                await self._write(text)
            self._lose_remote(TransportError(ended))
            return False
        if not attach.holds(value):
            return True
        async with attach.lock:
            if attach.handed_over.is_set():
                await self._write(text)  # handed over meanwhile: after what was held
                return False
            attach.hold(text)
        if attach.held_bytes > HELD_BYTES_LIMIT:  # stop reading until the editor takes the session
            await _first_of(attach.handed_over, self._remote_lost, self._interrupted)
        return False

    async def _write_value(self, value: Any) -> None:
        await self._write(protocol.dumps(value))

    async def _write(self, text: str) -> None:
        if self._stdout_closed.is_set():
            return
        try:
            await self._sink.write_line(text)
        except OSError as exc:
            logger.info("stdout closed (%s): nobody reads the agent's messages any more", exc)
            self._stdout_closed.set()

    async def _answer_pending(self, message: str, why: str) -> None:
        for request_id in self._pending.take_all():
            await self._write_value(_bridge_error(request_id, message, why))


def log_reconnect(event: ReconnectEvent) -> None:
    """The `on_reconnect` of the bridge's client: every drop, retry and outcome on stderr."""
    logger.log(logging.WARNING if event.kind in ("restarted", "gave-up") else logging.INFO, "%s", event)


def _bridge_error(request_id: Any, message: str, why: str) -> protocol.Message:
    return protocol.error_response(request_id, BRIDGE_ERROR, message, {"acpBridge": why})


async def _first_of(*waits: Any) -> None:
    """Return when the first of `waits` (coroutines or events) completes."""
    tasks = [asyncio.ensure_future(wait.wait() if isinstance(wait, asyncio.Event) else wait) for wait in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
