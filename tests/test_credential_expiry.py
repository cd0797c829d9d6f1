"""An expiring credential, in process (docs/authentication.md, expiry, refresh and revocation):
the principal carries its expiry across processes; a mailbox sends its reader away without
ending the stream, and a resume after it gets what came meanwhile; the credential sweep's
decisions (revoked ends the connection, expired closes its streams and leaves it alive, the
notice `_acp-channels/auth_expiring` once per credential) and its wake-up at a known expiry;
rebinding a connection to another credential of its principal; a ticket never outlives its
credential. Against daphne with django-oauth-toolkit and the built-in tokens:
tests/test_oauth_live.py and tests/test_tokens_live.py."""

from __future__ import annotations

import asyncio
import datetime
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from acp_channels import _protocol as protocol
from acp_channels import _tickets as tickets
from acp_channels import _worker_protocol as worker_protocol
from acp_channels._agents.factory import create_agent_channel
from acp_channels._checks import check_settings
from acp_channels._gateway.handles import owned_host
from acp_channels._gateway.local import LocalSocket
from acp_channels._host import ConnectionHost, Mailbox, OutboundBudget, StreamLease, registry
from acp_channels._host.credentials import CredentialSweep, notice_due, standing_now
from acp_channels._host.expiry import expiring_notice, rfc3339
from acp_channels._identity import REVOKED, Principal, Standing
from acp_channels._worker import new_connection_id
from acp_channels._worker_protocol import Terminate
from tests.test_worker_protocol import wire

SESSION = "s-1"


def ada(credential: str = "tok:1", expires_in: float | None = None) -> Principal:
    expires_at = None if expires_in is None else time.time() + expires_in
    return Principal("user", "7", "ada", credential, expires_at)


def everyone_revoked(principals: list[Principal]) -> list[Principal]:
    return principals


# -- the principal and the pure decisions ---------------------------------------------------------


def test_a_principal_carries_its_expiry_on_the_wire_and_compares_without_it() -> None:
    principal = Principal("user", "7", "ada", "tok:1", 1_900_000_000.25)
    assert principal.to_wire() == ["user", "7", "ada", "tok:1", "1900000000.25"]
    assert Principal.from_wire(principal.to_wire()).expires_at == 1_900_000_000.25
    assert Principal("oauth-client", "c", "c", "", 5.0).to_wire() == ["oauth-client", "c", "c", "", "5.0"]
    assert Principal("user", "7", "ada", "tok:1").to_wire() == ["user", "7", "ada", "tok:1"]  # as before
    assert principal == Principal("user", "7", "", "tok:2", None) and hash(principal) == hash(ada("tok:2"))
    for bad in (["user", "7", "", "tok:1", "soon"], ["user", "7", "", "tok:1", "inf"], ["a", "b", "c", "", "1", "2"]):
        with pytest.raises(ValueError):
            Principal.from_wire(bad)


def test_a_principal_keeps_its_credential_and_expiry_across_workers() -> None:
    """What a request on another worker than the host carries (and a runner gets with Open):
    the host rebinds the connection by it, and follows its expiry."""
    op = Terminate("c-1", Principal("user", "7", "ada", "oauth2_provider:12", 1_900_000_000.5))
    decoded = worker_protocol.decode_op(wire(worker_protocol.encode_op(op, "w-1", "acp.worker.w")))
    assert isinstance(decoded, Terminate)
    assert (decoded.principal.credential, decoded.principal.expires_at) == ("oauth2_provider:12", 1_900_000_000.5)


def test_what_stands_of_a_credential() -> None:
    now = 1000.0
    principal = Principal("user", "7", "ada", "tok:1", 1010.0)
    # Unknown to the check: its own expiry.
    assert standing_now(principal, None, now) == Standing(None, 1010.0)
    assert standing_now(principal, None, 1010.0) == Standing("expired", 1010.0)
    # The check's word wins: its store's expiry (changed there), a revocation.
    assert standing_now(principal, Standing(None, 1200.0), 1100.0) == Standing(None, 1200.0)
    assert standing_now(principal, Standing(None, 990.0), now) == Standing("expired", 990.0)
    assert standing_now(principal, REVOKED, now) == REVOKED
    assert standing_now(Principal("token", "team"), None, now) == Standing(None, None)  # never expires
    assert notice_due(1010.0, 60.0) == 950.0 and notice_due(1010.0, None) is None


def test_the_notice_says_when_in_rfc3339_and_nothing_else() -> None:
    moment = datetime.datetime(2026, 12, 5, 10, 0, 0, 700_000, tzinfo=datetime.UTC).timestamp()
    assert rfc3339(moment) == "2026-12-05T10:00:00Z"  # rounded down: the client refreshes early
    assert json.loads(expiring_notice(moment)) == {
        "jsonrpc": "2.0",
        "method": "_acp-channels/auth_expiring",
        "params": {"expiresAt": "2026-12-05T10:00:00Z"},
    }


# -- a mailbox sends its reader away ---------------------------------------------------------------


async def test_an_evicted_reader_ends_and_a_resume_gets_what_came_meanwhile() -> None:
    mailbox = Mailbox(OutboundBudget(1 << 20, None, 1 << 16), window_events=100, window_bytes=1 << 16)
    assert not mailbox.evict("expired")  # nobody reads: nothing to do
    lease = StreamLease(mailbox)
    mailbox.push("a")
    mailbox.push("b")
    taken = await lease.take(1.0)
    assert taken == ["a", "b"] and taken is not None and taken.first_seq == 1
    waiting = asyncio.create_task(lease.take(None))
    await asyncio.sleep(0)  # the reader waits for more
    assert mailbox.evict("expired")
    assert await asyncio.wait_for(waiting, 5) is None  # its stream ends
    assert lease.end_reason == "expired" and not mailbox.leased and not mailbox.closed
    mailbox.push("c")  # the agent goes on meanwhile
    resumed = StreamLease(mailbox, protocol.event_id(mailbox.tag, 1))  # the client got "a" only
    again = await resumed.take(1.0)
    assert again == ["b", "c"] and again is not None and again.first_seq == 2
    assert resumed.end_reason == "ended"  # a new reader was not sent away
    lease.release()  # the old reader's release changes nothing
    assert mailbox.leased


# -- the sweep, on hosts of this process ----------------------------------------------------------------


@pytest.fixture
def acp(settings: Any) -> dict[str, Any]:
    # No sweep of the registry's own unless a test asks (it calls its own sweep).
    values = {
        "AGENT": "tests.wire_agent.create",
        "REVALIDATE_SECONDS": None,
        "AUTH_EXPIRING_SECONDS": 60.0,
        "WEBSOCKET_RESUME_SECONDS": 30.0,
    }
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, **values}
    return values


@pytest.fixture
async def hosts(acp: dict[str, Any]) -> AsyncIterator[list[ConnectionHost]]:
    made: list[ConnectionHost] = []
    yield made
    for host in made:
        await host.terminate()
        for mailbox in host.mailboxes:  # a reader a test left holding goes, as a view's would:
            if mailbox.holder is not None:  # its bytes stay in the worker's budget until then
                mailbox.release(mailbox.holder)


def open_host(hosts: list[ConnectionHost], principal: Principal, transport: Any = "http") -> ConnectionHost:
    connection_id = new_connection_id()
    host = registry.create(
        create_agent_channel, transport, connection_id=connection_id, max_buffered_bytes=1 << 20, principal=principal
    )
    hosts.append(host)
    return host


async def messages(lease: StreamLease) -> list[dict[str, Any]]:
    taken = await lease.take(0.01)
    assert taken is not None
    return [json.loads(item) for item in taken]


async def test_the_notice_goes_once_per_credential_on_the_connection_stream(hosts: list[ConnectionHost]) -> None:
    host = open_host(hosts, ada(expires_in=30))
    stream = host.lease(protocol.CONNECTION_STREAM)
    sweep = CredentialSweep(lambda: [host])
    assert await sweep.sweep() == 0
    (notice,) = await messages(stream)
    assert notice["method"] == "_acp-channels/auth_expiring"
    assert notice["params"] == {"expiresAt": rfc3339(host.principal.expires_at or 0)}
    await sweep.sweep()
    assert await messages(stream) == []  # once
    # A refreshed credential of the same principal: its own notice when it comes near.
    refreshed = ada("tok:2", expires_in=40)
    assert owned_host(host.connection_id, refreshed) is host
    assert host.principal.credential == "tok:2" and host.principal.expires_at == refreshed.expires_at
    await sweep.sweep()
    told = [message["params"]["expiresAt"] for message in await messages(stream)]
    assert told == [rfc3339(refreshed.expires_at or 0)]
    # One that lives longer than AUTH_EXPIRING_SECONDS is told nothing yet.
    assert owned_host(host.connection_id, ada("tok:3", expires_in=3600)) is host
    await sweep.sweep()
    assert await messages(stream) == []
    assert not host.ended.is_set()


async def test_no_notice_when_turned_off(hosts: list[ConnectionHost], settings: Any, acp: dict[str, Any]) -> None:
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "AUTH_EXPIRING_SECONDS": None}
    host = open_host(hosts, ada(expires_in=5))
    stream = host.lease(protocol.CONNECTION_STREAM)
    await CredentialSweep(lambda: [host]).sweep()
    assert await messages(stream) == []


async def test_an_expired_credential_closes_the_streams_and_the_connection_lives(hosts: list[ConnectionHost]) -> None:
    host = open_host(hosts, ada(expires_in=-1))
    connection_stream = host.lease(protocol.CONNECTION_STREAM)
    session_stream = host.lease(SESSION)
    host.stream(SESSION).push('{"jsonrpc":"2.0","method":"x","params":{"n":1}}')
    assert len(await messages(session_stream)) == 1
    waiting = [asyncio.create_task(connection_stream.take(None)), asyncio.create_task(session_stream.take(None))]
    await asyncio.sleep(0)
    assert await CredentialSweep(lambda: [host]).sweep() == 0  # nothing ended
    assert await asyncio.wait_for(asyncio.gather(*waiting), 5) == [None, None]
    assert connection_stream.end_reason == session_stream.end_reason == "expired"
    assert not host.ended.is_set() and host.end_reason is None
    host.stream(SESSION).push('{"jsonrpc":"2.0","method":"x","params":{"n":2}}')  # the agent goes on
    # The expired credential may not take the streams back (the authenticator refuses it at the
    # edge); a new one of the same principal rebinds and resumes after the last event it got.
    assert owned_host(host.connection_id, ada("tok:2", expires_in=3600)) is host
    resumed = host.lease(SESSION, protocol.event_id(host.stream(SESSION).tag, 1))
    assert [message["params"]["n"] for message in await messages(resumed)] == [2]
    await CredentialSweep(lambda: [host]).sweep()  # the new credential holds: the reader stays
    assert host.stream(SESSION).leased and resumed.end_reason == "ended"


async def test_another_principal_neither_finds_nor_rebinds_the_connection(hosts: list[ConnectionHost]) -> None:
    host = open_host(hosts, ada(expires_in=-1))
    assert owned_host(host.connection_id, Principal("user", "8", "bob", "tok:9", time.time() + 3600)) is None
    assert host.principal.credential == "tok:1"


async def test_a_revoked_credential_ends_the_connection(
    hosts: list[ConnectionHost], settings: Any, acp: dict[str, Any]
) -> None:
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "REVALIDATE": f"{__name__}.everyone_revoked"}
    host = open_host(hosts, ada(expires_in=-1))  # expired too: revoked wins
    assert await CredentialSweep(lambda: [host]).sweep() == 1
    assert host.ended.is_set() and host.end_reason == "revoked"


async def test_an_expired_websocket_closes_its_socket_and_its_grace_period_runs(hosts: list[ConnectionHost]) -> None:
    host = open_host(hosts, ada(expires_in=-1), "websocket")
    host.start()
    socket = LocalSocket.first(host)
    waiting = asyncio.create_task(socket.take(None))
    await asyncio.sleep(0)
    await CredentialSweep(lambda: [host]).sweep()
    assert await asyncio.wait_for(waiting, 5) is None
    assert socket.end_reason == "expired"  # the consumer closes with 4401
    assert not host.ended.is_set() and not host.socket_outbox.leased
    # A reattach with a new credential (the grace period stops).
    assert owned_host(host.connection_id, ada("tok:2", expires_in=3600)) is host
    again = LocalSocket(host)
    host.attach_socket(0, again)
    assert host.holds_socket(again)


async def test_the_sweep_wakes_at_a_known_expiry(hosts: list[ConnectionHost], settings: Any) -> None:
    """REVALIDATE_SECONDS is long; the streams still close at the expiry the principal names."""
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "REVALIDATE_SECONDS": 3600.0, "AUTH_EXPIRING_SECONDS": None}
    host = open_host(hosts, ada(expires_in=0.3))
    stream = host.lease(protocol.CONNECTION_STREAM)
    started = time.monotonic()
    assert await asyncio.wait_for(stream.take(None), 10) is None
    assert stream.end_reason == "expired" and time.monotonic() - started < 5
    assert not host.ended.is_set()


async def test_a_short_lived_credential_is_told_at_once(hosts: list[ConnectionHost], settings: Any) -> None:
    """It lives less than AUTH_EXPIRING_SECONDS: the notice goes when the connection opens, not
    at the next poll (REVALIDATE_SECONDS is long here)."""
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "REVALIDATE_SECONDS": 3600.0}
    host = open_host(hosts, ada(expires_in=30))
    stream = host.lease(protocol.CONNECTION_STREAM)
    taken = await asyncio.wait_for(stream.take(None), 10)
    assert taken is not None and json.loads(taken[0])["method"] == "_acp-channels/auth_expiring"


# -- tickets ---------------------------------------------------------------------------------------------


def test_a_ticket_never_outlives_its_credential(acp: dict[str, Any]) -> None:
    short = ada(expires_in=5)
    ticket, expires = tickets.issue_sync(short, None)
    assert expires == short.expires_at
    taken = tickets.take_sync(ticket, None)
    assert taken is not None and taken.principal.expires_at == short.expires_at
    _, expires = tickets.issue_sync(ada(expires_in=3600), None)
    assert expires <= time.time() + tickets.lifetime()


# -- the setting ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "ids"), [(60.0, []), (5, []), (None, []), (0, ["acp_channels.E062"]), ("60", ["acp_channels.E062"])]
)
def test_auth_expiring_seconds_is_a_positive_number_or_none(settings: Any, value: Any, ids: list[str]) -> None:
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "AUTH_EXPIRING_SECONDS": value}
    assert [message.id for message in check_settings()] == ids
