"""Python processes (daphne, and the suite's Python clients) started by forking a process that has
already imported their libraries.

A daphne start costs about 0.8 s of CPU (1.3 s with an SDK agent), nearly all of it importing
Twisted, autobahn, Django and channels; a client (`acp-client`, `acp-bridge`, the official SDK's
client scripts, `manage.py`) 0.5-0.8 s, importing the `acp` SDK, httpx and the terminal's
libraries; the suite starts a few hundred of each. `python -m tests.forkserver` imports those once
(never daphne.server: it installs Twisted's reactor and makes an event loop, whose epoll a fork
would share; nothing that starts a thread, opens a socket or reads settings; none of our own
package, whose code each child imports itself) and then forks one child per request. The child
takes the request's argv, working directory, environment and standard streams (optionally a
pseudo-terminal as its controlling terminal, in a session of its own), rebuilds `sys.path` and
`sys.stdin`/`stdout`/`stderr` as the interpreter would have for that environment and those
streams, and runs `python -m MODULE` or `python SCRIPT` exactly as the command line would
(`runpy`, `__main__`), so that everything from the program's command line on is the code users
run; it ends through the interpreter's normal exit.

What the preload read from the environment is fixed for every child: the names it read (the
websockets, autobahn and zope.interface tunables and the like; sysconfig's user base aside) and
those the interpreter reads as it starts (`PYTHON*` but PYTHONPATH, PYTHONUNBUFFERED and
PYTHONIOENCODING, which a child applies itself; the locale) are reported to the test process,
and a child whose environment gives one of them another value is refused (`NotForkable`): the
helpers of tests/forked.py then run the command itself. Django's settings are not configured in
the forkserver: each child reads DJANGO_SETTINGS_MODULE from its own environment.

`Forked` is the test side's handle on such a child, with the parts of `subprocess.Popen` the
suite uses (pid, stdout/stderr, poll, wait, send_signal, terminate, kill, returncode). The
forkserver reaps its children and reports each exit status. `forkserver()` starts the forkserver
for this test process on first use; `ForkServer.fork` forks any Python command with the streams
given, `ForkServer.spawn` daphne's way (tests/live.py); tests/forked.py has the drop-ins the
client call sites use (`run`, `create_subprocess_exec`, `TerminalChild`).

Tests about how a server starts (startup checks, imports, the quickstart, the installed wheel)
run the real command instead: `DaphneServer(exec=True)`, or `ACP_TEST_FORK=0` for all.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import io
import json
import os
import select
import selectors
import signal
import socket
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent

#: What the forkserver imports once: daphne's stack short of daphne.server, Django's request
#: path, channels, the official `acp` SDK (its schema is most of an SDK agent's start), what
#: demo_project's settings and asgi import, and the libraries of the clients (httpx's transport,
#: websockets' client, the terminal's prompt_toolkit, rich and wcwidth; django.core.management
#: for manage.py).
PRELOAD = (
    "asyncio", "concurrent.futures", "twisted.internet.asyncioreactor", "twisted.internet.tcp",
    "twisted.internet.ssl", "twisted.internet.endpoints", "twisted.web.http", "twisted.logger",
    "autobahn.twisted.websocket", "autobahn.websocket.compress", "OpenSSL.SSL", "cryptography.x509",
    "django.http", "django.urls", "django.db.models", "django.core.handlers.asgi",
    "django.core.management", "django.contrib.sessions.middleware",
    "django.contrib.staticfiles.handlers", "django.views.generic", "django.template.backends.django",
    "channels.routing", "channels.auth", "channels.generic.websocket", "channels.layers",
    "asgiref.sync", "httpx", "msgpack", "redis.asyncio", "acp", "acp.agent.connection", "acp.helpers",
    "acp.interfaces", "acp.schema", "acp.client.connection", "acp.connection", "httpcore", "h11", "h2.connection",
    "anyio", "certifi", "orjson", "websockets.asyncio.client", "websockets.client", "prompt_toolkit",
    "prompt_toolkit.shortcuts", "prompt_toolkit.key_binding", "prompt_toolkit.patch_stdout", "rich.console",
    "rich.live", "rich.markup", "rich.text", "wcwidth", "shlex", "argparse",
)  # fmt: skip
#: Set by the interpreter as it starts from these, besides what the preload reads (a child whose
#: environment changes one is not forked); PYTHONPATH, PYTHONUNBUFFERED and PYTHONIOENCODING
#: are applied by each child.
STARTUP_PREFIX, LOCALE = "PYTHON", ("LANG", "LC_ALL", "LC_CTYPE")
APPLIED_BY_CHILD = ("PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONIOENCODING")
#: What does not read the environment on a child's behalf: sysconfig's user base (this virtual
#: environment has no user site) and the paths os and posixpath read through.
_NOT_READERS = ("os", "collections.abc", "_collections_abc", "posixpath", "genericpath")

_MAX_REQUEST = 1 << 20
#: The forkserver's sys.path after its own directory and PYTHONPATH: the installation's.
_INSTALLATION_PATH: list[str] = []


# -- the forkserver process ------------------------------------------------------------------


def _preload() -> list[str]:
    """Import PRELOAD; returns the environment variables it read (fixed for every child)."""
    import importlib

    read: set[str] = set()
    getitem = os._Environ.__getitem__

    def recording(self: os._Environ[str], key: str) -> str:
        frame = sys._getframe(1)
        while frame.f_back is not None and frame.f_globals.get("__name__") in _NOT_READERS:
            frame = frame.f_back
        if frame.f_globals.get("__name__") != "sysconfig":
            read.add(key)
        return getitem(self, key)

    os._Environ.__getitem__ = recording
    try:
        for name in PRELOAD:
            with contextlib.suppress(ImportError):
                importlib.import_module(name)
    finally:
        os._Environ.__getitem__ = getitem
    # A thread would not survive the fork (and its locks would stay taken in the child).
    assert threading.active_count() == 1, f"the preload started threads: {threading.enumerate()}"
    return sorted(read)


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
    """Become `python ARGV` as started in the request's directory, environment and streams."""
    import builtins
    import runpy
    import types

    if request["terminal"]:  # what login_tty does: a session of its own, the pty its terminal
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    os.chdir(request["cwd"])
    env: dict[str, str] = request["env"]
    os.environ.clear()
    os.environ.update(env)
    time.tzset()  # the C library read TZ when the forkserver started
    _reopen_stdio(env)
    argv: list[str] = request["argv"]
    if argv[0] == "-m":
        _set_path(os.getcwd(), env)
        sys.argv = argv[1:]  # runpy puts the module's path in argv[0], as `-m` does
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    elif argv[0] == "-c":
        _set_path("", env)
        sys.argv = ["-c", *argv[2:]]
        main = sys.modules["__main__"] = types.ModuleType("__main__")
        main.__builtins__ = builtins
        exec(compile(argv[1], "<string>", "exec"), main.__dict__)
    else:
        _set_path(os.path.dirname(os.path.realpath(argv[0])), env)
        sys.argv = list(argv)
        runpy.run_path(argv[0], run_name="__main__")


def _pythonpath(env: dict[str, str] | os._Environ[str]) -> list[str]:
    return [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]


def _set_path(first: str, env: dict[str, str]) -> None:
    """sys.path as the interpreter builds it: the script's directory (the current one for -m),
    then the child's PYTHONPATH, then the installation's."""
    sys.path[:] = [first, *_pythonpath(env), *_INSTALLATION_PATH]


def _reopen_stdio(env: dict[str, str]) -> None:
    """sys.stdin, stdout and stderr made again over fds 0-2 as the interpreter makes them at start:
    stdout line-buffered on a terminal only, stderr always; PYTHONUNBUFFERED and PYTHONIOENCODING
    read from the child's environment (the forkserver's were made for its own streams)."""
    encoding, errors = sys.__stdout__.encoding if sys.__stdout__ else "utf-8", "strict"
    if sys.__stdout__ is not None:
        errors = sys.__stdout__.errors or errors
    if configured := env.get("PYTHONIOENCODING"):
        named, _, named_errors = configured.partition(":")
        encoding, errors = named or encoding, named_errors or errors
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    streams = []
    for fd, mode in ((0, "r"), (1, "w"), (2, "w")):
        raw = io.FileIO(fd, mode + "b", closefd=False)
        buffered = raw if unbuffered and fd else (io.BufferedReader if fd == 0 else io.BufferedWriter)(raw)
        stream = io.TextIOWrapper(
            buffered,
            encoding=encoding,
            errors="backslashreplace" if fd == 2 else errors,
            newline="\n",
            line_buffering=not unbuffered and fd > 0 and (fd == 2 or raw.isatty()),
            write_through=unbuffered,
        )
        stream.mode = mode
        streams.append(stream)
    sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__ = streams


def main() -> None:
    _INSTALLATION_PATH.extend(sys.path[1 + len(_pythonpath(os.environ)) :])  # after ROOT (-m) and PYTHONPATH
    control = socket.socket(fileno=int(sys.argv[1]))
    read = _preload()
    # Out of the collector's sight: a collection in a child would otherwise write to every
    # preloaded object's header and copy the whole heap (0.5 s of CPU a client instead of 0.2 s).
    gc.freeze()
    control.send(json.dumps({"preloaded": read}).encode())
    request = _serve(control)
    _run_child(request)


# -- the test process's side -------------------------------------------------------------------


class NotForkable(Exception):
    """The child's environment changes what the forkserver's imports or start have fixed."""


class Forked:
    """A forked child, handled like a `subprocess.Popen`."""

    def __init__(self, pid: int, stdout: IO[str] | None = None, stderr: IO[str] | None = None) -> None:
        self.pid = pid
        self.stdout = stdout
        self.stderr = stderr
        self.stdin: IO[str] | None = None
        self.returncode: int | None = None
        self._exited = threading.Event()
        self._callbacks: list[Callable[[int], None]] = []
        self._lock = threading.Lock()
        # Readable once it has ended, before the forkserver's report arrives (as Popen.poll sees it).
        self._pidfd: int | None = None
        with contextlib.suppress(ProcessLookupError):  # already ended and reaped: the report is coming
            self._pidfd = os.pidfd_open(pid)

    def _set_exited(self, returncode: int) -> None:
        with self._lock:
            self.returncode = returncode
            callbacks, self._callbacks = self._callbacks, []
            if self._pidfd is not None:
                os.close(self._pidfd)
                self._pidfd = None
        self._exited.set()
        for callback in callbacks:
            callback(returncode)

    def on_exit(self, callback: Callable[[int], None]) -> None:
        """`callback(returncode)` once it has exited (from the forkserver's thread, or now)."""
        with self._lock:
            if self.returncode is None:
                self._callbacks.append(callback)
                return
        callback(self.returncode)

    def poll(self) -> int | None:
        with self._lock:
            ended = self.returncode is None and (
                self._pidfd is None or bool(select.select([self._pidfd], [], [], 0)[0])
            )
        if ended:
            self._exited.wait(10)  # the forkserver reaps it and reports at once
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
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "demo_project.settings"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.forkserver", str(theirs.fileno())],
            cwd=ROOT, env=self.env, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
        )  # fmt: skip
        theirs.close()
        self.control = ours
        self.lock = threading.Lock()
        self.children: dict[int, Forked] = {}
        self.exits: dict[int, int] = {}  # exits reported before the child's handle was made
        self.started: list[int] = []
        self.preload_read: list[str] | None = None  # the environment variables the preload read
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
                elif "preloaded" in reply:
                    self.preload_read = reply["preloaded"]
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

    def fixed(self, env: dict[str, str]) -> list[str]:
        """The variables `env` gives another value than the forkserver had when it imported PRELOAD
        or started: a child with `env` would not see them as a process of its own would."""
        with self.replied:
            if not self.replied.wait_for(lambda: self.preload_read is not None or self.process.poll() is not None, 60):
                raise RuntimeError("the forkserver did not finish its imports within 60 s")
        startup = {name for name in {*env, *self.env} if name.startswith(STARTUP_PREFIX)} - {*APPLIED_BY_CHILD}
        names = {*(self.preload_read or ()), *startup, *LOCALE}
        return sorted(name for name in names if env.get(name) != self.env.get(name))

    def fork(
        self, argv: Sequence[str], cwd: str | Path, env: dict[str, str], fds: Sequence[int], *, terminal: bool = False
    ) -> Forked:
        """Fork a child running `python ARGV` (`-m MODULE ARGS`, `-c CODE ARGS` or `SCRIPT ARGS`) in
        `cwd` with exactly `env`, `fds` as its stdin, stdout and stderr (the caller closes its own
        copies), and, with `terminal`, fd 0 (a pseudo-terminal) as its controlling terminal in a
        session of its own. NotForkable when `env` changes what the forkserver has fixed."""
        if fixed := self.fixed(env):
            raise NotForkable(f"the environment changes {', '.join(fixed)}, fixed in the forkserver")
        request = {"argv": list(argv), "cwd": str(cwd), "env": env, "terminal": terminal}
        with self.lock:
            socket.send_fds(self.control, [json.dumps(request).encode()], list(fds))
            with self.replied:
                answered = self.replied.wait_for(lambda: self.started or self.process.poll() is not None, 30)
                if not answered or not self.started:
                    raise RuntimeError(f"the forkserver did not answer (exit status {self.process.poll()})")
                pid = self.started.pop()
                child = Forked(pid)
                if pid in self.exits:
                    child._set_exited(self.exits.pop(pid))
                else:
                    self.children[pid] = child
                return child

    def spawn(self, module_argv: Sequence[str], cwd: Path, env: dict[str, str]) -> Forked:
        """Fork a child running `python -m <module_argv>` with stdin and stdout on /dev/null and
        stderr coming back as a text pipe (how DaphneServer runs daphne)."""
        err_read, err_write = os.pipe()
        null = os.open(os.devnull, os.O_RDWR)
        try:
            child = self.fork(["-m", *module_argv], cwd, env, [null, null, err_write])
        except BaseException:
            os.close(err_read)
            raise
        finally:
            os.close(null)
            os.close(err_write)
        child.stderr = open(err_read, encoding="utf-8", errors="replace")
        return child


_forkserver: ForkServer | None = None
_forkserver_lock = threading.Lock()


def children_cpu() -> float:
    """CPU seconds of this test process's forkserver (its imports and forks) and of the children it
    has reaped so far (servers and clients alike; 0 before it starts), for ACP_TEST_CPU_LOG."""
    if _forkserver is None:
        return 0.0
    try:
        fields = Path(f"/proc/{_forkserver.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(field) for field in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime stime cutime cstime


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
    from django.conf import settings

    seen = {
        "argv": sys.argv[1:], "cwd": os.getcwd(), "probe": os.environ.get("PROBE"), "zone": time.strftime("%z"),
        "stdin": sys.stdin.read(), "parent": os.getppid(), "path0": sys.path[0],
        "settings_configured": settings.configured, "line_buffered": sys.stdout.line_buffering,
    }  # fmt: skip
    if "DJANGO_SETTINGS_MODULE" in os.environ:  # read now, from this child's environment
        seen["settings"] = [settings.SETTINGS_MODULE, settings.DATABASES.get("default", {}).get("NAME")]
    print("not for the log")
    print(json.dumps(seen), file=sys.stderr)
    raise SystemExit(3)


if __name__ == "__main__":
    probe() if sys.argv[1:2] == ["--probe"] else main()
