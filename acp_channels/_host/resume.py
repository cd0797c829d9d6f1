"""What the server tells a client about resuming its streams (docs/resumable-streams.md) and
listing its sessions (docs/shared-sessions.md), in the initialize result's `_meta`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from acp_channels import _protocol as protocol
from acp_channels._conf import acp_settings
from acp_channels._host.extensions import SESSIONS_LIST
from acp_channels._host.requests import PendingRequests

#: The key under the initialize result's `_meta` where the server says how streams resume
#: (docs/resumable-streams.md).
RESUME_META_KEY: Final = "acp-channels/resume"
#: Where it says where the principal's sessions are listed: the directory's path, and the
#: extension method that answers the same on a connection.
SESSIONS_META_KEY: Final = "acp-channels/sessions"
#: The resumable-transport draft's `transport` capabilities (provisional).
TRANSPORT_META_KEY: Final = "acp/transport"


@dataclass(frozen=True, slots=True)
class InitializeReply:
    """The agent's answer to a new connection's initialize; `accepted`: not an error."""

    body: str
    accepted: bool


def _directory_path() -> str | None:
    from django.urls import NoReverseMatch, reverse

    try:
        return reverse("acp-sessions")
    except NoReverseMatch:  # a site that routes the endpoint itself, without acp_channels.urls
        return None


def resumable() -> dict[str, Any]:
    """What a stream keeps for a client that comes back (the resumable-transport draft's
    `transport.resumable`; provisional): its retention in messages and bytes, and how long a
    connection nobody is attached to lives."""
    detached: float = acp_settings.DETACHED_SECONDS
    idle = acp_settings.IDLE_TIMEOUT_SECONDS
    return {
        "retentionMessages": acp_settings.REPLAY_WINDOW_EVENTS,
        "retentionBytes": acp_settings.REPLAY_WINDOW_BYTES,
        "retentionSeconds": max(detached, idle or 0.0) if idle is not None else None,
    }


def resume_capabilities() -> dict[str, Any]:
    resume_seconds = acp_settings.WEBSOCKET_RESUME_SECONDS
    return {
        "sse": True,
        # 0: a dropped socket ends its connection, so there is nothing to reattach to.
        "websocket": resume_seconds > 0,
        "windowEvents": acp_settings.REPLAY_WINDOW_EVENTS,
        "windowBytes": acp_settings.REPLAY_WINDOW_BYTES,
        "websocketResumeSeconds": resume_seconds,
    }


def advertise_server_meta(reply: protocol.Message, connection_id: str | None = None) -> None:
    """Add what the server offers beside the agent to an initialize result's `_meta` (next to
    what the agent put there): how streams resume, and the session directory
    (docs/shared-sessions.md). A WebSocket's reply also names its connection: a browser cannot
    read the 101's `Acp-Connection-Id`, and needs the id to reattach; and the method of the
    message that tells a reattached browser socket how many of its messages the server has."""
    result = reply.get("result")
    if isinstance(result, dict):
        meta = result.get("_meta")
        if not isinstance(meta, dict):
            meta = result["_meta"] = {}
        capabilities = resume_capabilities()
        if connection_id is not None:
            capabilities["connectionId"] = connection_id
            # A browser reattaches in the query form, and learns Acp-Received from this message.
            capabilities["receivedNotification"] = protocol.RECEIVED_NOTIFICATION
        meta[RESUME_META_KEY] = capabilities
        meta[SESSIONS_META_KEY] = {
            "directory": _directory_path(),
            "listMethod": SESSIONS_LIST,
            "attach": {"header": "Acp-Attach-Session", "cursorHeader": "Acp-Attach-Cursor"},
        }
        meta[TRANSPORT_META_KEY] = {"resumable": resumable()}


def count_socket_replies(
    frame: protocol.Frame, initializing: set[str], pending: PendingRequests, connection_id: str
) -> bool:
    """Count the replies to a WebSocket connection's requests (`pending`); True when one answers
    an initialize (an id in `initializing`): its result now advertises how the connection
    resumes."""
    advertised = False
    for message in protocol.frame_messages(frame):
        if "method" in message or message.get("id") is None:
            continue
        key = protocol.id_key(message["id"])
        if key in initializing:
            initializing.discard(key)
            if not protocol.is_error_response(message):
                advertise_server_meta(message, connection_id)
                advertised = True
        pending.answer_socket(key)
    return advertised
