"""Daphne processes started by forking a process that has already imported daphne's stack.

A daphne start costs about 0.8 s of CPU (1.3 s with an SDK agent), nearly all of it importing
Twisted, autobahn, Django and channels; the suite starts a few hundred. `python -m
tests.forkserver` imports those once (never daphne.server: it installs Twisted's reactor and
makes an event loop, whose epoll a fork would share) and then forks one child per request. The
child takes the request's argv, working directory, environment and standard streams, and runs
`python -m daphne` exactly as the command line would (`runpy`, `__main__`), so that everything
from daphne's CLI on is the code users run; it ends through the interpreter's normal exit.

`Forked` is the test side's handle on such a child, with the parts of `subprocess.Popen` the
suite uses (pid, stdout/stderr, poll, wait, send_signal, terminate, kill, returncode). The
forkserver reaps its children and reports each exit status. `spawn()` starts the forkserver
for this test process on first use.

Tests about how a server starts (startup checks, imports, the quickstart, the installed wheel)
run the real command instead: `DaphneServer(exec=True)`, or `ACP_TEST_FORK=0` for all.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent

#: What the forkserver imports once: daphne's stack short of daphne.server, Django's request
#: path, channels, the official `acp` SDK (its schema is most of an SDK agent's start), and what
#: demo_project's settings and asgi import.
PRELOAD = (
    "asyncio", "concurrent.futures", "twisted.internet.asyncioreactor", "twisted.internet.tcp",
    "twisted.internet.ssl", "twisted.internet.endpoints", "twisted.web.http", "twisted.logger",
    "autobahn.twisted.websocket", "autobahn.websocket.compress", "OpenSSL.SSL", "cryptography.x509",
    "django.http", "django.urls", "django.db.models", "django.core.handlers.asgi",
    "django.core.management", "django.contrib.sessions.middleware",
    "django.contrib.staticfiles.handlers", "django.views.generic", "django.template.backends.django",
    "channels.routing", "channels.auth", "channels.generic.websocket", "channels.layers",
    "asgiref.sync", "httpx", "msgpack", "redis.asyncio", "acp", "acp.agent.connection", "acp.helpers",
    "acp.interfaces", "acp.schema",
)  # fmt: skip

_MAX_REQUEST = 1 << 20


# -- the forkserver process ------------------------------------------------------------------


def _preload() -> None:
    import importlib

    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


def _serve(control: socket.socket) -> dict[str, Any]:
    """Fork a child per request until the test process goes away; returns only in a child, with
    its request (the caller runs it)."""
    wakeup_read, wakeup_write = os.pipe()
    os.set_blocking(wakeup_write, False)
    signal.set_wakeup_fd(wakeup_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that the wakeup fd is written
    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ)
    selector.register(wakeup_read, selectors.EVENT_READ)
    while True:
        for key, _ in selector.select():
            if key.fileobj is control:
                try:
                    message, fds, _, _ = socket.recv_fds(control, _MAX_REQUEST, 3)
                except OSError:
                    message, fds = b"", []
                if not message:  # the test process closed its end
                    raise SystemExit(0)
                request = json.loads(message)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    os.close(wakeup_read)
                    os.close(wakeup_write)
                    control.close()
                    for target, fd in enumerate(fds):
                        os.dup2(fd, target)
                        os.close(fd)
                    return request
                for fd in fds:
                    os.close(fd)
                control.send(json.dumps({"started": pid}).encode())
            else:
                with contextlib.suppress(BlockingIOError):
                    os.read(wakeup_read, 4096)
                _report_exits(control)


def _report_exits(control: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        control.send(json.dumps({"exited": pid, "returncode": os.waitstatus_to_exitcode(status)}).encode())


def _run_child(request: dict[str, Any]) -> None:
    import runpy

    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    time.tzset()  # the C library read TZ when the forkserver started
    module, *arguments = request["module_argv"]
    sys.argv = [module, *arguments]  # runpy puts the module's path in argv[0], as `-m` does
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def main() -> None:
    control = socket.socket(fileno=int(sys.argv[1]))
    _preload()
    request = _serve(control)
    _run_child(request)


# -- the test process's side -------------------------------------------------------------------


class Forked:
    """A forked child, handled like a `subprocess.Popen`."""

    def __init__(self, pid: int, stdout: IO[str] | None, stderr: IO[str] | None) -> None:
        self.pid = pid
        self.stdout = stdout
        self.stderr = stderr
        self.stdin = None
        self.returncode: int | None = None
        self._exited = threading.Event()

    def _set_exited(self, returncode: int) -> None:
        self.returncode = returncode
        self._exited.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(f"forked {self.pid}", timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """This test process's forkserver and the thread that reads what it says."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "demo_project.settings"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.forkserver", str(theirs.fileno())],
            cwd=ROOT, env=env, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
        )  # fmt: skip
        theirs.close()
        self.control = ours
        self.lock = threading.Lock()
        self.children: dict[int, Forked] = {}
        self.exits: dict[int, int] = {}  # exits reported before the child's handle was made
        self.started: list[int] = []
        self.replied = threading.Condition()
        threading.Thread(target=self._read, daemon=True, name="forkserver").start()

    def _read(self) -> None:
        while True:
            try:
                message = self.control.recv(65536)
            except OSError:
                message = b""
            if not message:
                self._orphaned()
                return
            reply = json.loads(message)
            with self.replied:
                if "started" in reply:
                    self.started.append(reply["started"])
                    self.replied.notify_all()
                elif (child := self.children.pop(reply["exited"], None)) is not None:
                    child._set_exited(reply["returncode"])
                else:
                    self.exits[reply["exited"]] = reply["returncode"]

    def _orphaned(self) -> None:
        """The forkserver is gone, and nobody will report its children's exits: end them, so that
        no test waits for them forever."""
        with self.replied:
            self.replied.notify_all()
            for pid, child in self.children.items():
                with contextlib.suppress(ProcessLookupError):
                    ended = os.pidfd_open(pid)
                    os.kill(pid, signal.SIGKILL)
                    select.select([ended], [], [], 10)  # readable once it has ended
                    os.close(ended)
                child._set_exited(-signal.SIGKILL)
            self.children.clear()

    def spawn(self, module_argv: Sequence[str], cwd: Path, env: dict[str, str]) -> Forked:
        """Fork a child running `python -m <module_argv>` with stdin and stdout on /dev/null and
        stderr coming back as a text pipe (how DaphneServer runs daphne)."""
        err_read, err_write = os.pipe()
        null = os.open(os.devnull, os.O_RDWR)
        request = json.dumps({"module_argv": list(module_argv), "cwd": str(cwd), "env": env}).encode()
        try:
            with self.lock:
                socket.send_fds(self.control, [request], [null, null, err_write])
                with self.replied:
                    answered = self.replied.wait_for(lambda: self.started or self.process.poll() is not None, 30)
                    if not answered or not self.started:
                        os.close(err_read)
                        raise RuntimeError(f"the forkserver did not answer (exit status {self.process.poll()})")
                    pid = self.started.pop()
                    child = Forked(pid, None, open(err_read, encoding="utf-8", errors="replace"))
                    if pid in self.exits:
                        child._set_exited(self.exits.pop(pid))
                    else:
                        self.children[pid] = child
                    return child
        finally:
            os.close(null)
            os.close(err_write)


_forkserver: ForkServer | None = None
_forkserver_lock = threading.Lock()


def children_cpu() -> float:
    """CPU seconds of the children this test process's forkserver has reaped so far (0 before it
    starts): what its servers cost, for ACP_TEST_CPU_LOG."""
    if _forkserver is None:
        return 0.0
    try:
        fields = Path(f"/proc/{_forkserver.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def enabled() -> bool:
    return os.environ.get("ACP_TEST_FORK", "1") != "0"


def forkserver() -> ForkServer:
    global _forkserver
    with _forkserver_lock:
        if _forkserver is None or _forkserver.process.poll() is not None:
            _forkserver = ForkServer()
        return _forkserver


def probe() -> None:
    """`python -m tests.forkserver --probe`, forked by the suite's own tests: what a child sees."""
    seen = {
        "argv": sys.argv[1:], "cwd": os.getcwd(), "probe": os.environ.get("PROBE"), "zone": time.strftime("%z"),
        "stdin": sys.stdin.read(), "parent": os.getppid(),
    }  # fmt: skip
    print("not for the log")
    print(json.dumps(seen), file=sys.stderr)
    raise SystemExit(3)


if __name__ == "__main__":
    probe() if sys.argv[1:2] == ["--probe"] else main()
