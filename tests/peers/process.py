"""Start a peer server process that prints `LISTENING <port>` once it accepts connections."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from tests.live import ROOT, ServerProcess

LISTENING = re.compile(r"LISTENING (\d+)")


@dataclass
class PeerServer(ServerProcess):
    argv: Sequence[str] = ()
    cwd: Path = ROOT
    env: dict[str, str] | None = None
    listening: ClassVar[re.Pattern[str]] = LISTENING

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> tuple[list[str], Path, dict[str, str] | None]:
        return list(self.argv), self.cwd, self.env
