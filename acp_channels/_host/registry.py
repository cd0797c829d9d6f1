"""The connections hosted by this process, by id: caps, the summed budget, the idle reaper."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator, Mapping

from acp_channels._agents.channel import AgentChannel
from acp_channels._conf import acp_settings
from acp_channels._host.attachments import expire_permissions
from acp_channels._host.budget import WorkerBudget
from acp_channels._host.connection import ConnectionHost
from acp_channels._host.credentials import CredentialSweep
from acp_channels._host.detached import detached_seconds, kept_detached
from acp_channels._identity import ANONYMOUS, AgentContext, Principal, TransportKind
from acp_channels.errors import DETACHED_QUOTA, QuotaExceeded, ServerFull

logger = logging.getLogger("acp_channels.host")
#: One line when a connection opens and one when it ends (who, which, over what, from where,
#: how long, why). Principals only: credentials never reach this far.
audit_logger = logging.getLogger("acp_channels.audit")


class Registry:
    """The connections hosted by this process, by id, and their summed output budget."""

    def __init__(self) -> None:
        self._hosts: dict[str, ConnectionHost] = {}
        #: Connections per principal (ANONYMOUS not counted: MAX_CONNECTIONS bounds it).
        self._per_principal: dict[Principal, int] = {}
        self._reaper: asyncio.Task[None] | None = None
        self.budget = WorkerBudget(lambda: acp_settings.MAX_WORKER_BUFFERED_BYTES)
        self._empty_waiters: list[asyncio.Future[None]] = []
        #: Ends the connections whose credential is revoked, closes the streams of those whose
        #: credential expired, tells those about to (REVALIDATE_SECONDS, AUTH_EXPIRING_SECONDS).
        self.credentials = CredentialSweep(self.__iter__)

    def __len__(self) -> int:
        return len(self._hosts)

    def __iter__(self) -> Iterator[ConnectionHost]:
        return iter(list(self._hosts.values()))

    def get(self, connection_id: str) -> ConnectionHost | None:
        return self._hosts.get(connection_id)

    def create(
        self,
        agent_factory: Callable[[AgentContext], AgentChannel],
        transport: TransportKind,
        *,
        connection_id: str,
        max_buffered_bytes: int,
        principal: Principal = ANONYMOUS,
        remote_address: str | None = None,
        max_message_bytes: int | None = None,
        attached_to: str | None = None,
    ) -> ConnectionHost:
        """A new connection `connection_id` owned by `principal`, with a new agent (the factory
        gets the connection's AgentContext: whom it serves, the connection id, transport,
        address). The caller issues the id and makes this worker reachable (gateway).

        QuotaExceeded when the principal holds MAX_CONNECTIONS_PER_PRINCIPAL here already;
        ServerFull when this worker hosts MAX_CONNECTIONS, or holds its whole output budget.
        """
        per_principal = acp_settings.MAX_CONNECTIONS_PER_PRINCIPAL
        if (
            principal != ANONYMOUS
            and per_principal is not None
            and self._per_principal.get(principal, 0) >= per_principal
        ):
            raise QuotaExceeded(per_principal)
        if (full := self.full()) is not None:
            raise full
        if attached_to is None and principal != ANONYMOUS and (detached := self._detached_quota(principal)) is not None:
            raise detached
        context = AgentContext(principal, connection_id, transport, remote_address)
        host = ConnectionHost(
            connection_id,
            agent_factory(context),
            transport,
            max_buffered_bytes=max_buffered_bytes,
            max_message_bytes=max_message_bytes,
            on_end=self._forget,
            worker_budget=self.budget,
            principal=principal,
            remote_address=remote_address,
        )
        host.attached_to = attached_to
        self._hosts[connection_id] = host
        if principal != ANONYMOUS:
            self._per_principal[principal] = self._per_principal.get(principal, 0) + 1
        audit_logger.info(
            "connection opened principal=%s connection=%s transport=%s remote=%s",
            principal,
            connection_id,
            transport,
            remote_address or "-",
        )
        self._ensure_reaper()
        self.credentials.ensure(principal)
        return host

    def _detached_quota(self, principal: Principal) -> QuotaExceeded | None:
        """The principal holds MAX_DETACHED_PER_PRINCIPAL connections only DETACHED_SECONDS keeps."""
        limit = acp_settings.MAX_DETACHED_PER_PRINCIPAL
        if limit is None or not acp_settings.DETACHED_SECONDS:
            return None
        now = asyncio.get_running_loop().time()
        detached = sum(1 for host in self._hosts.values() if host.principal == principal and kept_detached(host, now))
        return QuotaExceeded(limit, DETACHED_QUOTA) if detached >= limit else None

    def full(self) -> ServerFull | None:
        """Why this worker takes no new connection now (MAX_CONNECTIONS, or its whole output
        budget held), or None: what initialize and /ready both answer."""
        max_connections = acp_settings.MAX_CONNECTIONS
        if max_connections is not None and len(self._hosts) >= max_connections:
            return ServerFull("connections")
        max_stdio = acp_settings.MAX_STDIO_AGENTS
        if max_stdio is not None and self.stdio_agents() >= max_stdio:
            return ServerFull("stdio")
        if self.budget.full():
            return ServerFull("budget")
        return None

    def stdio_agents(self) -> int:
        """Connections whose agent is a process of its own (the AGENT setting is a command)."""
        return len(self._hosts) if isinstance(acp_settings.AGENT, Mapping) else 0

    def connections_of(self, principal: Principal) -> int:
        """Connections `principal` holds on this worker (0 for ANONYMOUS: not counted)."""
        return self._per_principal.get(principal, 0)

    def _ensure_reaper(self) -> None:
        timeout = acp_settings.IDLE_TIMEOUT_SECONDS
        loop = asyncio.get_running_loop()
        if timeout is None or (
            self._reaper is not None and not self._reaper.done() and self._reaper.get_loop() is loop
        ):
            return
        self._reaper = loop.create_task(self._reap(float(timeout)), name="acp-idle-reaper")

    async def _reap(self, timeout: float) -> None:
        """End connections nobody uses: no POST and no stream reader for `timeout` seconds
        (a client that vanished without DELETE would otherwise keep its agent, and the output
        its agent went on producing, up to its budget, forever)."""
        loop = asyncio.get_running_loop()
        while self._hosts:
            # A sweep interval, not a wait for an event: ended within timeout + 30 s at most.
            await asyncio.sleep(sweep_interval(min(timeout, acp_settings.PERMISSION_TIMEOUT_SECONDS)))
            now = loop.time()
            for host in list(self._hosts.values()):
                limit = detached_seconds(host, timeout)
                try:
                    if host.idle_since(now) > limit:
                        logger.info("connection %s idle for %.0f s: ending it", host.connection_id, limit)
                        await host.terminate("idle")
                    else:
                        await expire_permissions(host, now)
                except Exception:  # one failing agent must not stop the sweeps for the others
                    logger.exception("sweeping connection %s failed", host.connection_id)

    def _forget(self, host: ConnectionHost) -> None:
        if self._hosts.get(host.connection_id) is not host:
            return
        del self._hosts[host.connection_id]
        if not self._hosts:
            for waiter in self._empty_waiters:
                if not waiter.done():
                    waiter.set_result(None)
            self._empty_waiters.clear()
        if host.principal in self._per_principal:
            left = self._per_principal[host.principal] - 1
            if left:
                self._per_principal[host.principal] = left
            else:
                del self._per_principal[host.principal]
        audit_logger.info(
            "connection ended principal=%s connection=%s transport=%s remote=%s duration=%.3fs reason=%s",
            host.principal,
            host.connection_id,
            host.transport,
            host.remote_address or "-",
            asyncio.get_running_loop().time() - host.opened_at,
            host.end_reason,
        )

    async def wait_empty(self) -> None:
        """Return once this process hosts no connection (a draining runner)."""
        if self._hosts:
            waiter = asyncio.get_running_loop().create_future()
            self._empty_waiters.append(waiter)
            await waiter

    async def terminate_all(self) -> None:
        for host in list(self._hosts.values()):
            await host.terminate("shutdown")


def sweep_interval(idle_timeout: float) -> float:
    """How often the reaper looks: often enough that an idle connection outlives its timeout by
    at most half of it, and by at most 30 s."""
    return min(idle_timeout / 2, 30.0)


registry = Registry()
