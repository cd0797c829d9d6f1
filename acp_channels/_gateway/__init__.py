"""The one interface the edges use to reach a connection, wherever its host lives.

`locate(connection_id, principal)` gives a handle with `submit`, `lease` and `terminate`. A host
in this process is called directly (no serialization, no layer); a host on another worker is
reached through the channel layer (`worker.bus`), and this module also serves those calls for
the hosts this process owns.

A connection belongs to the principal that created it. This module is the one place that rule
is applied: a request by another principal finds nothing, exactly like an unknown id (404),
here for a host in this process, and on the host's worker for a remote one (each op carries the
caller's principal as `Principal.to_wire()`; a mismatch is answered "unknown").

A WebSocket's socket may be attached on any worker too (a reattach lands anywhere): the
consumer holds a `SocketAttachment`, a direct one (`LocalSocket`) or a lease on the host's socket
outbox (`RemoteSocket`), and sends the client's messages and takes the agent's through it.

The cross-worker contract (every op, its fields and its replies) is in
`acp_channels._worker_protocol`; `remote` makes those calls (`RemoteHandle`, `RemoteStream`,
`RemoteSocket`) and turns the refusals a remote host answers into the exceptions a local host
raises (`raise_refusal`); `serve` serves them for the hosts of this process (`serve_*`). A reply an op
cannot get raises `WorkerFailed` (500 at the edges).

`open_connection` is how both edges open a connection on this worker: admission (a draining
worker, MAX_CONNECTIONS, the worker's output budget, the principal's quota), the connection id,
the agent from the `AGENT` setting, the connection's limits; its refusals are typed, and each edge
answers them in its own way. The edges import from here and from `protocol` only: the errors they
answer are re-exported below.
"""

from acp_channels._gateway import opening as opening  # serves Open: placements, attachments
from acp_channels._gateway.handles import HostHandle, SocketAttachment, SocketEnd, StreamReader
from acp_channels._gateway.local import (
    NewConnection,
    admission_refusal,
    initialize_or_abandon,
    locate,
    open_connection,
)
from acp_channels._gateway.serve import cluster_connections, end_connection
from acp_channels._host import (
    AgentEnded,
    QuotaExceeded,
    ReplayUnavailable,
    ServerFull,
    StreamBusy,
    StreamLease,
    TooManyRequests,
    TooManyStreams,
)
from acp_channels.errors import (
    AgentBusy,
    AgentClosed,
    AgentNotStarted,
    HostUnreachable,
    LayerUnavailable,
    ShuttingDown,
    WorkerBusy,
    WorkerFailed,
)

#: What the edges use: finding and opening connections, and the errors they answer; and the
#: cluster view for operators.
__all__ = [
    "AgentBusy",
    "AgentClosed",
    "AgentEnded",
    "AgentNotStarted",
    "HostHandle",
    "HostUnreachable",
    "LayerUnavailable",
    "NewConnection",
    "QuotaExceeded",
    "ReplayUnavailable",
    "ServerFull",
    "ShuttingDown",
    "SocketAttachment",
    "SocketEnd",
    "StreamBusy",
    "StreamLease",
    "StreamReader",
    "TooManyRequests",
    "TooManyStreams",
    "WorkerBusy",
    "WorkerFailed",
    "admission_refusal",
    "cluster_connections",
    "end_connection",
    "initialize_or_abandon",
    "locate",
    "open_connection",
]
