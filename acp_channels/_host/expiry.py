"""What a host does about a credential that expires (docs/authentication.md, expiry): it tells the
client ahead (`_acp-channels/auth_expiring`), and at expiry closes the connection's physical
streams, every SSE reader and the socket, while the connection lives on for a client that comes
back with a new credential of the same principal (`acp_channels._gateway.handles.owned_host`
rebinds it). The credential sweep (`acp_channels._host.credentials`) decides when."""

from __future__ import annotations

import datetime
from typing import Final

from acp_channels import _protocol as protocol
from acp_channels._host.connection import ConnectionHost

#: Why a reader was sent away (`Mailbox.evict`): its readers end their streams so (SSE: the
#: comment `: credential expired`; WebSocket: close code 4401).
EXPIRED: Final = "expired"


def rfc3339(moment: float) -> str:
    """`moment` (seconds since the epoch) in RFC 3339, UTC, to the second (rounded down: a
    client told a little early refreshes a little early)."""
    return datetime.datetime.fromtimestamp(moment, datetime.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def expiring_notice(expires_at: float) -> str:
    """The notification `_acp-channels/auth_expiring` (no token in it, ever)."""
    method, params = protocol.AUTH_EXPIRING_NOTIFICATION, {"expiresAt": rfc3339(expires_at)}
    return protocol.dumps({"jsonrpc": protocol.JSONRPC_VERSION, "method": method, "params": params})


def send_expiring_notice(host: ConnectionHost, expires_at: float) -> None:
    """Queue the notice where the agent's connection-level messages go: the connection stream,
    or the socket. One of the stream's events like any other (numbered, replayed on a resume)."""
    mailbox = host.socket_outbox if host.transport == "websocket" else host.stream(protocol.CONNECTION_STREAM)
    mailbox.push(expiring_notice(expires_at))


def close_streams(host: ConnectionHost) -> int:
    """Send every reader of the connection away (its SSE streams end, its socket closes with
    4401); nothing of the connection ends. How many readers there were."""
    return sum(mailbox.evict(EXPIRED) for mailbox in host.mailboxes)
