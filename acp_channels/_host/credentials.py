"""The credential sweep: connections whose credential no longer holds end within seconds.

A connection keeps the principal it was opened with, and the principal names what it
authenticated with (`Principal.credential`, never the secret). Every REVALIDATE_SECONDS each
process hosting connections asks the REVALIDATE check (`acp_channels._revalidate`) once about
the distinct principals of its live connections, and ends those it says are no longer valid
(reason "revoked", with the audit line every end gets). One question per sweep for the set, not
one per connection; each process asks about its own connections only, so every worker (and
runner) does this for what it hosts. A failing check is logged and changes nothing.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable, Iterable

from acp_channels._conf import acp_settings
from acp_channels._host.connection import ConnectionHost
from acp_channels._identity import ANONYMOUS, Principal

logger = logging.getLogger("acp_channels.host")

Key = tuple[str, str, str]


def key(principal: Principal) -> Key:
    """A principal with its credential (principals compare without it)."""
    return (principal.kind, principal.id, principal.credential)


class CredentialSweep:
    """The sweep of one process, over the connections `hosts()` returns."""

    def __init__(self, hosts: Callable[[], Iterable[ConnectionHost]]) -> None:
        self._hosts = hosts
        self._task: asyncio.Task[None] | None = None

    def ensure(self, principal: Principal) -> None:
        """Sweep while there are connections (a new one of `principal` just opened)."""
        interval = acp_settings.REVALIDATE_SECONDS
        loop = asyncio.get_running_loop()
        if principal == ANONYMOUS or interval is None:
            return
        if self._task is not None and not self._task.done() and self._task.get_loop() is loop:
            return
        # A context of its own: not the request's that opened the connection (its database
        # thread, asgiref's ThreadSensitiveContext, is gone once that request is answered).
        self._task = loop.create_task(self._run(), name="acp-credential-sweep", context=contextvars.Context())

    async def _run(self) -> None:
        while any(True for _ in self._hosts()):
            interval = acp_settings.REVALIDATE_SECONDS
            if interval is None:
                return
            # A poll, not a wait for an event: the credential store is another process's database.
            await asyncio.sleep(float(interval))
            try:
                await self.sweep()
            except Exception:  # a database that does not answer now: try again next time
                logger.exception("checking the credentials of live connections failed")

    async def sweep(self) -> int:
        """Ask once about the principals of the live connections; end those no longer valid.
        How many connections ended."""
        from acp_channels._revalidate import invalid_principals

        live = [host for host in self._hosts() if not host.ended.is_set() and host.principal != ANONYMOUS]
        distinct = list({key(host.principal): host.principal for host in live}.values())
        if not distinct:
            return 0
        invalid = {key(principal) for principal in await invalid_principals(distinct)}
        ended = 0
        for host in live:
            if key(host.principal) in invalid and not host.ended.is_set():
                logger.info(
                    "connection %s: the credential of %s no longer holds: ending it", host.connection_id, host.principal
                )
                await host.terminate("revoked")
                ended += 1
        return ended
