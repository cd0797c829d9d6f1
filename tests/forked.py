"""The suite's Python client processes, forked from this test process's forkserver
(tests/forkserver.py) instead of exec'd: drop-ins for the three ways the tests start them.

* `run(argv, ...)` for `subprocess.run` (pipes; `input`, `capture_output`, `text`, `timeout`,
  `check`);
* `await create_subprocess_exec(*argv, ...)` for `asyncio.create_subprocess_exec` (PIPE, DEVNULL
  or inherited streams; a `ForkedProcess` with the asyncio stream readers and writer, `wait`,
  `communicate` and the signals of `asyncio.subprocess.Process`);
* `TerminalChild(...)` for `pexpect.spawn`: the child on a pseudo-terminal that is its controlling
  terminal, in a session of its own, so that a typed Ctrl-C is a SIGINT as for a real exec.

A command is forked when it is this interpreter running `-m MODULE`, `-c CODE` or a script with no
interpreter option, ACP_TEST_FORK is not 0, and its environment leaves alone what the forkserver
fixed (`ForkServer.fixed`); anything else runs as the command itself, through the call it replaces.
The tests whose subject is how a program starts (its console script, `--version`, what it
imports) call `subprocess` themselves.
"""

from __future__ import annotations

import asyncio
import fcntl
import io
import locale
import os
import selectors
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pexpect
import ptyprocess

from tests import forkserver
from tests.forkserver import Forked

PIPE, DEVNULL, STDOUT = subprocess.PIPE, subprocess.DEVNULL, subprocess.STDOUT
_CHUNK = 1 << 16


def python_argv(argv: Sequence[str | bytes | os.PathLike[str]], env: Mapping[str, str]) -> list[str] | None:
    """The arguments after the interpreter when `argv` may be forked with `env`, else None."""
    if not forkserver.enabled() or len(argv) < 2 or os.fsdecode(argv[0]) != sys.executable:
        return None
    rest = [os.fsdecode(argument) for argument in argv[1:]]
    if rest[0] in ("-m", "-c"):
        if len(rest) < 2:
            return None
    elif rest[0].startswith("-"):  # an interpreter option: only a real start has it
        return None
    if forkserver.forkserver().fixed(dict(env)):
        return None
    return rest


def _environment(env: Mapping[str, str] | None) -> dict[str, str]:
    return dict(os.environ if env is None else env)


def _fork(argv: list[str], cwd: str | os.PathLike[str] | None, env: dict[str, str], fds: Sequence[int]) -> Forked:
    return forkserver.forkserver().fork(argv, Path(cwd) if cwd is not None else Path.cwd(), env, fds)


# -- subprocess.run --------------------------------------------------------------------------


def run(
    argv: Sequence[str],
    *,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    input: str | bytes | None = None,
    stdin: int | None = None,
    capture_output: bool = False,
    text: bool = False,
    timeout: float | None = None,
    check: bool = False,
) -> subprocess.CompletedProcess[Any]:
    """`subprocess.run` with these arguments; the child forked when it can be."""
    environment = _environment(env)
    python = python_argv(argv, environment)
    if python is None or stdin not in (None, DEVNULL):
        return subprocess.run(
            argv, cwd=cwd, env=env, input=input, stdin=stdin, capture_output=capture_output, text=text,
            timeout=timeout, check=check,
        )  # fmt: skip
    encoding = locale.getpreferredencoding(False)
    ours: list[int] = []  # our ends of the pipes
    theirs: list[int] = []  # the child's stdin, stdout, stderr
    if input is not None:
        read_end, write_end = os.pipe()
        theirs.append(read_end)
        ours.append(write_end)
    else:
        theirs.append(os.open(os.devnull, os.O_RDONLY) if stdin == DEVNULL else os.dup(0))
    for inherited in (1, 2):
        if capture_output:
            read_end, write_end = os.pipe()
            theirs.append(write_end)
            ours.append(read_end)
        else:
            theirs.append(os.dup(inherited))
    try:
        child = _fork(python, cwd, environment, theirs)
    except BaseException:
        for fd in ours:
            os.close(fd)
        raise
    finally:
        for fd in theirs:
            os.close(fd)
    data = input.encode(encoding) if isinstance(input, str) else input
    deadline = None if timeout is None else time.monotonic() + timeout
    outputs = _communicate(
        ours[0] if input is not None else None, ours[-2:] if capture_output else [], data or b"", deadline
    )
    remaining = None if deadline is None else max(deadline - time.monotonic(), 0)
    if outputs is None or not _waited(child, remaining):
        child.kill()
        child.wait()
        raise subprocess.TimeoutExpired(list(argv), timeout or 0)
    assert child.returncode is not None
    out: Any = outputs[0] if capture_output else None
    err: Any = outputs[1] if capture_output else None
    if text and capture_output:
        out, err = (_text(stream, encoding) for stream in (out, err))
    if check and child.returncode:
        raise subprocess.CalledProcessError(child.returncode, list(argv), out, err)
    return subprocess.CompletedProcess(list(argv), child.returncode, out, err)


def _waited(child: Forked, timeout: float | None) -> bool:
    try:
        child.wait(timeout)
    except subprocess.TimeoutExpired:
        return False
    return True


def _text(data: bytes, encoding: str) -> str:
    """As subprocess decodes in text mode (universal newlines)."""
    return data.decode(encoding).replace("\r\n", "\n").replace("\r", "\n")


def _communicate(stdin: int | None, outputs: list[int], data: bytes, deadline: float | None) -> list[bytes] | None:
    """Write `data` to `stdin` and read every output to its end (closing each fd); None at the
    deadline."""
    collected = {fd: bytearray() for fd in outputs}
    written = 0
    with selectors.DefaultSelector() as selector:
        if stdin is not None:
            os.set_blocking(stdin, False)
            selector.register(stdin, selectors.EVENT_WRITE)
        for fd in outputs:
            selector.register(fd, selectors.EVENT_READ)
        try:
            while selector.get_map():
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                for key, _ in selector.select(remaining):
                    if key.fd == stdin:
                        try:
                            written += os.write(stdin, data[written : written + _CHUNK])
                        except BrokenPipeError:  # it stopped reading: as subprocess does, go on
                            written = len(data)
                        done = written >= len(data)
                    else:
                        chunk = os.read(key.fd, _CHUNK)
                        collected[key.fd] += chunk
                        done = not chunk
                    if done:
                        selector.unregister(key.fd)
                        os.close(key.fd)
        finally:
            for key in list(selector.get_map().values()):
                os.close(key.fd)
    return [bytes(collected[fd]) for fd in outputs]


# -- asyncio.create_subprocess_exec -----------------------------------------------------------


class ForkedProcess:
    """A forked child as an `asyncio.subprocess.Process`: its stdin a StreamWriter, its stdout
    and stderr StreamReaders (for PIPE), `wait`, `communicate` and the signals."""

    def __init__(
        self,
        child: Forked,
        stdin: asyncio.StreamWriter | None,
        stdout: asyncio.StreamReader | None,
        stderr: asyncio.StreamReader | None,
    ) -> None:
        self.child = child
        self.pid = child.pid
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr

    @property
    def returncode(self) -> int | None:
        return self.child.returncode

    async def wait(self) -> int:
        loop = asyncio.get_running_loop()
        exited: asyncio.Future[int] = loop.create_future()

        def report(returncode: int) -> None:
            if not exited.done():
                exited.set_result(returncode)

        def from_thread(returncode: int) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(report, returncode)

        self.child.on_exit(from_thread)
        return await exited

    async def communicate(self, input: bytes | None = None) -> tuple[bytes | None, bytes | None]:
        if self.stdin is not None:
            if input:
                self.stdin.write(input)
                try:
                    await self.stdin.drain()
                except (BrokenPipeError, ConnectionResetError):
                    pass
            self.stdin.close()
        out, err = await asyncio.gather(_read_all(self.stdout), _read_all(self.stderr))
        await self.wait()
        return out, err

    def send_signal(self, sig: int) -> None:
        self.child.send_signal(sig)

    def terminate(self) -> None:
        self.child.terminate()

    def kill(self) -> None:
        self.child.kill()


async def _read_all(stream: asyncio.StreamReader | None) -> bytes | None:
    return None if stream is None else await stream.read()


async def create_subprocess_exec(
    program: str,
    *args: str,
    stdin: int | None = None,
    stdout: int | None = None,
    stderr: int | None = None,
    limit: int = _CHUNK,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> asyncio.subprocess.Process | ForkedProcess:
    """`asyncio.create_subprocess_exec` with these arguments; the child forked when it can be."""
    environment = _environment(env)
    python = python_argv([program, *args], environment)
    if python is None:
        return await asyncio.create_subprocess_exec(
            program, *args, stdin=stdin, stdout=stdout, stderr=stderr, limit=limit, cwd=cwd, env=env
        )
    loop = asyncio.get_running_loop()
    ours: dict[int, int] = {}  # the child's fd number -> our end of its pipe
    theirs: list[int] = []
    for number, spec in enumerate((stdin, stdout, stderr)):
        if spec == PIPE:
            read_end, write_end = os.pipe()
            ours[number], child_end = (write_end, read_end) if number == 0 else (read_end, write_end)
            theirs.append(child_end)
        elif spec == DEVNULL:
            theirs.append(os.open(os.devnull, os.O_RDWR))
        elif spec == STDOUT and number == 2:
            theirs.append(os.dup(theirs[1]))
        elif spec is None:
            theirs.append(os.dup(number))
        else:
            raise ValueError(f"a forked child's stream is PIPE, DEVNULL, STDOUT or None, not {spec!r}")
    try:
        child = _fork(python, cwd, environment, theirs)
    except BaseException:
        for fd in ours.values():
            os.close(fd)
        raise
    finally:
        for fd in theirs:
            os.close(fd)
    writer = readers = None
    if 0 in ours:
        transport, protocol = await loop.connect_write_pipe(
            lambda: asyncio.StreamReaderProtocol(asyncio.StreamReader()), io.FileIO(ours[0], "w")
        )
        writer = asyncio.StreamWriter(transport, protocol, None, loop)
    readers = {number: asyncio.StreamReader(limit=limit) for number in (1, 2) if number in ours}
    for number, reader in readers.items():
        await loop.connect_read_pipe(
            lambda reader=reader: asyncio.StreamReaderProtocol(reader), io.FileIO(ours[number], "r")
        )
    return ForkedProcess(child, writer, readers.get(1), readers.get(2))


# -- pexpect.spawn ----------------------------------------------------------------------------


class ForkedPty(ptyprocess.PtyProcess):
    """ptyprocess's handle on a forked child (pexpect's `ptyproc`): its status from the forkserver,
    not from waitpid (the child is the forkserver's)."""

    def __init__(self, child: Forked, fd: int, argv: list[str], env: dict[str, str], cwd: str | None) -> None:
        super().__init__(child.pid, fd)
        self.child = child
        self.argv, self.env, self.launch_dir = argv, env, cwd

    def isalive(self) -> bool:
        if self.terminated:
            return False
        # At the end of its output the child has ended or is ending: wait, as ptyprocess does.
        returncode = self.child.wait() if self.flag_eof else self.child.poll()
        if returncode is None:
            return True
        self.exitstatus, self.signalstatus = (returncode, None) if returncode >= 0 else (None, -returncode)
        self.status = returncode << 8 if returncode >= 0 else -returncode
        self.terminated = True
        return False

    def wait(self) -> int | None:
        self.child.wait()
        self.isalive()
        return self.exitstatus

    def kill(self, sig: int) -> None:
        self.child.send_signal(sig)


class TerminalChild(pexpect.spawn):
    """`pexpect.spawn` (same arguments) whose Python child is forked onto the pseudo-terminal."""

    def _spawnpty(self, args: list[bytes | str], **kwargs: Any) -> ptyprocess.PtyProcess:
        env = _environment(kwargs.get("env"))
        python = python_argv(args, env)
        if python is None or kwargs.get("preexec_fn") is not None or kwargs.get("pass_fds"):
            return super()._spawnpty(args, **kwargs)
        master, slave = os.openpty()
        try:
            rows, columns = kwargs.get("dimensions") or (24, 80)
            fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
            if not kwargs.get("echo", True):
                attributes = termios.tcgetattr(slave)
                attributes[3] &= ~termios.ECHO
                termios.tcsetattr(slave, termios.TCSANOW, attributes)
            cwd = kwargs.get("cwd")
            child = forkserver.forkserver().fork(
                python, Path(cwd) if cwd else Path.cwd(), env, [slave, slave, slave], terminal=True
            )
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        return ForkedPty(child, master, [os.fsdecode(argument) for argument in args], env, cwd)
