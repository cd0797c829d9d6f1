"""Connection state, in the process that hosts a connection: the only place it lives.

One `ConnectionHost` per ACP connection (`connection`) owns its agent, the reply routes recorded
at POST time, the outbound router and the per-stream mailboxes (`mailbox`), within its output
budget (`budget`); `Registry` (`registry`) maps connection ids to hosts in this process. The
edges reach all of it through acp_channels._gateway.
"""

from acp_channels._host.budget import OutboundBudget, WorkerBudget
from acp_channels._host.connection import ConnectionHost
from acp_channels._host.mailbox import TAKE_BYTES, Delivery, Mailbox, SocketOutbox, StreamLease
from acp_channels._host.registry import Registry, registry, sweep_interval
from acp_channels._host.resume import RESUME_META_KEY, InitializeReply, advertise_server_meta, resume_capabilities
from acp_channels._identity import TransportKind
from acp_channels.errors import (
    AgentEnded,
    EndReason,
    QuotaExceeded,
    ReplayUnavailable,
    ServerFull,
    StreamBusy,
    TooManyRequests,
    TooManyStreams,
)

__all__ = [
    "RESUME_META_KEY",
    "TAKE_BYTES",
    "AgentEnded",
    "ConnectionHost",
    "Delivery",
    "EndReason",
    "InitializeReply",
    "Mailbox",
    "OutboundBudget",
    "QuotaExceeded",
    "Registry",
    "ReplayUnavailable",
    "ServerFull",
    "SocketOutbox",
    "StreamBusy",
    "StreamLease",
    "TooManyRequests",
    "TooManyStreams",
    "TransportKind",
    "WorkerBudget",
    "advertise_server_meta",
    "registry",
    "resume_capabilities",
    "sweep_interval",
]
