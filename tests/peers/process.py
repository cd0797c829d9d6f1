"""Start a peer server process that prints `LISTENING <port>` once it accepts connections."""

from __future__ import annotations

import re
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

LISTENING = re.compile(r"LISTENING (\d+)")


@dataclass
class PeerServer:
    command: Sequence[str]
    cwd: Path
    env: dict[str, str] | None = None
    port: int = 0
    process: subprocess.Popen[str] | None = None
    output: list[str] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> PeerServer:
        self.process = subprocess.Popen(
            list(self.command),
            cwd=self.cwd,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        ready = threading.Event()
        threading.Thread(target=self._pump, args=(ready,), daemon=True).start()
        if not ready.wait(timeout) or not self.port:
            self.stop()
            raise RuntimeError(f"{self.command} did not start:\n" + "".join(self.output))
        return self

    def _pump(self, ready: threading.Event) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line)
            if not self.port and (match := LISTENING.search(line)):
                self.port = int(match.group(1))
                ready.set()
        ready.set()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
