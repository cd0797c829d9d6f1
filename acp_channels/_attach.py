"""Attaching to a live session from a new transport (docs/shared-sessions.md; names provisional).

An initialize POST or a WebSocket upgrade naming a session (`Acp-Attach-Session`, and
`Acp-Attach-Role`: `controller`, the default, or `observer`) opens an attachment instead of a
new agent: a connection of its own carrying that session of the connection that hosts it, on
that connection's process (acp_channels._host.attachments). Who may: the session's own
principal, in either role; another principal with SESSIONS_CONTROL_PERMISSION (either role) or
SESSIONS_OBSERVE_PERMISSION (observer). Anyone else, an anonymous caller, or a session nobody
hosts: NoSuchSession (404), the same answer for all.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from acp_channels._conf import acp_settings
from acp_channels._gateway import NewConnection, cluster_connections
from acp_channels._gateway.local import open_attachment_here
from acp_channels._gateway.placement import PlacedConnection
from acp_channels._host.tap import Role
from acp_channels._identity import ANONYMOUS, Principal, TransportKind
from acp_channels._inventory import ConnectionInfo
from acp_channels._lifecycle import lifecycle
from acp_channels._worker import WORKER_ID, new_connection_id, worker_of
from acp_channels.auth import user_has_permission
from acp_channels.errors import NoSuchSession, ShuttingDown

ROLE_UNKNOWN = "Acp-Attach-Role is 'controller' or 'observer'"


@dataclass(frozen=True, slots=True)
class AttachRequest:
    session_id: str
    role: Role
    #: `Acp-Attach-Cursor`: what the session kept after this position only (the last
    #: `_meta["acp/cursor"]` an earlier attachment got).
    cursor: str | None = None


def attach_request(session_id: str | None, role: str | None, cursor: str | None = None) -> AttachRequest | None:
    """What a request's attach headers (or query) ask for; None: not an attach. ValueError
    (ROLE_UNKNOWN) for a role that is neither."""
    if session_id is None:
        return None
    if role not in (None, "controller", "observer"):
        raise ValueError(ROLE_UNKNOWN)
    return AttachRequest(session_id, "observer" if role == "observer" else "controller", cursor)


def _hosting(connections: list[ConnectionInfo], session_id: str) -> str | None:
    for info in connections:
        if info.attached_to is None and any(session.session_id == session_id for session in info.activity):
            return info.connection_id
    return None


async def _may_attach_to_others(principal: Principal, role: Role) -> bool:
    allowed = [acp_settings.SESSIONS_CONTROL_PERMISSION]
    if role == "observer":
        allowed.append(acp_settings.SESSIONS_OBSERVE_PERMISSION)
    for permission in allowed:
        if permission is not None and await user_has_permission(principal, permission):
            return True
    return False


async def find_session(principal: Principal, request: AttachRequest) -> str:
    """The connection hosting the session that `principal` may attach to as asked."""
    if principal == ANONYMOUS:  # anonymous clients are not one party (as in the directory)
        raise NoSuchSession
    own, _ = await cluster_connections(principal)
    if (found := _hosting(own, request.session_id)) is not None:
        return found
    if await _may_attach_to_others(principal, request.role):
        everyone, _ = await cluster_connections(None)
        if (found := _hosting(everyone, request.session_id)) is not None:
            return found
    raise NoSuchSession


async def open_attachment(
    transport: TransportKind, principal: Principal, remote_address: str | None, request: AttachRequest
) -> NewConnection | PlacedConnection:
    """Open the attachment on the process hosting the session (here, or through the layer). A
    WebSocket's is open when this returns; an HTTP one's once its `initialize` is answered.
    Raises NoSuchSession, TooManyAttachments, ReplayUnavailable, QuotaExceeded, ServerFull,
    ShuttingDown, and for another process LayerUnavailable, WorkerFailed."""
    if lifecycle.draining:
        raise ShuttingDown
    host_connection = await find_session(principal, request)
    process = worker_of(host_connection)
    if process is None:
        raise NoSuchSession
    if process == WORKER_ID:
        return open_attachment_here(
            transport,
            principal,
            remote_address,
            new_connection_id(),
            host_connection,
            request.session_id,
            request.role,
            request.cursor,
        )
    attach = json.dumps(
        {"connection": host_connection, "session": request.session_id, "role": request.role, "cursor": request.cursor}
    )
    placed = PlacedConnection(transport, principal, remote_address, target=process, attach=attach)
    if transport == "websocket":
        await placed.open()
    return placed


__all__ = ["AttachRequest", "attach_request", "find_session", "open_attachment"]
