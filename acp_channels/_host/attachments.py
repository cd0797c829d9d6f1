"""Several clients on one session (docs/shared-sessions.md; names provisional).

An attachment is a connection of its own (its id, streams or socket, resumption: everything a
connection has) whose agent is a `SessionTap`: a tap into one session of another connection in
this process, the session's *host*. What the host's agent says about the session goes to the
host's own client and to every tap; what a tap's client sends goes to the host's agent, its
request ids made unique on the way (ids of different clients would collide) and restored on
the answer, which goes to that tap only.

`SharedSessions` (one per host, made when the first tap attaches or a permission request
expires) holds the taps by session and the rules between the clients:
- the agent's permission requests go to every controller; the first answer is forwarded, the
  others are dropped, and everyone else gets `_acp-channels/session/permission_resolved`;
- the agent's `fs/*` and `terminal/*` requests go to the client whose prompt runs;
- a prompt while a turn runs on a shared session is refused (`TURN_RUNNING`); a controller's
  prompt is shown to the others as `user_message_chunk` updates;
- an observer sends nothing to the agent (`OBSERVER_REFUSED`);
- the host ending ends every tap, after `_acp-channels/session/terminated`.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
from collections import OrderedDict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final, Literal

from acp_channels import _metrics as metrics
from acp_channels import _protocol as protocol
from acp_channels._conf import acp_settings
from acp_channels._host.tap import (
    ATTACHMENT_META_KEY,
    CANCELLED_OUTCOME,
    CLIENT_SIDE_PREFIXES,
    RESOLVED_METHOD,
    TAP_ID_PREFIX,
    TERMINATED_METHOD,
    TURN_ENDED_METHOD,
    TURN_RUNNING,
    Role,
    SessionTap,
    notification,
    prompt_echo,
    rpc_error,
)
from acp_channels._protocol import Frame, Single
from acp_channels.errors import AgentClosed, ReplayUnavailable, TooManyAttachments

if TYPE_CHECKING:
    from acp_channels._host.connection import ConnectionHost

logger = logging.getLogger("acp_channels.host")

#: Where a message to an attachment carries its position in the session's stream (the
#: resumable-transport draft's name; provisional).
CURSOR_KEY: Final = "acp/cursor"
#: Permission requests whose outcome a host remembers (to drop late answers).
RESOLVED_REMEMBERED: Final = 1024


class SharedSessions:
    """The taps of one host's sessions and the rules between its clients (module docstring)."""

    def __init__(self, host: ConnectionHost) -> None:
        self.host = host
        self.taps: dict[str, list[SessionTap]] = {}
        self._numbers = 0
        #: Who runs each session's turn: the tap whose prompt runs (absent: the host's own client).
        self._turn_owner: dict[str, SessionTap] = {}
        #: Permission requests answered (id key -> outcome), the most recent.
        self._resolved: OrderedDict[str, Any] = OrderedDict()

    @property
    def count(self) -> int:
        return sum(len(taps) for taps in self.taps.values())

    def attach(self, session_id: str, role: Role, principal: object, cursor: str | None = None) -> SessionTap:
        """A new tap into `session_id`, with what the session kept (after `cursor`, a position
        an earlier attachment was given) queued first. Raises TooManyAttachments,
        ReplayUnavailable (409: `cursor` is not this session's, or what follows it is gone)."""
        taps = self.taps.get(session_id, [])
        limit = acp_settings.MAX_ATTACHMENTS_PER_SESSION
        if len(taps) >= limit:
            raise TooManyAttachments(limit)
        kept = self.kept(session_id, role, cursor)
        self._numbers += 1
        tap = SessionTap(self, session_id, role, self._numbers, principal)
        tap.preload(kept)
        self.taps.setdefault(session_id, []).append(tap)
        self.host.own_client.others_came()
        return tap

    def detach(self, tap: SessionTap) -> None:
        taps = self.taps.get(tap.session_id)
        if taps is not None and tap in taps:
            taps.remove(tap)
            if not taps:
                del self.taps[tap.session_id]
        if self._turn_owner.get(tap.session_id) is tap:
            del self._turn_owner[tap.session_id]

    def end_all(self) -> None:
        """The host ended: every tap gets the notice, then ends."""
        for session_id, taps in list(self.taps.items()):
            notice = notification(TERMINATED_METHOD, {"sessionId": session_id, "connectionId": self.host.connection_id})
            for tap in list(taps):
                tap.end(notice)

    # -- what a new tap gets first ---------------------------------------------------------

    def initialize_reply(self, request_id: Any, tap: SessionTap) -> dict[str, Any]:
        result = copy.deepcopy(self.host.sessions.initialize_result or {})
        meta = result.setdefault("_meta", {})
        meta[ATTACHMENT_META_KEY] = {
            "sessionId": tap.session_id,
            "connectionId": self.host.connection_id,
            "role": tap.role,
            "turnRunning": self.host.sessions.turn_running(tap.session_id),
            "retained": tap.retained,  # the messages before the live ones
        }
        return {"jsonrpc": protocol.JSONRPC_VERSION, "id": request_id, "result": result}

    def kept(self, session_id: str, role: Role, cursor: str | None = None) -> list[dict[str, Any]]:
        """What the host still holds of the session's output (after `cursor`), in order, each
        with its cursor: its notifications, and the agent's requests nobody answered yet (a
        controller's to answer); never replies to the host's own client."""
        mailbox = self.host.stream_if_any(session_id)
        after = 0
        if cursor is not None:
            position = protocol.parse_event_id(cursor)
            if mailbox is None or position is None or position[0] != mailbox.tag:
                raise ReplayUnavailable("foreign", cursor)
            mailbox.check_cursor(position[1], cursor)
            after = position[1]
        if mailbox is None:
            return []
        waiting = self.host.sessions.waiting_requests(session_id)
        kept: list[dict[str, Any]] = []
        for seq, text in mailbox.kept_since(after):
            for message in _messages(text):
                if message.get("method") is None or protocol.message_session_id(message) != session_id:
                    continue
                request_id = message.get("id")
                if request_id is None or (role == "controller" and protocol.id_key(request_id) in waiting):
                    kept.append(with_cursor(message, protocol.event_id(mailbox.tag, seq)))
        return kept

    # -- the agent's output ----------------------------------------------------------------

    def outbound(self, frame: Frame) -> Frame | None:
        """Share what the agent says about shared sessions; returns what goes to the host's own
        client (None: nothing)."""
        if not self.taps and isinstance(frame, Single) and "method" in frame.message:
            return frame  # the usual event, and nobody else attached (any more): nothing to share
        messages = protocol.frame_messages(frame)
        own: list[dict[str, Any]] = []
        for message in messages:
            if self._share(message):
                own.append(message)
        if len(own) == len(messages):
            return frame
        if not own:
            return None
        return Single(own[0]) if len(own) == 1 else protocol.Batch(list[protocol.BatchEntry](own))

    def _share(self, message: dict[str, Any]) -> bool:
        """Deliver `message` to the taps it is for; True when the host's own client gets it too."""
        method = message.get("method")
        if method is None:
            request_id = message.get("id")
            tap_id = isinstance(request_id, str) and request_id.startswith(TAP_ID_PREFIX)
            if request_id is not None and isinstance(result := message.get("result"), dict) and "stopReason" in result:
                prompted = self.host.sessions.prompt_session(protocol.id_key(request_id))
                if prompted is not None:
                    self._turn_ended(prompted, result["stopReason"], self._turn_owner.pop(prompted, None))
            if tap_id:
                self._answer_tap(str(request_id), message)
                return False
            return True
        session_id = protocol.message_session_id(message)
        taps = self.taps.get(session_id) if session_id is not None else None
        if not taps or session_id is None:
            return True
        if message.get("id") is not None and isinstance(method, str) and method.startswith(CLIENT_SIDE_PREFIXES):
            owner = self._turn_owner.get(session_id)
            if owner is not None:
                owner.deliver(message)
                return False
            return True
        message = with_cursor(message, self._next_cursor(session_id))
        for tap in taps:
            if message.get("id") is None or tap.role == "controller":
                tap.deliver(message)
        return True

    def _next_cursor(self, session_id: str) -> str:
        """The position the next item of the session's stream gets (the host's own client's
        stream, where the message goes next: its socket, or the session's SSE stream)."""
        host = self.host
        mailbox = host.socket_outbox if host.transport == "websocket" else host.stream(session_id)
        return protocol.event_id(mailbox.tag, mailbox.next_seq)

    def _answer_tap(self, host_id: str, message: dict[str, Any]) -> None:
        number = host_id[len(TAP_ID_PREFIX) :].partition("/")[0]
        for taps in self.taps.values():
            for tap in taps:
                if str(tap.number) == number and tap.answer(host_id, message):
                    return

    def _turn_ended(self, session_id: str, stop_reason: Any, prompter: SessionTap | None) -> None:
        """A prompt was answered: the session's other clients learn the turn ended."""
        notice = notification(TURN_ENDED_METHOD, {"sessionId": session_id, "stopReason": stop_reason})
        if prompter is not None:
            _to_own_client(self.host, session_id, notice)
        for tap in self.taps.get(session_id, []):
            if tap is not prompter:
                tap.deliver(notice)

    # -- what clients send -----------------------------------------------------------------

    def prompt_refusal(self, message: dict[str, Any]) -> str | None:
        """Why a prompt cannot run now: a turn runs on its session, which is shared."""
        if message.get("method") != "session/prompt":
            return None
        session_id = protocol.message_session_id(message)
        if session_id is None or not self.taps.get(session_id):
            return None
        if self.host.sessions.turn_running(session_id):
            return "a turn is running on this session; wait for it to end, or cancel it"
        return None

    async def forward(self, message: dict[str, Any], tap: SessionTap) -> None:
        """A controller tap's message, to the host's agent."""
        session_id = tap.session_id
        if message.get("method") == "session/prompt":
            self._turn_owner[session_id] = tap
            self.echo_prompt(message, session_id, tap)
        await _to_agent(self.host, Single(message))

    def own_prompt(self, message: dict[str, Any], session_id: str) -> None:
        """The host's own client prompts: its turn (fs/terminal requests go to it), shown to the taps."""
        self._turn_owner.pop(session_id, None)
        self.echo_prompt(message, session_id, None)

    def echo_prompt(self, message: dict[str, Any], session_id: str, sender: SessionTap | None) -> None:
        """Show a controller's prompt to the session's other clients."""
        for echo in prompt_echo(message, session_id):
            if sender is not None:
                _to_own_client(self.host, session_id, echo)
            for tap in self.taps.get(session_id, []):
                if tap is not sender:
                    tap.deliver(echo)

    async def client_answer(self, message: dict[str, Any], tap: SessionTap | None) -> bool:
        """A client answers one of the agent's requests. The first answer to a permission request
        goes to the agent, and the others learn it was resolved; a later answer is dropped.
        Returns whether it went to the agent (a tap's answer goes from here)."""
        request_id = message.get("id")
        key = protocol.id_key(request_id)
        if key in self._resolved:
            return False
        session_id = self.host.sessions.permission_session(key)
        if session_id is not None:
            result = message.get("result")
            outcome = result.get("outcome") if isinstance(result, dict) else None
            self.resolve(key, session_id, request_id, outcome, answered_by=tap)
        if tap is not None:
            await _to_agent(self.host, Single(message))
        return True

    def resolve(
        self,
        key: str,
        session_id: str,
        request_id: Any,
        outcome: Any,
        answered_by: SessionTap | Literal["server"] | None,
    ) -> None:
        """Permission request `key` is answered: late answers are dropped, and every client but
        the one that answered (None: the host's own) learns the outcome."""
        self._resolved[key] = outcome
        while len(self._resolved) > RESOLVED_REMEMBERED:
            self._resolved.popitem(last=False)
        notice = notification(RESOLVED_METHOD, {"sessionId": session_id, "requestId": request_id, "outcome": outcome})
        if answered_by is not None:
            _to_own_client(self.host, session_id, notice)
        for tap in self.taps.get(session_id, []):
            if tap is not answered_by:
                tap.deliver(notice)

    def answered(self, key: str) -> bool:
        return key in self._resolved

    async def cancel_permissions(self, waiting: Iterable[tuple[str, str]]) -> None:
        """Answer permission requests nobody answered in time as cancelled (`waiting`: id key,
        session id); everyone attached learns it."""
        for key, session_id in list(waiting):
            if key in self._resolved:
                continue
            request_id = json.loads(key)
            answer = {"jsonrpc": protocol.JSONRPC_VERSION, "id": request_id, "result": {"outcome": CANCELLED_OUTCOME}}
            logger.info(
                "connection %s: permission request %s on session %s unanswered: cancelled",
                self.host.connection_id,
                key,
                session_id,
            )
            self.resolve(key, session_id, request_id, CANCELLED_OUTCOME, answered_by="server")
            await _to_agent(self.host, Single(answer))


def _messages(text: str) -> list[dict[str, Any]]:
    try:
        value = json.loads(text)
    except ValueError:
        return []
    values = value if isinstance(value, list) else [value]
    return [item for item in values if isinstance(item, dict)]


# -- the host's side ---------------------------------------------------------------------------


async def _to_agent(host: ConnectionHost, frame: Frame) -> None:
    """A message from another client of the host's sessions (or the server), to its agent."""
    if host.ended.is_set():
        raise AgentClosed("connection ended")
    host.last_active = asyncio.get_running_loop().time()
    host.sessions.inbound(frame)
    metrics.record_messages_in(host.transport, frame)
    await host.agent.send(frame)


def _to_own_client(host: ConnectionHost, session_id: str, message: dict[str, Any]) -> None:
    """A message for the host's own client, where the session's output goes."""
    text = protocol.dumps(message)
    if host.transport == "websocket":
        host.socket_outbox.push(text)
    else:
        host.stream(session_id).push(text)


def with_cursor(message: dict[str, Any], cursor: str) -> dict[str, Any]:
    """The message with its position in the session's stream (`params._meta["acp/cursor"]`):
    an attachment that comes back names the last it got (Acp-Attach-Cursor)."""
    params = message.get("params")
    if not isinstance(params, dict):
        return message
    meta = params.get("_meta")
    return {**message, "params": {**params, "_meta": {**(meta if isinstance(meta, dict) else {}), CURSOR_KEY: cursor}}}


def held_back(host: ConnectionHost, frame: Frame) -> bool:
    """Whether the host's own client's `frame` stops here (then it was answered, or dropped): an
    answer to a permission request already resolved, a prompt refused while a turn runs on a
    shared session. Its prompts are shown to the session's other clients."""
    shared = host.shared
    if shared is None or not isinstance(frame, Single):
        return False
    message = frame.message
    request_id = message.get("id")
    if "method" not in message:
        if request_id is None:
            return False
        key = protocol.id_key(request_id)
        if shared.answered(key):
            return True
        session_id = host.sessions.permission_session(key)
        if session_id is not None and shared.taps.get(session_id):
            result = message.get("result")
            outcome = result.get("outcome") if isinstance(result, dict) else None
            shared.resolve(key, session_id, request_id, outcome, answered_by=None)
        return False
    session_id = protocol.message_session_id(message)
    if message["method"] != "session/prompt" or session_id is None or request_id is None:
        return False
    if (refusal := shared.prompt_refusal(message)) is not None:
        _to_own_client(host, session_id, rpc_error(request_id, TURN_RUNNING, refusal))
        return True
    shared.own_prompt(message, session_id)
    return False


def share(host: ConnectionHost) -> SharedSessions:
    """The host's shared sessions, made on first use."""
    if host.shared is None:
        host.shared = SharedSessions(host)
    return host.shared


async def expire_permissions(host: ConnectionHost, now: float) -> None:
    """Answer as cancelled the permission requests that waited PERMISSION_TIMEOUT_SECONDS with
    nobody attached (the reaper's sweep calls this)."""
    waiting = host.sessions.permissions_waiting()
    if not waiting or host.attachments:
        host.sessions.unattended_since = None
        return
    if host.sessions.unattended_since is None:
        host.sessions.unattended_since = now
        return
    if now - host.sessions.unattended_since >= acp_settings.PERMISSION_TIMEOUT_SECONDS:
        await share(host).cancel_permissions(waiting)
