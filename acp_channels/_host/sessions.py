"""What a connection's host knows of its sessions, from the messages it relays: each session's
first and last activity, whether a turn runs (a `session/prompt` not answered yet), and the
permission requests the agent is waiting on (`session/request_permission` not answered yet).
The directory (`GET /acp/sessions`, `_acp-channels/sessions/list`) reads it; nothing is
inferred from anything but the wire.
"""

from __future__ import annotations

import copy
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from acp_channels import _protocol as protocol
from acp_channels._protocol import Frame, Single

#: Where a client names a request's operation (`params._meta`), so that a resend of it (the
#: answer to its POST was lost) is not run twice (docs/shared-sessions.md; provisional).
OPERATION_ID_KEY: Final = "acp-channels/operationId"
#: Operations each session remembers (the most recent).
OPERATIONS_REMEMBERED: Final = 64
PROMPT: Final = "session/prompt"
PERMISSION: Final = "session/request_permission"
#: Sessions one connection keeps in its directory (the least recently active go first).
MAX_SESSIONS: Final = 256


@dataclass(slots=True)
class SessionActivity:
    session_id: str
    #: Wall-clock seconds (time.time()) of the first and the last message naming the session.
    created: float
    last_activity: float
    #: Requests (by id key) waiting for the other side's answer, by method: PROMPT (the agent
    #: answers) and PERMISSION (the client answers).
    waiting: dict[str, set[str]] = field(default_factory=lambda: {PROMPT: set(), PERMISSION: set()})
    #: Operations forwarded lately: operation id -> the JSON-RPC id of the request that carried it.
    operations: OrderedDict[str, Any] = field(default_factory=OrderedDict)

    @property
    def prompts(self) -> set[str]:
        return self.waiting[PROMPT]

    @property
    def permissions(self) -> set[str]:
        return self.waiting[PERMISSION]

    @property
    def turn_running(self) -> bool:
        return bool(self.waiting[PROMPT])


class SessionDirectory:
    """One connection's sessions, in the order they were last active."""

    def __init__(self) -> None:
        #: The agent's name, from its initialize result (`agentInfo.name`), once seen.
        self.agent: str | None = None
        #: The agent's initialize result, as it gave it (an attachment is answered with it).
        self.initialize_result: dict[str, Any] | None = None
        #: Loop time since when permission requests wait with nobody attached (the reaper's).
        self.unattended_since: float | None = None
        self._sessions: dict[str, SessionActivity] = {}
        #: The most recently active session (the last of `_sessions`): the usual one to touch.
        self._latest: SessionActivity | None = None
        #: Requests waiting for the other side's answer, by method: id key -> session id (each
        #: side's ids apart: the client asks PROMPT, the agent PERMISSION).
        self._waiting: dict[str, dict[str, str]] = {PROMPT: {}, PERMISSION: {}}

    def __iter__(self) -> Iterator[SessionActivity]:
        return iter(self._sessions.values())

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._sessions

    def inbound(self, frame: Frame) -> None:
        """A frame from the client to the agent."""
        for message in protocol.frame_messages(frame):
            self._seen(message, asks=PROMPT, answers=PERMISSION)

    def outbound(self, frame: Frame) -> None:
        """A frame from the agent to the client (every event passes here)."""
        latest = self._latest
        if latest is not None and isinstance(frame, Single) and "id" not in frame.message:
            params = frame.message.get("params")  # the usual event: the latest session's notification
            if isinstance(params, dict) and params.get("sessionId") == latest.session_id:
                latest.last_activity = time.time()
                return
        for message in protocol.frame_messages(frame):
            self._seen(message, asks=PERMISSION, answers=PROMPT)
            result = message.get("result")
            if not isinstance(result, dict):
                continue
            if isinstance(result.get("sessionId"), str):
                self._touch(result["sessionId"])  # session/new, session/fork: a new session
            if "protocolVersion" in result and self.initialize_result is None:
                self.initialize_result = copy.deepcopy(result)  # before the server adds its `_meta`
            info = result.get("agentInfo")
            if isinstance(info, dict) and isinstance(info.get("name"), str):
                self.agent = info["name"]

    def _seen(self, message: dict[str, Any], *, asks: str, answers: str) -> None:
        """A message from one side: its request of method `asks` waits until the other side
        answers it; its response ends the other side's request of method `answers`."""
        request_id = message.get("id")
        if "method" not in message:
            if request_id is not None:
                self._answered(answers, protocol.id_key(request_id))
            return
        session_id = protocol.message_session_id(message)
        if session_id is None:
            return
        activity = self._touch(session_id)
        if request_id is None:
            return
        operation = operation_id(message)
        if operation is not None:
            activity.operations[operation] = request_id
            if len(activity.operations) > OPERATIONS_REMEMBERED:
                activity.operations.popitem(last=False)
        if message["method"] == asks:
            key = protocol.id_key(request_id)
            self._waiting[asks][key] = session_id
            activity.waiting[asks].add(key)

    def turn_running(self, session_id: str) -> bool:
        activity = self._sessions.get(session_id)
        return activity is not None and activity.turn_running

    def waiting_requests(self, session_id: str) -> set[str]:
        """Id keys of the agent's permission requests on `session_id` nobody answered yet."""
        activity = self._sessions.get(session_id)
        return set(activity.permissions) if activity is not None else set()

    def prompt_session(self, key: str) -> str | None:
        """The session of the client's unanswered prompt `key`, if it is one."""
        return self._waiting[PROMPT].get(key)

    def permission_session(self, key: str) -> str | None:
        """The session of the agent's unanswered permission request `key`, if it is one."""
        return self._waiting[PERMISSION].get(key)

    def permissions_waiting(self) -> list[tuple[str, str]]:
        """Every unanswered permission request: (id key, session id)."""
        return list(self._waiting[PERMISSION].items())

    def carried_before(self, message: dict[str, Any]) -> tuple[bool, Any]:
        """Whether a client request names an operation already forwarded on its session, and the
        JSON-RPC id of the request that carried it then."""
        operation = operation_id(message) if "method" in message and message.get("id") is not None else None
        session_id = protocol.message_session_id(message) if operation is not None else None
        activity = self._sessions.get(session_id) if session_id is not None else None
        if activity is None or operation is None or operation not in activity.operations:
            return False, None
        return True, activity.operations[operation]

    def _answered(self, method: str, key: str) -> None:
        session_id = self._waiting[method].pop(key, None)
        activity = self._sessions.get(session_id) if session_id is not None else None
        if activity is not None:
            activity.waiting[method].discard(key)
            self._touch(activity.session_id)

    def _touch(self, session_id: str) -> SessionActivity:
        now = time.time()
        latest = self._latest
        if latest is not None and latest.session_id == session_id:
            latest.last_activity = now
            return latest
        activity = self._sessions.pop(session_id, None)
        if activity is None:
            activity = SessionActivity(session_id, now, now)
            if len(self._sessions) >= MAX_SESSIONS:
                self._forget(self._sessions.pop(next(iter(self._sessions))))
        activity.last_activity = now
        self._sessions[session_id] = self._latest = activity  # last: the most recently active
        return activity

    def _forget(self, activity: SessionActivity) -> None:
        for method, keys in activity.waiting.items():
            for key in keys:
                self._waiting[method].pop(key, None)


def operation_id(message: dict[str, Any]) -> str | None:
    """The operation a request names (`params._meta["acp-channels/operationId"]`), if any."""
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    operation = meta.get(OPERATION_ID_KEY) if isinstance(meta, dict) else None
    return operation if isinstance(operation, str) and operation else None
