"""What a restart needs to know, read from a transport's traffic, and how its own requests are
kept apart from the caller's:

* `ResumeSupport`, what the server advertised in `initialize`'s `result._meta`;
* `SessionLedger`, the `initialize` params, the sessions the client has open (and how to
  `session/load` them), the requests still unanswered; both transports feed it;
* `intercepted`, which received frames answer a restart's own requests or replay the history of
  a session it loads (the caller never sees them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from acp_channels import _protocol as protocol

from ._base import FrameValue
from ._shared_sessions import TERMINATED_METHOD, Attachment

__all__ = [
    "PRIVATE_ID_PREFIX",
    "RESTART_ERROR_DATA",
    "RESUME_META_KEY",
    "ResumeSupport",
    "SessionLedger",
    "intercepted",
    "restart_error",
]

#: The key of `initialize`'s `result._meta` under which the server advertises resuming.
RESUME_META_KEY: Final = "acp-channels/resume"
#: Where a restart's own requests are told apart from the caller's (their ids start with it).
PRIVATE_ID_PREFIX: Final = "acp-channels/restart/"
#: `data.acpChannels` of the error a restart answers each unanswered request with.
RESTART_ERROR_DATA: Final = "connection-restarted"
#: Methods whose successful reply means the session is open on this connection.
_OPENING_METHODS: Final = frozenset({"session/new", "session/load", "session/resume", "session/fork"})


@dataclass(frozen=True, slots=True)
class ResumeSupport:
    """`result._meta["acp-channels/resume"]` of the initialize reply (absent: all False)."""

    sse: bool = False
    websocket: bool = False

    @classmethod
    def of_initialize_result(cls, result: Any) -> ResumeSupport:
        meta = result.get("_meta") if isinstance(result, dict) else None
        advertised = meta.get(RESUME_META_KEY) if isinstance(meta, dict) else None
        if not isinstance(advertised, dict):
            return cls()
        return cls(sse=advertised.get("sse") is True, websocket=advertised.get("websocket") is True)


def restart_error(request_id: Any) -> protocol.Message:
    """The answer to a request the old connection never answered."""
    return protocol.error_response(
        request_id,
        protocol.INTERNAL_ERROR,
        "the connection was lost and a new one started; this request was not answered",
        {"acpChannels": RESTART_ERROR_DATA},
    )


@dataclass
class _SessionParams:
    cwd: Any
    mcp_servers: Any


@dataclass
class SessionLedger:
    """Watches a transport's traffic for what a restart needs (both transports feed it)."""

    initialize_params: Any = None
    initialize_id: Any = None
    load_session: bool = False
    """The agent advertised `agentCapabilities.loadSession`."""
    resume: ResumeSupport = field(default_factory=ResumeSupport)
    initialized: bool = False
    attach_session_id: str | None = None
    """The session the client asked to attach to (None: a connection of its own)."""
    attachment: Attachment | None = None
    """What the initialize result says the client attached to."""
    attach_failure: str | None = None
    """Why the initialize result is not the attachment asked for (the server did not attach)."""
    terminated: bool = False
    """The attached session's connection ended (`_acp-channels/session/terminated`): the
    streams end next, and there is nothing to resume."""
    sessions: dict[str, _SessionParams] = field(default_factory=dict)
    _opening: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    _closing: dict[str, str] = field(default_factory=dict)
    _outstanding: dict[str, Any] = field(default_factory=dict)
    #: Agent requests the caller has not answered yet, and those of a replaced connection.
    _asked: set[str] = field(default_factory=set)
    _stale_asked: set[str] = field(default_factory=set)
    _next_private: int = 0

    def sent(self, value: FrameValue) -> None:
        """The caller sent `value` (a message or a batch)."""
        for message in _messages_of(value):
            method = message.get("method")
            if method is None and "id" in message:
                self._asked.discard(protocol.id_key(message["id"]))
                continue
            if not isinstance(method, str) or "id" not in message or message["id"] is None:
                continue
            key = protocol.id_key(message["id"])
            self._outstanding[key] = message["id"]
            params = message.get("params")
            if method == protocol.INITIALIZE_METHOD:
                self.initialize_params, self.initialize_id = params, message["id"]
            elif method in _OPENING_METHODS and isinstance(params, dict):
                self._opening[key] = (method, params)
            elif method == "session/close" and isinstance(params, dict) and isinstance(params.get("sessionId"), str):
                self._closing[key] = params["sessionId"]

    def received(self, value: FrameValue) -> None:
        """The agent sent `value`: replies settle what they answer."""
        for message in _messages_of(value):
            if "id" not in message or message["id"] is None:
                if message.get("method") == TERMINATED_METHOD and self.attachment is not None:
                    params = message.get("params")
                    self.terminated |= (
                        isinstance(params, dict) and params.get("sessionId") == self.attachment.session_id
                    )
                continue
            key = protocol.id_key(message["id"])
            if "method" in message:
                self._asked.add(key)
                continue

            self._outstanding.pop(key, None)
            result = message.get("result")
            succeeded = "error" not in message
            if self.initialize_id is not None and key == protocol.id_key(self.initialize_id) and succeeded:
                self.initialized = True
                self._note_initialize_result(result)
            opening = self._opening.pop(key, None)
            if opening is not None and succeeded:
                method, params = opening
                session_id = result.get("sessionId") if isinstance(result, dict) else None
                if method in ("session/load", "session/resume"):
                    session_id = params.get("sessionId")
                if isinstance(session_id, str):
                    self.sessions[session_id] = _SessionParams(params.get("cwd"), params.get("mcpServers", []))
            closing = self._closing.pop(key, None)
            if closing is not None and succeeded:
                self.sessions.pop(closing, None)

    def _note_initialize_result(self, result: Any) -> None:
        self.resume = ResumeSupport.of_initialize_result(result)
        capabilities = result.get("agentCapabilities") if isinstance(result, dict) else None
        self.load_session = isinstance(capabilities, dict) and capabilities.get("loadSession") is True
        self.attachment = Attachment.of_initialize_result(result)
        asked = self.attach_session_id
        if asked is not None and (self.attachment is None or self.attachment.session_id != asked):
            # A server that knows no attaching ignores the header and starts an agent of its own.
            self.attach_failure = (
                f"asked to attach to session {asked}, the server did not: its initialize result has no "
                "_meta['acp-channels/attachment'] for it (it does not support attaching)"
            )

    def take_outstanding(self) -> list[Any]:
        """For a restart: ids of the caller's requests still unanswered (then forgotten); the
        agent's unanswered requests become stale (see `stale_answer`)."""
        taken = list(self._outstanding.values())
        self._outstanding.clear()
        self._opening.clear()
        self._closing.clear()
        self._stale_asked |= self._asked
        self._asked.clear()
        return taken

    def stale_answer(self, value: FrameValue) -> bool:
        """`value` answers a request of a connection a restart replaced (nobody waits for it)."""
        if not isinstance(value, dict) or "method" in value or "id" not in value:
            return False
        key = protocol.id_key(value["id"])
        if key in self._asked or key not in self._stale_asked:
            return False
        self._stale_asked.discard(key)
        return True

    def private_id(self) -> str:
        self._next_private += 1
        return f"{PRIVATE_ID_PREFIX}{self._next_private}"

    def restart_refusal(self) -> str | None:
        """Why a restart cannot be done, or None."""
        if not self.initialized:
            return "the connection was never initialized"
        if self.attach_session_id is not None:
            return "an attachment is not restarted (attach to the session again)"
        if self.sessions and not self.load_session:
            return "the agent does not advertise agentCapabilities.loadSession, so its sessions cannot be loaded"
        return None

    def load_request(self, session_id: str) -> protocol.Message:
        params = self.sessions[session_id]
        load_params = {"sessionId": session_id, "cwd": params.cwd, "mcpServers": params.mcp_servers}
        return {"jsonrpc": "2.0", "id": self.private_id(), "method": "session/load", "params": load_params}

    def initialize_request(self) -> protocol.Message:
        message: protocol.Message = {"jsonrpc": "2.0", "id": self.private_id(), "method": "initialize"}
        if self.initialize_params is not None:
            message["params"] = self.initialize_params
        return message


def is_private_reply(value: FrameValue) -> bool:
    return (
        isinstance(value, dict)
        and "method" not in value
        and isinstance(value.get("id"), str)
        and value["id"].startswith(PRIVATE_ID_PREFIX)
    )


def replayed_update_of(value: FrameValue, loading: set[str] | frozenset[str]) -> bool:
    """A `session/update` of a session being loaded by a restart (its history, already seen)."""
    if not loading or not isinstance(value, dict) or value.get("method") != "session/update":
        return False
    params = value.get("params")
    return isinstance(params, dict) and params.get("sessionId") in loading


def _messages_of(value: FrameValue) -> list[dict[str, Any]]:
    if isinstance(value, dict):
        return [value]
    return [entry for entry in value if isinstance(entry, dict)]


def intercepted(value: FrameValue, private_replies: dict[str, Any], loading: set[str] | frozenset[str]) -> bool:
    """Whether a received frame is for the transport, not its caller: a reply to a request a
    restart sent itself (its waiter gets it), or history a restart's session/load replays (the
    caller has seen it)."""
    if is_private_reply(value):
        assert isinstance(value, dict)
        waiter = private_replies.pop(value["id"], None)
        if waiter is not None and not waiter.done():
            waiter.set_result(value)
        return True
    return replayed_update_of(value, loading)
