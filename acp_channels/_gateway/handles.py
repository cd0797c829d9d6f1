"""What every part of the gateway shares: the handles' interfaces, their timeouts, and the one
rule that a connection belongs to the principal that created it (`owned_host`)."""

from __future__ import annotations

import logging
from typing import Literal, Protocol, TypeVar

from acp_channels._host import (
    ConnectionHost,
    Delivery,
    EndReason,
    registry,
)
from acp_channels._identity import Principal
from acp_channels._protocol import InboundPlan, StreamKey
from acp_channels._worker_protocol import (
    Reply,
)

logger = logging.getLogger("acp_channels.gateway")  # one logger for the package, as before it was split

#: How long a submit may wait for the agent to take the frame (its backpressure), after receipt.
SUBMIT_TIMEOUT = 300.0
#: How long ending a connection may take on its host (an agent process may need its grace).
TERMINATE_TIMEOUT = 30.0
#: How long a worker may take to list its connections before the cluster view goes without it.
LIST_TIMEOUT = 2.0

R = TypeVar("R", bound=Reply)


class StreamReader(Protocol):
    #: Names the stream in its SSE event ids.
    tag: str

    async def take(self, timeout: float | None) -> Delivery | None: ...

    @property
    def end_reason(self) -> str:
        """Why `take` returned None ("expired": the connection's credential; the stream ends
        with a comment saying so)."""

    def release(self) -> None: ...


#: Why a socket's `take` returned None: the connection ended (its output all taken), another
#: socket took the connection over, the host forgot this socket's lease (it was silent too long),
#: the host's worker is gone, this worker is shutting down, or the connection's credential
#: expired (the host sent its readers away: acp_channels._host.expiry).
SocketEnd = Literal["ended", "taken", "lost", "gone", "draining", "expired"]
#: The end reasons a socket's own end may give its connection (a clean close, a failed send).
SOCKET_END_REASONS: frozenset[str] = frozenset(("socket closed", "send failed"))


class SocketAttachment(Protocol):
    """A WebSocket attached to its connection, wherever the host lives."""

    #: Client messages the host had received on the connection's sockets when this one attached.
    received: int
    #: Why `take` returned None.
    end_reason: SocketEnd

    async def take(self, timeout: float | None) -> Delivery | None: ...

    async def send_to_agent(self, text: str) -> None:
        """Hand the host a text message the client sent on this socket (raises AgentClosed)."""

    async def detach(self, end: EndReason | None = None) -> None:
        """The socket is gone: end the connection (`end`) or let its grace period run."""


class HostHandle(Protocol):
    async def submit(self, plan: InboundPlan) -> None: ...

    async def reply_from_transport(self, text: str) -> None: ...

    async def lease(self, key: StreamKey, resume: str | None = None) -> StreamReader: ...

    async def attach_socket(self, last_seq: int) -> SocketAttachment: ...

    async def terminate(self) -> None: ...


def owned_host(connection_id: str, principal: Principal) -> ConnectionHost | None:
    """The host of a connection in this process if `principal` owns it; None otherwise, the
    same answer as for an id that does not exist (a stolen id tells nothing).

    A request of the owner with another credential (a refreshed token) rebinds the connection
    to it: the credential sweep asks about that one from now on (its revocation, its expiry,
    its notice; docs/authentication.md, expiry). Principals compare without their credential."""
    host = registry.get(connection_id)
    if host is None or host.principal != principal:
        return None
    bound = host.principal
    if (bound.credential, bound.expires_at) != (principal.credential, principal.expires_at):
        host.principal = principal
        registry.credentials.ensure(principal)
        logger.debug("connection %s: rebound to another credential of %s", connection_id, principal)
    return host
