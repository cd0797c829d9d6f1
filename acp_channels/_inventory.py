"""What a worker can say about the connections it hosts, as plain values.

`local_connections()` describes this process's connections; the cross-worker protocol carries
the same `ConnectionInfo` between workers (`to_wire`/`from_wire`) so a management command can
list every connection of the cluster (`manage.py acp_connections`).
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass
from typing import Any

from acp_channels._identity import ANONYMOUS, Principal, TransportKind


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """One session of a connection, as its host saw it on the wire (acp_channels._host.sessions)."""

    session_id: str
    #: Wall-clock seconds (Unix time) of its first and its last message.
    created: float
    last_activity: float
    #: A `session/prompt` the agent has not answered.
    turn_running: bool
    #: `session/request_permission` requests the client has not answered.
    pending_permissions: int

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_wire(cls, value: dict[str, Any]) -> SessionInfo:
        return cls(
            session_id=str(value["session_id"]),
            created=float(value["created"]),
            last_activity=float(value["last_activity"]),
            turn_running=bool(value["turn_running"]),
            pending_permissions=int(value["pending_permissions"]),
        )


@dataclass(frozen=True, slots=True)
class ConnectionInfo:
    """One live connection, as its host's worker sees it now."""

    connection_id: str
    #: The id of the worker process hosting it (also the connection id's suffix).
    worker: str
    #: `str(Principal)`: "anonymous", "user:alice", "token:ci" (display names, for people).
    principal: str
    transport: TransportKind
    #: Session streams the connection holds now (HTTP); a WebSocket carries every session on
    #: its one socket, so 0 there.
    sessions: int
    age_seconds: float
    #: Seconds without a POST and without a reader (0 while a reader or a socket is attached).
    idle_seconds: float
    #: Undelivered output held for the connection's readers.
    buffered_bytes: int
    #: The agent's process id when it runs as a process of its own (stdio agents), else None.
    agent_pid: int | None
    #: Who owns it (compared by kind and id; `principal` is for people).
    owner: Principal = ANONYMOUS
    #: The agent's name from its initialize result (`agentInfo.name`), if it gave one.
    agent: str | None = None
    #: Readers attached now: the socket, or each SSE stream's reader.
    attachments: int = 0
    #: Its sessions, the most recently active last.
    activity: tuple[SessionInfo, ...] = ()
    #: An attachment (another client of a session): the connection whose session it carries.
    attached_to: str | None = None

    def to_wire(self) -> dict[str, Any]:
        wire = asdict(self)
        wire["owner"] = self.owner.to_wire()
        wire["activity"] = [session.to_wire() for session in self.activity]
        return wire

    @classmethod
    def from_wire(cls, value: dict[str, Any]) -> ConnectionInfo:
        return cls(
            connection_id=str(value["connection_id"]),
            worker=str(value["worker"]),
            principal=str(value["principal"]),
            transport="websocket" if value["transport"] == "websocket" else "http",
            sessions=int(value["sessions"]),
            age_seconds=float(value["age_seconds"]),
            idle_seconds=float(value["idle_seconds"]),
            buffered_bytes=int(value["buffered_bytes"]),
            agent_pid=None if value.get("agent_pid") is None else int(value["agent_pid"]),
            owner=Principal.from_wire(value["owner"]) if "owner" in value else ANONYMOUS,
            agent=None if value.get("agent") is None else str(value["agent"]),
            attachments=int(value.get("attachments", 0)),
            activity=tuple(SessionInfo.from_wire(session) for session in value.get("activity", ())),
            attached_to=None if value.get("attached_to") is None else str(value["attached_to"]),
        )


def local_connections(owner: Principal | None = None) -> list[ConnectionInfo]:
    """The connections this process hosts (only `owner`'s, if given), oldest first (needs the
    running event loop)."""
    from acp_channels._host import registry

    now = asyncio.get_running_loop().time()
    infos = [
        ConnectionInfo(
            connection_id=host.connection_id,
            # The id's suffix (not worker.WORKER_ID: the cross-worker protocol imports this module).
            worker=host.connection_id.rpartition(".")[2],
            principal=str(host.principal),
            transport=host.transport,
            sessions=host.session_streams,
            age_seconds=round(now - host.opened_at, 3),
            idle_seconds=round(host.idle_since(now), 3),
            buffered_bytes=host.buffered_bytes,
            agent_pid=getattr(host.agent, "pid", None),
            owner=host.principal,
            agent=host.sessions.agent,
            attachments=host.attachments,
            activity=tuple(
                SessionInfo(
                    session.session_id,
                    round(session.created, 3),
                    round(session.last_activity, 3),
                    session.turn_running,
                    len(session.permissions),
                )
                for session in host.sessions
            ),
            attached_to=host.attached_to,
        )
        for host in registry
        if owner is None or host.principal == owner
    ]
    return sorted(infos, key=lambda info: -info.age_seconds)
