"""One error tree (acp_channels/errors.py): every error a client can meet knows its HTTP status,
its WebSocket close code and its JSON-RPC error, and the cross-worker refusals map onto it."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from acp_channels import errors
from acp_channels.errors import AcpError, answer_kinds

#: One instance of every concrete error, built as the code raises it.
SAMPLES: dict[type[AcpError], AcpError] = {
    errors.HostUnreachable: errors.HostUnreachable("c1"),
    errors.StreamBusy: errors.StreamBusy(),
    errors.ReplayUnavailable: errors.ReplayUnavailable("gone", "t:1"),
    errors.SessionHeaderError: errors.SessionHeaderError("Acp-Session-Id header required"),
    errors.TooManyStreams: errors.TooManyStreams(64),
    errors.TooManyRequests: errors.TooManyRequests(3),
    errors.QuotaExceeded: errors.QuotaExceeded(32),
    errors.TooManyAttachments: errors.TooManyAttachments(8),
    errors.NoSuchSession: errors.NoSuchSession(),
    errors.Refused: errors.Refused.unauthenticated(),
    errors.ServerFull: errors.ServerFull("connections"),
    errors.ShuttingDown: errors.ShuttingDown(),
    errors.LayerUnavailable: errors.LayerUnavailable("redis down"),
    errors.AgentBusy: errors.AgentBusy("slow"),
    errors.WorkerBusy: errors.WorkerBusy("busy"),
    errors.AgentEnded: errors.AgentEnded("agent closed before initialize response"),
    errors.AgentNotStarted: errors.AgentNotStarted("c1"),
    errors.AgentClosed: errors.AgentClosed("agent closed"),
    errors.WorkerFailed: errors.WorkerFailed("submit", "internal error"),
}
ABSTRACT = {AcpError, errors.Unavailable, errors.ServerFault}


def test_the_tree_is_walked_whole() -> None:
    kinds = set(answer_kinds())
    assert {errors.WorkerBusy, errors.Refused, errors.AgentClosed} <= kinds  # a broken walk would pass below
    assert kinds - ABSTRACT == set(SAMPLES)


@pytest.mark.parametrize("kind", sorted(SAMPLES, key=lambda kind: kind.__name__), ids=lambda kind: kind.__name__)
def test_every_error_knows_its_three_answers(kind: type[AcpError]) -> None:
    error = SAMPLES[kind]
    assert 400 <= error.status < 600
    assert error.retry_after is None or error.retry_after > 0
    assert error.close_code in (1011, 1013) or 4400 <= error.close_code < 4500
    if error.status >= 500:
        assert error.close_code == (1013 if error.retry_after is not None else 1011)
    reply: dict[str, Any] = error.rpc_error(7)
    assert reply["jsonrpc"] == "2.0" and reply["id"] == 7
    assert isinstance(reply["error"]["code"], int) and reply["error"]["code"] < -32000 + 1
    assert isinstance(reply["error"]["message"], str)
    assert isinstance(error.text, str)


def test_capacity_is_try_again_later_and_faults_are_internal() -> None:
    assert SAMPLES[errors.ServerFull].close_code == 1013 and SAMPLES[errors.ServerFull].retry_after == 10
    assert SAMPLES[errors.QuotaExceeded].close_code == 1013
    assert SAMPLES[errors.AgentNotStarted].close_code == 1011
    assert SAMPLES[errors.TooManyStreams].close_code == 4429
    assert SAMPLES[errors.Refused].close_code == 4401


def test_texts_never_show_internals_where_they_are_fixed() -> None:
    assert SAMPLES[errors.HostUnreachable].text == ""  # a made-up id learns nothing
    assert "redis" not in SAMPLES[errors.LayerUnavailable].text
    assert SAMPLES[errors.WorkerFailed].text == "the connection's worker failed to handle submit"


def test_the_old_homes_still_export_the_errors() -> None:
    from acp_channels import _gateway as gateway
    from acp_channels import _host as host
    from acp_channels import _protocol as protocol
    from acp_channels import auth
    from acp_channels._agents import channel

    assert auth.Refused is errors.Refused and channel.AgentClosed is errors.AgentClosed
    assert protocol.SessionHeaderError is errors.SessionHeaderError and host.StreamBusy is errors.StreamBusy
    assert gateway.HostUnreachable is errors.HostUnreachable and gateway.WorkerFailed is errors.WorkerFailed


def test_no_exception_class_is_defined_outside_the_tree_for_clients() -> None:
    """The modules whose errors reach a client define none of their own any more."""
    from acp_channels import _gateway as gateway
    from acp_channels import _worker as worker
    from acp_channels import _worker_protocol as worker_protocol
    from acp_channels import auth
    from acp_channels._gateway import local, remote, serve
    from acp_channels._host import connection

    for module in (auth, worker, worker_protocol, gateway, local, remote, serve, connection):
        own = [
            name
            for name, value in vars(module).items()
            if inspect.isclass(value) and issubclass(value, Exception) and value.__module__ == module.__name__
        ]
        assert own in ([], ["MalformedMessage"]), (module.__name__, own)  # worker_protocol's own decode error
