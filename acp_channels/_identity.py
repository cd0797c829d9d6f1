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
    (never compared). `credential` names what it authenticated with, never the secret (e.g.
    "acp_tokens:42", the built-in token 42; "" for none): what the credential sweep asks about
    (`acp_channels._revalidate`); never compared either."""

    kind: str
    id: str
    display: str = ""
    credential: str = ""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Principal) and (self.kind, self.id) == (other.kind, other.id)

    def __hash__(self) -> int:
        return hash((self.kind, self.id))

    def __str__(self) -> str:
        shown = self.display or self.id
        return f"{self.kind}:{shown}" if shown else self.kind

    def to_wire(self) -> list[str]:
        wire = [self.kind, self.id, self.display]
        return [*wire, self.credential] if self.credential else wire

    @classmethod
    def from_wire(cls, value: Any) -> Principal:
        if not isinstance(value, list | tuple) or len(value) not in (3, 4):
            raise ValueError("a principal is [kind, id, display] or [kind, id, display, credential]")
        kind, principal_id, display, *credential = value
        return cls(str(kind), str(principal_id), str(display), str(credential[0]) if credential else "")


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
