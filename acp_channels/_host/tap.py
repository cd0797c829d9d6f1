"""One more client of a session: `SessionTap`, the agent of an attachment (its connection
sends its client's messages here and relays what comes back), and the names shared sessions use
on the wire (docs/shared-sessions.md; provisional). The rules between the clients are the
host's: acp_channels._host.attachments."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Literal

from acp_channels import _protocol as protocol
from acp_channels._conf import acp_settings
from acp_channels._identity import AgentContext
from acp_channels._protocol import Frame, Single
from acp_channels.errors import AgentClosed

if TYPE_CHECKING:
    from acp_channels._host.attachments import SharedSessions

logger = logging.getLogger("acp_channels.host")
audit_logger = logging.getLogger("acp_channels.audit")

Role = Literal["controller", "observer"]
ROLES: Final = ("controller", "observer")
#: In the initialize result of an attachment: what it is attached to.
ATTACHMENT_META_KEY: Final = "acp-channels/attachment"
RESOLVED_METHOD: Final = "_acp-channels/session/permission_resolved"
#: To the session's other clients when a turn ends (the prompt's answer goes to its sender only).
TURN_ENDED_METHOD: Final = "_acp-channels/session/turn_ended"
TERMINATED_METHOD: Final = "_acp-channels/session/terminated"
#: JSON-RPC errors of shared sessions (our codes, in the implementation-defined server range).
OBSERVER_REFUSED: Final = -32011
TURN_RUNNING: Final = -32012
NOT_THIS_SESSION: Final = -32013
#: Ids the host's agent sees for a tap's requests start so (an agent echoes ids unchanged).
TAP_ID_PREFIX: Final = "acp-channels/attachment/"
#: Client-side methods: they go to the client whose prompt runs.
CLIENT_SIDE_PREFIXES: Final = ("fs/", "terminal/")
CANCELLED_OUTCOME: Final = {"outcome": "cancelled"}


def notification(method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": protocol.JSONRPC_VERSION, "method": method, "params": params}


def rpc_error(request_id: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": protocol.JSONRPC_VERSION, "id": request_id, "error": {"code": code, "message": message}}


def prompt_echo(message: dict[str, Any], session_id: str) -> list[dict[str, Any]]:
    """What the other clients see of a controller's prompt: its text blocks as user messages."""
    params = message.get("params")
    blocks = params.get("prompt") if isinstance(params, dict) else None
    if not isinstance(blocks, list):
        return []
    return [
        notification(
            "session/update",
            {"sessionId": session_id, "update": {"sessionUpdate": "user_message_chunk", "content": block}},
        )
        for block in blocks
        if isinstance(block, dict) and block.get("type") == "text"
    ]


class SessionTap:
    """The agent of an attachment: the host's session, as one more client sees it."""

    def __init__(self, shared: SharedSessions, session_id: str, role: Role, number: int, principal: object) -> None:
        self.shared = shared
        self.session_id = session_id
        self.role: Role = role
        self.number = number
        self.principal = principal
        self._queue: deque[Frame | None] = deque()
        self._queued_bytes = 0
        self._wakeup = asyncio.Event()
        self._closed = False
        #: Its client's initialize answered: until then nothing goes out (the answer goes first).
        self._initialized = False
        #: Bytes queued past which its client is cut off: its budget, plus what it got at attach.
        self._allowance = acp_settings.MAX_BUFFERED_BYTES
        self._next_id = 0
        #: The ids its client's requests have at the host's agent -> the client's own ids.
        self._ids: dict[str, Any] = {}
        #: Messages of what the session kept, queued at attach (they come first).
        self.retained = 0
        #: Its own connection's id (the attachment), once bound.
        self.connection_id = ""
        #: Ends its connection when its client fell too far behind (set by whoever opened it).
        self.on_cut_off: Callable[[], object] | None = None
        audit_logger.info(
            "session attached principal=%s session=%s connection=%s role=%s",
            principal,
            session_id,
            shared.host.connection_id,
            role,
        )

    def bind(self, context: AgentContext) -> SessionTap:
        """The agent factory of its attachment's connection: this tap."""
        self.connection_id = context.connection_id
        return self

    # -- AgentChannel ----------------------------------------------------------------------

    async def send(self, frame: Frame) -> None:
        if self._closed:
            raise AgentClosed("attachment ended")
        for message in protocol.frame_messages(frame):
            await self._from_client(message)

    async def receive(self) -> Frame | None:
        while not self._queue or not self._initialized:
            if self._closed and (not self._queue or not self._initialized):
                return None
            self._wakeup.clear()
            await self._wakeup.wait()
        frame = self._queue.popleft()
        if frame is not None:
            self._queued_bytes -= _size(frame)
        return frame

    async def close(self) -> None:
        self.end()

    # -- from the host ---------------------------------------------------------------------

    def preload(self, messages: list[dict[str, Any]]) -> None:
        """What the session kept, queued first (at attach, before anything live)."""
        for message in messages:
            self.deliver(message)
        self._allowance += self._queued_bytes
        self.retained = len(messages)

    def deliver(self, message: dict[str, Any]) -> None:
        """A message for this tap's client. A client that does not read while the queue holds
        more than its connection's budget is cut off: its attachment ends (attach again)."""
        if self._closed:
            return
        frame = Single(message)
        self._queue.append(frame)
        self._queued_bytes += _size(frame)
        self._wakeup.set()
        if self._queued_bytes > self._allowance:
            logger.info("attachment %s to session %s fell behind: ending it", self.connection_id, self.session_id)
            self._queue.clear()
            self._queued_bytes = 0
            self.end(reason="fell behind")
            if self.on_cut_off is not None:
                self.on_cut_off()  # its connection waits for its reader, not for this tap: end it

    def answer(self, host_id: Any, message: dict[str, Any]) -> bool:
        """The host's agent answered one of this tap's requests: back under the client's id."""
        client_id = self._ids.pop(protocol.id_key(host_id), _MISSING)
        if client_id is _MISSING:
            return False
        self.deliver({**message, "id": client_id})
        return True

    def end(self, notice: dict[str, Any] | None = None, reason: str = "left") -> None:
        """Stop: the queue drains (after `notice`), then receive() ends the attachment."""
        if self._closed:
            return
        if notice is not None:
            self._queue.append(Single(notice))
        self._closed = True
        self._wakeup.set()
        self.shared.detach(self)
        audit_logger.info(
            "session detached principal=%s session=%s connection=%s attachment=%s reason=%s",
            self.principal,
            self.session_id,
            self.shared.host.connection_id,
            self.connection_id or "-",
            "terminated" if notice is not None else reason,
        )

    # -- from the client -------------------------------------------------------------------

    async def _from_client(self, message: dict[str, Any]) -> None:
        method = message.get("method")
        request_id = message.get("id")
        if method == protocol.INITIALIZE_METHOD and request_id is not None:
            reply = Single(self.shared.initialize_reply(request_id, self))
            if self._initialized:
                self._queue.append(reply)
            else:  # before what the session kept, queued at attach
                self._queue.appendleft(reply)
                self._initialized = True
            self._queued_bytes += _size(reply)
            self._wakeup.set()
            return
        if method is None:  # an answer to one of the agent's requests
            if self.role == "controller":
                await self.shared.client_answer(message, self)
            return
        if self.role == "observer":
            if request_id is not None:
                self.deliver(rpc_error(request_id, OBSERVER_REFUSED, "an observer cannot send to the agent"))
            return
        if protocol.message_session_id(message) != self.session_id:
            if request_id is not None:
                text = f"this attachment carries session {self.session_id} only"
                self.deliver(rpc_error(request_id, NOT_THIS_SESSION, text))
            return
        if request_id is None:
            await self.shared.forward(message, self)
            return
        if (refusal := self.shared.prompt_refusal(message)) is not None:
            self.deliver(rpc_error(request_id, TURN_RUNNING, refusal))
            return
        self._next_id += 1
        host_id = f"{TAP_ID_PREFIX}{self.number}/{self._next_id}"
        self._ids[protocol.id_key(host_id)] = request_id
        await self.shared.forward({**message, "id": host_id}, self)


_MISSING: Final = object()


def _size(frame: Frame) -> int:
    return len(protocol.serialize_frame(frame))
