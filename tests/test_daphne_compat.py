"""acp_channels._daphne_compat pieces that can be checked without a server."""

from __future__ import annotations

import asyncio
import re

import pytest
from autobahn import util
from autobahn.websocket import protocol

from acp_channels import _daphne_compat as daphne_compat

ANSI = re.compile(r"\x1b\[[0-9;]*m")


class Peer:
    def sendData(self) -> None:  # autobahn's name
        pass


def test_autobahn_debug_values_become_plain_text_with_the_same_words() -> None:
    daphne_compat._install_plain_debug_values()
    assert protocol.hltype is daphne_compat.plain_type and protocol.hlval is daphne_compat.plain_value
    method = Peer().sendData
    assert protocol.hltype(method) == ANSI.sub("", util.hltype(method))
    for value in (5, "tcp4:127.0.0.1:5000", None):
        assert protocol.hlval(value) == ANSI.sub("", util.hlval(value))


async def test_a_send_autobahn_refuses_as_disconnected_waits_for_the_disconnect() -> None:
    """The client left and autobahn knows before daphne: the send neither fails (the consumer
    logged a traceback as if we had failed) nor returns as if delivered; it waits to be
    cancelled by the disconnect on its way."""
    from autobahn.exception import Disconnected

    async def refused_write() -> None:
        raise Disconnected("Attempt to send on a closed protocol")

    send = asyncio.ensure_future(daphne_compat.send_or_wait_when_gone(refused_write()))
    for _ in range(5):  # several turns of the loop: the write has failed by now
        await asyncio.sleep(0)
    assert not send.done()
    send.cancel()
    with pytest.raises(asyncio.CancelledError):
        await send


async def test_a_write_that_succeeds_returns_and_another_failure_is_raised() -> None:
    async def write() -> None:
        return None

    async def broken_write() -> None:
        raise RuntimeError("ours")

    await daphne_compat.send_or_wait_when_gone(write())
    with pytest.raises(RuntimeError, match="ours"):
        await daphne_compat.send_or_wait_when_gone(broken_write())
