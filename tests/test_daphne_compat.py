"""acp_channels.daphne_compat pieces that can be checked without a server."""

from __future__ import annotations

import re

from autobahn import util
from autobahn.websocket import protocol

from acp_channels import daphne_compat

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
