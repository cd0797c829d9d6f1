"""Who a connection serves, as data: the principal, and what an agent is told about its client.

Pure values, no Django request handling (that is `acp_channels.auth`). A `Principal` is small and
comparable: it is stored on a connection, travels with cross-worker calls, and every later
request on the connection must present an equal one. Tokens and sessions never travel: they
are resolved to a principal at the edge.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final, Literal

TransportKind = Literal["http", "websocket"]


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated party: `kind` names the realm ("user" for Django users, "token" for a
    token with no user, "anonymous"), `id` is unique within it, `display` is for logs only
    (never compared). `credential` names what it authenticated with, never the secret (e.g.
    "acp_tokens:42", the built-in token 42; "" for none): what the credential sweep asks about
    (`acp_channels._revalidate`); never compared either. `expires_at` is when that credential
    stops being valid (seconds since the epoch), if the authenticator knows: the host tells the
    client before (`_acp-channels/auth_expiring`) and closes the connection's streams then
    (docs/authentication.md, expiry); not compared."""

    kind: str
    id: str
    display: str = ""
    credential: str = ""
    expires_at: float | None = None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Principal) and (self.kind, self.id) == (other.kind, other.id)

    def __hash__(self) -> int:
        return hash((self.kind, self.id))

    def __str__(self) -> str:
        shown = self.display or self.id
        return f"{self.kind}:{shown}" if shown else self.kind

    def to_wire(self) -> list[str]:
        wire = [self.kind, self.id, self.display]
        if self.expires_at is not None:
            return [*wire, self.credential, repr(self.expires_at)]
        return [*wire, self.credential] if self.credential else wire

    @classmethod
    def from_wire(cls, value: Any) -> Principal:
        if not isinstance(value, list | tuple) or len(value) not in (3, 4, 5):
            raise ValueError("a principal is [kind, id, display], then its credential and when that expires")
        kind, principal_id, display, *rest = value
        credential = str(rest[0]) if rest else ""
        expires_at = float(rest[1]) if len(rest) > 1 else None  # ValueError for what is not a number
        if expires_at is not None and not math.isfinite(expires_at):
            raise ValueError("a principal's expiry is a finite number")
        return cls(str(kind), str(principal_id), str(display), credential, expires_at)


#: Everyone, when no authentication is configured (ACP_CHANNELS["AUTHENTICATE"] is None).
ANONYMOUS: Final = Principal("anonymous", "")

#: A principal with the credential it authenticated with (principals compare without it).
CredentialKey = tuple[str, str, str]


def credential_key(principal: Principal) -> CredentialKey:
    return (principal.kind, principal.id, principal.credential)


@dataclass(frozen=True, slots=True)
class AgentContext:
    """What an agent factory (and a stdio agent's `configure` callable) learns about the
    connection it serves: whom, which connection, over what, from where."""

    principal: Principal
    connection_id: str
    transport: TransportKind
    remote_address: str | None = None


#: Why a credential no longer holds: "revoked" ends its connections, "expired" closes their
#: streams (a new credential of the same principal resumes them).
Ending = Literal["revoked", "expired"]


@dataclass(frozen=True, slots=True)
class Standing:
    """What stands of one credential: `ended` says why it no longer holds (None: it holds), and
    `expires_at` when it expires (seconds since the epoch; None: never, or not known).
    `credential`: the credential that now stands for it (an OAuth refresh replaced the token: the
    connection is rebound to it, and `expires_at` is the new one's), or None."""

    ended: Ending | None = None
    expires_at: float | None = None
    credential: str | None = None


REVOKED: Final = Standing("revoked")


def standing_of_expiry(expires_at: float | None, now: float) -> Standing:
    """A credential that is not revoked: expired once `expires_at` has come, else holding."""
    return Standing("expired" if expires_at is not None and expires_at <= now else None, expires_at)


#: What stands of each credential, by `credential_key`.
Standings = dict[CredentialKey, Standing]
