"""The suite's own tools: the xdist groups (tests/scheduling.py: the tests sharing a module's
servers go together per server shape, everything else one test at a time) and the CPU report
(tests/cpu_report.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests import dist, forkserver
from tests.cpu_report import report
from tests.live import ROOT, DaphneServer
from tests.scheduling import keeps_servers, server_group

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
    child = server.spawn(["tests.forkserver", "--probe", "x"], tmp_path, {"PROBE": "yes", "TZ": "Asia/Kathmandu"})
    assert child.wait(30) == 3
    assert child.stderr is not None
    seen = json.loads(child.stderr.read())
    assert seen["argv"] == ["--probe", "x"] and seen["cwd"] == str(tmp_path) and seen["probe"] == "yes"
    assert seen["zone"] == "+0545"  # TZ applied in the child (tzset), not the forkserver's zone
    assert seen["stdin"] == "" and seen["parent"] == server.process.pid


def test_a_forked_daphne_serves_and_its_signals_and_exit_are_seen() -> None:
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
