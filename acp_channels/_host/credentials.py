"""The credential sweep: what happens to live connections whose credential no longer holds.

A connection keeps the principal it was opened with (or was rebound to by a later request with
another credential of the same principal), and the principal names what it authenticated with
(`Principal.credential`, never the secret) and when that expires, if known
(`Principal.expires_at`). Every REVALIDATE_SECONDS each process hosting connections asks the
REVALIDATE check (`acp_channels._revalidate`) once what stands of the distinct credentials of
its live connections, and for each connection:

- revoked: ends it (reason "revoked", with the audit line every end gets);
- expired: closes its physical streams (`acp_channels._host.expiry`; SSE readers end, the
  socket closes with 4401) and leaves it alive, for a new credential of the same principal to resume;
- expiring within AUTH_EXPIRING_SECONDS: tells the client once per credential
  (`_acp-channels/auth_expiring`).

Besides the interval, the sweep runs when a notice or an expiry it knows of is due, so neither
waits for the next poll. One question per sweep for the set, not one per connection; each
process asks about its own connections only, so every worker (and runner) does this for what it
hosts. A failing check is logged and changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import logging
import time
from collections.abc import Callable, Iterable
from typing import Final

from acp_channels._conf import acp_settings
from acp_channels._handoff import LazyEvent
from acp_channels._host.connection import ConnectionHost
from acp_channels._host.expiry import close_streams, send_expiring_notice
from acp_channels._identity import ANONYMOUS, CredentialKey, Principal, Standing, credential_key, standing_of_expiry

logger = logging.getLogger("acp_channels.host")

Key = CredentialKey
key = credential_key
#: A sweep for an expiry runs this long after it, so the credential's store agrees it has come.
AFTER_EXPIRY: Final = 0.05


def standing_now(principal: Principal, standing: Standing | None, now: float) -> Standing:
    """What stands of `principal`'s credential at `now`: the check's word (`standing`, with the
    expiry its store says), or for a credential the check does not know, the principal's own
    expiry; either way expired once its expiry has come."""
    if standing is None:
        return standing_of_expiry(principal.expires_at, now)
    if standing.ended is None:
        return dataclasses.replace(standing_of_expiry(standing.expires_at, now), credential=standing.credential)
    return standing


def notice_due(expires_at: float, window: float | None) -> float | None:
    """When the notice of a credential expiring at `expires_at` is due (None: no notice)."""
    return None if window is None else expires_at - window


class CredentialSweep:
    """The sweep of one process, over the connections `hosts()` returns."""

    def __init__(self, hosts: Callable[[], Iterable[ConnectionHost]]) -> None:
        self._hosts = hosts
        self._task: asyncio.Task[None] | None = None
        #: When (seconds since the epoch) the next notice or expiry known is due, if any.
        self._due: float | None = None
        self._wake = LazyEvent()
        #: The credentials each connection was told about (notices are once per credential),
        #: and those whose expiry closed its streams (said once in the log).
        self._told: dict[str, set[Key]] = {}
        self._closed: dict[str, set[Key]] = {}

    def ensure(self, principal: Principal) -> None:
        """Sweep while there are connections (one of `principal` just opened, or was rebound
        to it): by the time its credential's notice or expiry is due, too."""
        interval = acp_settings.REVALIDATE_SECONDS
        loop = asyncio.get_running_loop()
        if principal == ANONYMOUS or interval is None:
            return
        if principal.expires_at is not None:  # its notice (now, if it is due), else its expiry
            notice = notice_due(principal.expires_at, acp_settings.AUTH_EXPIRING_SECONDS)
            self._due_at(principal.expires_at + AFTER_EXPIRY if notice is None else max(notice, time.time()))
        if self._task is not None and not self._task.done() and self._task.get_loop() is loop:
            return
        # A context of its own: not the request's that opened the connection (its database
        # thread, asgiref's ThreadSensitiveContext, is gone once that request is answered).
        self._task = loop.create_task(self._run(), name="acp-credential-sweep", context=contextvars.Context())

    def _due_at(self, moment: float) -> None:
        if self._due is None or moment < self._due:
            self._due = moment
            self._wake.set()

    async def _run(self) -> None:
        while any(True for _ in self._hosts()):
            interval = acp_settings.REVALIDATE_SECONDS
            if interval is None:
                return
            # A poll, not a wait for an event: the credential store is another process's database.
            await self._pause(float(interval))
            try:
                await self.sweep()
            except Exception:  # a database that does not answer now: try again next time
                logger.exception("checking the credentials of live connections failed")

    async def _pause(self, interval: float) -> None:
        """Until the interval is over, or a notice or an expiry is due before."""
        until = time.time() + interval
        while (left := min(until, self._due if self._due is not None else until) - time.time()) > 0:
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self._wake.wait()

    async def sweep(self) -> int:
        """Ask once about the credentials of the live connections; end those revoked, close the
        streams of those expired, tell those expiring. How many connections ended."""
        from acp_channels._revalidate import credential_standings

        live = [host for host in self._hosts() if not host.ended.is_set() and host.principal != ANONYMOUS]
        self._forget_gone({host.connection_id for host in live})
        distinct = list({key(host.principal): host.principal for host in live}.values())
        self._due = None  # what comes due from now on (a connection opening meanwhile says so)
        if not distinct:
            return 0
        standings = await credential_standings(distinct)
        now = time.time()
        ended = 0
        for host in live:
            # The principal as it is now: a request may have rebound it while the check ran (to
            # a credential not asked about: its own expiry is what is known of it).
            principal = host.principal
            if host.ended.is_set():
                continue
            standing = standing_now(principal, standings.get(key(principal)), now)
            if standing.credential is not None and standing.ended != "revoked":
                # A refresh at the authorization server replaced the token (and deleted the old
                # one): the connection goes on with the new one, as a request with it would do.
                principal = dataclasses.replace(
                    principal, credential=standing.credential, expires_at=standing.expires_at
                )
                host.principal = principal
                logger.info("connection %s: the credential of %s was refreshed: rebound", host.connection_id, principal)
            if standing.ended == "revoked":
                logger.info("connection %s: the credential of %s was revoked: ending it", host.connection_id, principal)
                await host.terminate("revoked")
                ended += 1
            elif standing.ended == "expired":
                self._close_streams(host, principal)
            elif standing.expires_at is not None:
                self._tell(host, principal, standing.expires_at, now)
        return ended

    def _close_streams(self, host: ConnectionHost, principal: Principal) -> None:
        """Every sweep while the credential stays expired (a reader has no way back with it)."""
        readers = close_streams(host)
        closed = self._closed.setdefault(host.connection_id, set())
        if key(principal) not in closed:
            closed.add(key(principal))
            logger.info(
                "connection %s: the credential of %s expired: %d streams closed; the connection lives on for a"
                " new credential of the same principal",
                host.connection_id,
                principal,
                readers,
            )

    def _tell(self, host: ConnectionHost, principal: Principal, expires_at: float, now: float) -> None:
        """The notice once it is due (once per credential), and when the sweep must run next."""
        notice = notice_due(expires_at, acp_settings.AUTH_EXPIRING_SECONDS)
        told = self._told.setdefault(host.connection_id, set())
        if notice is not None and key(principal) not in told:
            if notice > now:
                self._due_at(notice)
                return
            told.add(key(principal))
            send_expiring_notice(host, expires_at)
            logger.debug("connection %s: told that the credential of %s expires soon", host.connection_id, principal)
        self._due_at(expires_at + AFTER_EXPIRY)

    def _forget_gone(self, live: set[str]) -> None:
        for memory in (self._told, self._closed):
            for connection_id in [connection_id for connection_id in memory if connection_id not in live]:
                del memory[connection_id]
