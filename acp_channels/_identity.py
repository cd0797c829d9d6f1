"""Who a connection serves, as data: the principal, and what an agent is told about its client.

Pure values, no Django request handling (that is `acp_channels.auth`). A `Principal` is small and
comparable: it is stored on a connection, travels with cross-worker calls, and every later
request on the connection must present an equal one. Tokens and sessions never travel: they
are resolved to a principal at the edge.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

TransportKind = Literal["http", "websocket"]


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated party: `kind` names the realm ("user" for Django users, "token" for a
    token with no user, "anonymous"), `id` is unique within it, `display` is for logs only
    (never compared)."""

    kind: str
    id: str
    display: str = ""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Principal) and (self.kind, self.id) == (other.kind, other.id)

    def __hash__(self) -> int:
        return hash((self.kind, self.id))

    def __str__(self) -> str:
        shown = self.display or self.id
        return f"{self.kind}:{shown}" if shown else self.kind

    def to_wire(self) -> list[str]:
        return [self.kind, self.id, self.display]

    @classmethod
    def from_wire(cls, value: Any) -> Principal:
        kind, principal_id, display = value
        return cls(str(kind), str(principal_id), str(display))


#: Everyone, when no authentication is configured (ACP_CHANNELS["AUTHENTICATE"] is None).
ANONYMOUS: Final = Principal("anonymous", "")


@dataclass(frozen=True, slots=True)
class AgentContext:
    """What an agent factory (and a stdio agent's `configure` callable) learns about the
    connection it serves: whom, which connection, over what, from where."""

    principal: Principal
    connection_id: str
    transport: TransportKind
    remote_address: str | None = None
