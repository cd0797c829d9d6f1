"""What the client knows of shared sessions (docs/shared-sessions.md; every name provisional):
attaching to a live session (the headers of the initialize POST or the WebSocket upgrade, and
the `Attachment` its result describes), the notices a session's other clients get, and
operation ids, which make a prompt safe to send again."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias

from ._base import FrameValue
from ._errors import ClientUsageError

__all__ = [
    "ATTACHMENT_META_KEY",
    "ATTACH_ROLES",
    "NOT_THIS_SESSION",
    "OBSERVER_REFUSED",
    "OPERATION_ID_META_KEY",
    "PERMISSION_RESOLVED_METHOD",
    "TERMINATED_METHOD",
    "TURN_ENDED_METHOD",
    "TURN_RUNNING",
    "AttachRole",
    "Attachment",
    "attach_headers",
    "resend_safe",
    "with_operation_ids",
]

ATTACH_SESSION_HEADER: Final = "Acp-Attach-Session"
ATTACH_ROLE_HEADER: Final = "Acp-Attach-Role"
#: In an attachment's initialize result: what it is attached to.
ATTACHMENT_META_KEY: Final = "acp-channels/attachment"
#: In a request's `params._meta`: the operation it is, so that a resend does not run twice.
OPERATION_ID_META_KEY: Final = "acp-channels/operationId"
#: To a session's clients but the prompter when a turn ends (the prompter gets the answer).
TURN_ENDED_METHOD: Final = "_acp-channels/session/turn_ended"
#: An agent's permission request was answered by another client (or by the server's timeout).
PERMISSION_RESOLVED_METHOD: Final = "_acp-channels/session/permission_resolved"
#: The connection hosting the session ended; the attachment's streams end next.
TERMINATED_METHOD: Final = "_acp-channels/session/terminated"
#: JSON-RPC errors of shared sessions.
OBSERVER_REFUSED: Final = -32011
TURN_RUNNING: Final = -32012
NOT_THIS_SESSION: Final = -32013

AttachRole: TypeAlias = Literal["controller", "observer"]
ATTACH_ROLES: Final = ("controller", "observer")
#: Requests the client names as operations (the ones that must never run twice).
_OPERATION_METHODS: Final = frozenset({"session/prompt"})


@dataclass(frozen=True, slots=True)
class Attachment:
    """What an attachment carries, as its initialize result's `_meta["acp-channels/attachment"]` says."""

    session_id: str
    connection_id: str
    """The connection hosting the session (terminating it ends the session); not the attachment's own."""
    role: AttachRole
    turn_running: bool
    """A turn was running on the session when the client attached (its end comes as `turn_ended`)."""

    @classmethod
    def of_initialize_result(cls, result: Any) -> Attachment | None:
        """The attachment an initialize result describes; None when it describes none."""
        meta = result.get("_meta") if isinstance(result, dict) else None
        value = meta.get(ATTACHMENT_META_KEY) if isinstance(meta, dict) else None
        if not isinstance(value, dict):
            return None
        session_id, connection_id, role = value.get("sessionId"), value.get("connectionId"), value.get("role")
        if not isinstance(session_id, str) or not isinstance(connection_id, str):
            return None
        if role == "observer":
            return cls(session_id, connection_id, "observer", value.get("turnRunning") is True)
        if role == "controller":
            return cls(session_id, connection_id, "controller", value.get("turnRunning") is True)
        return None


def attach_headers(session_id: str | None, role: str) -> dict[str, str]:
    """The headers asking to attach to `session_id` (none for a connection of its own); raises
    `ClientUsageError` for a role or a session id that cannot be asked for."""
    if role not in ATTACH_ROLES:
        raise ClientUsageError('role is "controller" or "observer"')
    if session_id is None:
        if role != "controller":
            raise ClientUsageError("role goes with attach (the session to attach to)")
        return {}
    # It travels in a header: printable ASCII without spaces, as session ids are.
    if not session_id or not all("\x21" <= char <= "\x7e" for char in session_id):
        raise ClientUsageError(f"not a session id: {session_id!r}")
    return {ATTACH_SESSION_HEADER: session_id, ATTACH_ROLE_HEADER: role}


def _operation_id(message: Any) -> Any:
    params = message.get("params") if isinstance(message, dict) else None
    meta = params.get("_meta") if isinstance(params, dict) else None
    return meta.get(OPERATION_ID_META_KEY) if isinstance(meta, dict) else None


def _with_operation_id(message: dict[str, Any]) -> dict[str, Any]:
    """`message` with a new operation id when it is a prompt without one (a copy: the caller's
    dict is never changed), else `message` itself."""
    if message.get("method") not in _OPERATION_METHODS or "id" not in message:
        return message
    params = message.get("params")
    if not isinstance(params, dict) or _operation_id(message) is not None:
        return message
    meta = params.get("_meta")
    if meta is not None and not isinstance(meta, dict):
        return message  # not ours to replace
    meta = {**(meta or {}), OPERATION_ID_META_KEY: str(uuid.uuid4())}
    return {**message, "params": {**params, "_meta": meta}}


def with_operation_ids(value: FrameValue) -> FrameValue:
    """`value` with an operation id (a new UUID) in the `params._meta` of each `session/prompt`
    request that has none: the server then runs it once, however often it is sent."""
    if isinstance(value, dict):
        return _with_operation_id(value)
    if isinstance(value, list):
        return [_with_operation_id(entry) if isinstance(entry, dict) else entry for entry in value]
    return value


def resend_safe(value: FrameValue) -> bool:
    """Whether sending `value` again cannot do anything twice: it holds requests only, and every
    one names its operation (the server acknowledges a resend and runs it once)."""
    messages = value if isinstance(value, list) else [value]
    return bool(messages) and all(
        isinstance(message, dict)
        and isinstance(message.get("method"), str)
        and message.get("id") is not None
        and isinstance(_operation_id(message), str)
        for message in messages
    )
