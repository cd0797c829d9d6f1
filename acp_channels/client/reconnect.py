"""Reconnecting a dropped SSE stream or WebSocket without losing or repeating a message
(docs/resumable-streams.md), and what both transports share for it:

* `Backoff`, the default `ReconnectPolicy`: exponential delays, then a fatal error after a
  bounded time since the drop;
* `ReconnectEvent`, what `HttpClient(on_reconnect=...)` is told (reconnecting, resumed,
  restarted, gave up), so a terminal or a log can say so;
* `ResumeSupport`, what the server advertised in `initialize`'s `result._meta`;
* `SessionLedger`, what a restart needs: the `initialize` params, the sessions the client has
  open (and how to `session/load` them), the requests still unanswered.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeAlias

from acp_channels import protocol

from ._base import FrameValue
from .errors import TransportError

__all__ = [
    "DEFAULT_BACKOFF",
    "RESUME_META_KEY",
    "Backoff",
    "ReconnectCallback",
    "ReconnectEvent",
    "ReconnectPolicy",
    "ResumeSupport",
    "SessionLedger",
    "StreamDrop",
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
class StreamDrop:
    """A stream (SSE) or socket (WebSocket) that was established has ended or broken."""

    session_id: str | None
    """The session of an SSE stream; None for the connection stream and for a WebSocket."""
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


def event_position(event_id: str) -> tuple[str, int] | None:
    """(tag, seq) of an SSE id of our server's form `<tag>-<seq>`; None for any other id (then
    it is only echoed back, never compared)."""
    tag, dash, seq = event_id.rpartition("-")
    if not dash or not seq.isascii() or not seq.isdigit():
        return None
    return tag, int(seq)


def gone_detail(connection_id: str | None, refusal: str) -> str:
    """Why a 404 to a resume is fatal, for `ResumeRefusedError`."""
    return f"connection {connection_id} is gone on the server (ended, or forgotten); not restarting: {refusal}"


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
