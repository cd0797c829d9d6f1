"""The suite's own tools: the xdist groups (tests/scheduling.py: the tests sharing a module's
servers go together per server shape, everything else one test at a time), the CPU report
(tests/cpu_report.py), and the processes forked from the forkserver (tests/forkserver.py,
tests/forked.py)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pexpect
import pytest

from tests import dist, forked, forkserver
from tests.cpu_report import report
from tests.live import ROOT, DaphneServer
from tests.scheduling import keeps_servers, server_group


@pytest.fixture
def forking(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests of forking fork under ACP_TEST_FORK=0 too."""
    monkeypatch.setenv("ACP_TEST_FORK", "1")


SHARED = 'import pytest\n@pytest.fixture(scope="module")\ndef server():\n    return DaphneServer().start()\n'
PER_TEST = "def test_x():\n    DaphneServer().start()\n"


def test_a_module_with_shared_servers_is_one_group_per_shape() -> None:
    one = server_group("tests/test_x.py::test_a[one-worker]", SHARED)
    three = server_group("tests/test_x.py::test_b[three-workers-deep]", SHARED)
    assert one == "tests/test_x.py-one-worker"
    assert three == "tests/test_x.py-three-workers"
    assert server_group("tests/test_x.py::test_c[one-worker]", SHARED) == one
    assert server_group("tests/test_x.py::TestY::test_d", SHARED) == "tests/test_x.py"


def test_other_tests_are_not_grouped() -> None:
    assert server_group("tests/test_x.py::test_a[one-worker]", PER_TEST) is None
    assert server_group("tests/test_x.py::test_a", "def test_a():\n    pass\n") is None


def test_the_suites_modules_with_shared_servers_are_found() -> None:
    """A live module known to keep its servers per module is recognised from its source."""
    assert keeps_servers((ROOT / "tests" / "test_resume_ws_live.py").read_text())
    assert not keeps_servers((ROOT / "tests" / "test_protocol.py").read_text())


def test_the_cpu_report_sums_per_module_costliest_first(tmp_path: Path) -> None:
    log = tmp_path / "cpu.log"
    log.write_text(
        "tests/test_a.py::test_one[x]\t0.50\t1.50\t3.00\n"
        "tests/test_b.py::test_two\t1.00\t4.00\t2.00\n"
        "tests/test_a.py::test_three\t0.25\t0.75\t1.00\n"
    )
    lines = report(str(log)).splitlines()
    assert lines[0] == "8 s of CPU over 2 modules"
    assert lines[2].split() == ["5.0", "62.5%", "2.0", "tests/test_b.py"]
    assert lines[3].split() == ["3.0", "37.5%", "4.0", "tests/test_a.py"]


def test_a_new_cache_entry_removes_stale_ones_of_other_contents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The build cache keeps what a run may still use, not one 140 MB environment per edit."""
    monkeypatch.setattr(dist, "CACHE", tmp_path)
    monkeypatch.setattr(dist, "inputs_digest", lambda: "new")
    stale, recent, other_kind = tmp_path / "dist-old", tmp_path / "dist-recent", tmp_path / "readme-install-old"
    for folder in (stale, recent, other_kind):
        folder.mkdir()
    hours_ago = time.time() - 2 * dist.STALE_AFTER
    os.utime(stale, (hours_ago, hours_ago))
    os.utime(other_kind, (hours_ago, hours_ago))
    with dist.cached("dist") as (place, done):
        assert (place, done) == (tmp_path / "dist-new", False)
        (place / "done").touch()
    assert not stale.exists()
    assert recent.exists() and other_kind.exists()  # in use by a parallel run, or another cache
    with dist.cached("dist") as (place, done):
        assert done


def test_a_forked_child_runs_a_module_with_its_own_argv_cwd_environment_and_zone(tmp_path: Path) -> None:
    server = forkserver.forkserver()
    env = {**os.environ, "PROBE": "yes", "TZ": "Asia/Kathmandu", "PYTHONPATH": str(ROOT)}
    child = server.spawn(["tests.forkserver", "--probe", "x"], tmp_path, env)
    assert child.wait(30) == 3
    assert child.stderr is not None
    seen = json.loads(child.stderr.read())
    assert seen["argv"] == ["--probe", "x"] and seen["cwd"] == str(tmp_path) and seen["probe"] == "yes"
    assert seen["zone"] == "+0545"  # TZ applied in the child (tzset), not the forkserver's zone
    assert seen["stdin"] == "" and seen["parent"] == server.process.pid


def test_a_forked_client_has_its_own_streams_path_and_django_settings(tmp_path: Path, forking: None) -> None:
    """`forked.run` as `subprocess.run`: stdin from `input`, stdout and stderr captured, the exit
    status; sys.path[0] is the child's directory (as for `python -m`); Django's settings are not
    configured in the forkserver: the child's DJANGO_SETTINGS_MODULE (and what its settings
    read) is what it gets."""
    env = {**os.environ, "PROBE": "p", "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "tests.auth_site"}
    env["ACP_TEST_DATABASE"] = str(tmp_path / "db.sqlite3")
    argv = [sys.executable, "-m", "tests.forkserver", "--probe", "a b"]
    result = forked.run(argv, cwd=tmp_path, env=env, input="typed\n", capture_output=True, text=True, timeout=30)
    assert (result.returncode, result.stdout) == (3, "not for the log\n")
    seen = json.loads(result.stderr)
    assert seen["parent"] == forkserver.forkserver().process.pid  # forked, not exec'd
    assert seen["argv"] == ["--probe", "a b"] and seen["stdin"] == "typed\n" and seen["path0"] == str(tmp_path)
    assert seen["settings_configured"] is False
    assert seen["settings"] == ["tests.auth_site", str(tmp_path / "db.sqlite3")]


def test_a_forked_script_and_code_run_as_main_with_their_argv(tmp_path: Path, forking: None) -> None:
    script = tmp_path / "script.py"
    script.write_text("import json, sys\nprint(json.dumps([__name__, sys.argv, sys.path[0]]))\nsys.exit(7)\n")
    result = forked.run([sys.executable, str(script), "x"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 7
    assert json.loads(result.stdout) == ["__main__", [str(script), "x"], str(tmp_path)]
    code = "import sys; print(__name__, sys.argv); raise SystemExit(len(sys.stdin.read()))"
    result = forked.run([sys.executable, "-c", code, "y"], stdin=subprocess.DEVNULL, capture_output=True, text=True)
    assert (result.returncode, result.stdout) == (0, "__main__ ['-c', 'y']\n")


async def test_a_forked_child_with_asyncio_streams(forking: None) -> None:
    """`forked.create_subprocess_exec` as asyncio's: a StreamWriter on its stdin, StreamReaders on
    its stdout and stderr, `wait` for the exit status, a signal."""
    echo = "import sys\nfor line in sys.stdin:\n    print(line.upper(), end='', flush=True)\nsys.exit(5)"
    pipe = asyncio.subprocess.PIPE
    process = await forked.create_subprocess_exec(sys.executable, "-c", echo, stdin=pipe, stdout=pipe, stderr=pipe)
    assert isinstance(process, forked.ForkedProcess)
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    process.stdin.write(b"one\n")
    await process.stdin.drain()
    async with asyncio.timeout(30):
        assert await process.stdout.readline() == b"ONE\n"
        assert await process.communicate(b"two\n") == (b"TWO\n", b"")
    assert process.returncode == 5
    sleeper = await forked.create_subprocess_exec(sys.executable, "-c", "import time; time.sleep(60)")
    sleeper.kill()
    async with asyncio.timeout(30):
        assert await sleeper.wait() == -signal.SIGKILL


def test_ctrl_c_typed_on_a_forked_childs_terminal_interrupts_it(forking: None) -> None:
    """The child's pseudo-terminal is its controlling terminal and it leads its session: the Ctrl-C
    typed there is a SIGINT to it, as for a process pexpect would exec; its stdout is line-buffered
    there (made for its terminal, not the forkserver's streams)."""
    # A suite started in the background by a non-interactive shell ignores SIGINT, and so does
    # every process it starts, exec'd or forked (the test failed so, one launch in two): the child
    # takes SIGINT as an interactive program does, so the test sees the terminal's doing only.
    code = (
        "import os, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "print(sys.stdin.isatty(), os.getsid(0) == os.getpid(), sys.stdout.line_buffering)"
    )
    env = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}
    child = forked.TerminalChild(sys.executable, ["-c", code + "; input('> ')"], env=env, encoding="utf-8", timeout=20)
    try:
        assert isinstance(child.ptyproc, forked.ForkedPty)
        child.expect("True True True")
        child.expect("> ")
        child.sendcontrol("c")
        child.expect("KeyboardInterrupt")
        child.expect(pexpect.EOF)
        child.close()
        assert child.signalstatus == signal.SIGINT  # an uncaught KeyboardInterrupt ends by SIGINT
    finally:
        child.close(force=True)


def test_what_the_forkserver_fixed_is_not_forked(monkeypatch: pytest.MonkeyPatch) -> None:
    """A variable the preload read or the interpreter reads as it starts, given another value, makes
    the command run as itself; so does ACP_TEST_FORK=0."""
    server = forkserver.forkserver()
    assert "WEBSOCKETS_MAX_LINE_LENGTH" in server.fixed({**server.env, "WEBSOCKETS_MAX_LINE_LENGTH": "1"})
    assert server.fixed({**server.env, "PYTHONWARNINGS": "error", "PYTHONPATH": "/x"}) == ["PYTHONWARNINGS"]
    assert server.fixed({**server.env, "DJANGO_SETTINGS_MODULE": "x", "PYTHONUNBUFFERED": "1"}) == []
    parent = [sys.executable, "-c", "import os; print(os.getppid())"]
    warned = forked.run(parent, env={**os.environ, "PYTHONWARNINGS": "error"}, capture_output=True, text=True)
    assert int(warned.stdout) == os.getpid()
    monkeypatch.setenv("ACP_TEST_FORK", "0")
    assert int(forked.run(parent, capture_output=True, text=True).stdout) == os.getpid()


def test_a_forked_daphne_serves_and_its_signals_and_exit_are_seen(forking: None) -> None:
    daphne = DaphneServer(env={"ACP_AGENT": "tests.wire_agent.create"}).start()
    try:
        assert isinstance(daphne.process, forkserver.Forked)
        reply = httpx.post(daphne.url, json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}})
        assert reply.status_code == 200 and reply.headers["acp-connection-id"]
        assert daphne.process.poll() is None
        daphne.process.kill()
        assert daphne.process.wait(10) == -signal.SIGKILL
    finally:
        daphne.stop()


def test_a_server_about_starting_runs_the_real_command() -> None:
    daphne = DaphneServer(env={"ACP_AGENT": "tests.wire_agent.create"}, exec=True).start()
    try:
        assert isinstance(daphne.process, subprocess.Popen)
        assert Path(f"/proc/{daphne.process.pid}/cmdline").read_bytes().split(b"\0")[1:3] == [b"-m", b"daphne"]
    finally:
        daphne.stop()


def test_children_of_a_forkserver_that_died_end_and_nothing_waits_forever(tmp_path: Path) -> None:
    server = forkserver.ForkServer()
    daphne = DaphneServer(env={"ACP_AGENT": "tests.wire_agent.create"})
    argv, cwd, env = daphne.command()
    daphne.process = server.spawn(argv[2:], cwd, env)
    server.process.kill()
    assert daphne.process.wait(10) == -signal.SIGKILL
    status = Path(f"/proc/{daphne.process.pid}/status")
    assert not status.exists() or "zombie" in status.read_text()  # ended; its new parent may not have reaped it
