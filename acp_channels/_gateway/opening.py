"""Opening a connection on this process for an edge elsewhere (the `Open` op): a connection a
web worker placed on this runner (docs/runners.md), or an attachment to a session this process
hosts, wherever its client came in (docs/shared-sessions.md)."""

from __future__ import annotations

import json

from acp_channels import _protocol as protocol
from acp_channels._gateway.local import NewConnection, initialize_or_abandon, open_attachment_here, open_here
from acp_channels._gateway.placement import refusal_reply
from acp_channels._host import AgentEnded, QuotaExceeded, ServerFull
from acp_channels._host.tap import ROLES, Role
from acp_channels._identity import TransportKind
from acp_channels._worker import bus
from acp_channels._worker_protocol import AgentFailed, Closed, Open, Opened, OpenRefused, Reply, UnknownConnection
from acp_channels.errors import (
    AgentClosed,
    AgentNotStarted,
    NoSuchSession,
    ReplayUnavailable,
    ShuttingDown,
    TooManyAttachments,
)


async def serve_open(op: Open) -> Reply:
    """Create the connection; for HTTP, answer with its agent's reply to its initialize (the edge
    applies INITIALIZE_TIMEOUT and ends the connection when it gives up)."""
    try:
        connection = _open(op)
    except ShuttingDown:
        return OpenRefused("draining")
    except (QuotaExceeded, ServerFull, TooManyAttachments) as error:
        return refusal_reply(error)
    except NoSuchSession:
        return UnknownConnection()
    except ReplayUnavailable as error:
        return OpenRefused(f"cursor-{error.reason}")
    except AgentNotStarted:
        return AgentFailed()  # logged by open_here
    if op.text is None or op.init_id is None:
        connection.start()
        return Opened("", True)
    frame = await protocol.read_frame(op.text)
    try:
        reply = await initialize_or_abandon(connection, frame, json.loads(op.init_id), None)
    except (AgentClosed, AgentEnded):
        return Closed()
    return Opened(reply.body, reply.accepted)


def _open(op: Open) -> NewConnection:
    transport: TransportKind = "websocket" if op.transport == "websocket" else "http"
    if op.attach is None:
        return open_here(transport, op.principal, op.remote_address, op.connection)
    try:
        attach = json.loads(op.attach)
        host_connection, session_id, role = str(attach["connection"]), str(attach["session"]), attach["role"]
        cursor = attach.get("cursor")
    except (ValueError, KeyError, TypeError, AttributeError):
        raise NoSuchSession from None
    if role not in ROLES or not isinstance(cursor, str | None):
        raise NoSuchSession
    return open_attachment_here(
        transport, op.principal, op.remote_address, op.connection, host_connection, session_id, role_of(role), cursor
    )


def role_of(value: str) -> Role:
    return "observer" if value == "observer" else "controller"


bus.handle(Open, serve_open)
