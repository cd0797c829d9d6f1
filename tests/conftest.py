from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from asgiref.sync import SyncToAsync

from tests import cluster, forkserver
from tests.cluster import Cluster, RedisServer
from tests.dist import Built, Installed, cached_build, cached_readme_install
from tests.live import ROOT, DaphneServer
from tests.peers.fakes import FakeAcp
from tests.scheduling import LIVE_NAMES, SHAPES, ServerGroupScheduling

#: How many clusters were started before a test's setup (its report's cluster logs).
CLUSTERS_BEFORE = pytest.StashKey[int]()

#: Modules out of the quick tier as a whole: floods, fuzzing, builds, other processes' SDKs and
#: agents, HTTP/2 stacks, network cuts, servers of their own per test or per setting, log
#: counts (each costs tens of seconds of a run). The quick tier keeps the unit tests, the wire
#: contract against one worker, and the client, resume and routing tests on shared servers.
SLOW_MODULES = frozenset({
    "test_http2_live", "test_http2_parity_live", "test_http2_nginx_live", "test_backpressure_live",
    "test_large_output_live", "test_fuzz_live", "test_packaging", "test_example_project", "test_stdio_live",
    "test_interop", "test_auth_interop", "test_bridge_interop", "test_bridge_live", "test_resume_live",
    "test_agent_context", "test_client_terminal", "test_deploy_settings", "test_observability_live",
    "test_log_levels_live", "test_malformed_logs_live", "test_websocket_failures_live", "test_demo_logs_live",
    "test_caps_live", "test_batch_live", "test_edge_limits_live", "test_origin_live", "test_auth_live",
    "test_client_servers", "test_oauth_live", "test_client_attach_terminal_live", "test_client_attach_live",
    "test_auth_recipes", "test_bridge_attach_live", "test_tokens_live", "test_tickets_live", "test_attach_live",
    "test_directory_live",
})  # fmt: skip
#: Fixtures that are real servers.
LIVE_FIXTURES = frozenset({"demo_server", "wire_server", "claude_server", "caps_server", "redis_server"})

CLAUDE_CODE_ACP = ROOT / "tests" / "agents" / "node_modules" / "@zed-industries" / "claude-code-acp"
WIRE_ENV = {"ACP_AGENT": "tests.wire_agent.create", "ACP_KEEPALIVE_SECONDS": "0.5"}


def _module_source(item: pytest.Item, cache: dict[str, str]) -> str:
    path = str(item.path)
    if path not in cache:
        cache[path] = item.path.read_text()
    return cache[path]


_sources: dict[str, str] = {}


def pytest_itemcollected(item: pytest.Item) -> None:
    """Marks each test `live` (a real server process), `cluster` (several workers on Redis;
    also `slow`) and `slow` for browsers and SLOW_MODULES (a test may say `slow` itself), as it
    is collected: before `-m` selects."""
    source = _module_source(item, _sources)
    params = getattr(getattr(item, "callspec", None), "params", {})
    # "runners": tests.token_servers.RUNNERS, a cluster of web workers and runners.
    is_cluster = any(value in ("three-workers", "runners") for value in params.values()) or "Cluster(" in source
    live = is_cluster or LIVE_FIXTURES.intersection(item.fixturenames) or any(name in source for name in LIVE_NAMES)
    if live:
        item.add_marker(pytest.mark.live)
    if is_cluster:
        item.add_marker(pytest.mark.cluster)
    if is_cluster or item.get_closest_marker("browser") or item.path.stem in SLOW_MODULES:
        item.add_marker(pytest.mark.slow)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: unknown under `-p no:xdist`
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> ServerGroupScheduling | None:
    """`--dist loadgroup`: the live tests sharing a module's servers on one xdist worker per
    server shape (tests/scheduling.py); other `--dist` modes are xdist's own."""
    if config.getvalue("dist") == "loadgroup":
        return ServerGroupScheduling(config, log)
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slow tests first, so that under pytest-xdist (`-n`) the longest start at once and the
    short ones fill in after them, instead of one long test starting last and holding up the
    end of the run. Stable: within each rank, the collection order (module fixtures together)."""
    items.sort(key=lambda item: (item.get_closest_marker("slow") is None, item.get_closest_marker("live") is None))


@pytest.fixture(scope="session")
def built() -> Built:
    """The wheel and the sdist of this checkout, built once for its contents (tests/dist.py)."""
    return cached_build()


@pytest.fixture(scope="session")
def readme_install(built: Built) -> Installed:
    """A fresh virtual environment where the README's `pip install` line installed the wheel,
    once for these contents (tests/dist.py); its `result` says how that went (the tests using
    it assert on it)."""
    return cached_readme_install(built)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    redis = RedisServer.shared_or_private()
    yield redis
    redis.stop()


def start_server(shape: str, env: dict[str, str], request: pytest.FixtureRequest) -> DaphneServer | Cluster:
    """A started server of one SHAPES entry: one daphne, or three workers on Redis."""
    if shape == "one-worker":
        return DaphneServer(env=env).start()
    return Cluster(request.getfixturevalue("redis_server"), env=env).start()


def _serve(shape: str, env: dict[str, str], request: pytest.FixtureRequest) -> Iterator[DaphneServer | Cluster]:
    server = start_server(shape, env, request)
    yield server
    server.stop()


@pytest.fixture(scope="session", params=SHAPES)
def demo_server(request: pytest.FixtureRequest) -> Iterator[DaphneServer | Cluster]:
    """The demo agent (the quickstart's server)."""
    yield from _serve(request.param, {}, request)


@pytest.fixture(scope="session", params=SHAPES)
def wire_server(request: pytest.FixtureRequest) -> Iterator[DaphneServer | Cluster]:
    """tests.wire_agent, with a short keep-alive."""
    yield from _serve(request.param, WIRE_ENV, request)


@pytest.fixture(scope="module")
def wire_log_stays_clean(wire_server: DaphneServer | Cluster) -> Iterator[None]:
    """No traceback and no 500 in the wire server's log while the module using it ran."""
    start = len(wire_server.log)
    yield
    assert DaphneServer(log=wire_server.log[start:]).errors() == []


@pytest.fixture
def url(wire_server: DaphneServer | Cluster) -> str:
    return wire_server.url


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    # No keep-alive: each request is a new TCP connection, so through the balancer consecutive
    # requests of one ACP connection land on different workers.
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=httpx.Timeout(20.0), limits=limits) as client:
        yield client


@pytest.fixture
def sync_to_async_calls(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The functions run through asgiref's sync_to_async from now on (each is a thread hop,
    or at least its machinery), in call order."""
    calls: list[Any] = []
    real_call = SyncToAsync.__call__

    def counting_call(self: SyncToAsync[Any, Any], *args: Any, **kwargs: Any) -> Any:
        calls.append(self.func)
        return real_call(self, *args, **kwargs)

    monkeypatch.setattr(SyncToAsync, "__call__", counting_call)
    return calls


@pytest.fixture
async def fake() -> AsyncIterator[FakeAcp]:
    """A fake ACP server (tests/peers/fakes.py) for one client test."""
    async with FakeAcp() as server:
        yield server


@pytest.fixture(scope="session", autouse=True)
def no_agent_process_left() -> Iterator[None]:
    """After the run, no stdio agent process the tests started is still running."""
    from tests.agent_processes import adopt_orphans, leftover_agents

    adopt_orphans()
    yield
    left = leftover_agents()
    assert not left, f"agent processes still running after the tests: {left}"


@pytest.fixture(scope="module")
def claude_server() -> Iterator[DaphneServer]:
    """A published third-party agent, @zed-industries/claude-code-acp (pinned in tests/agents),
    as each connection's stdio subprocess behind one daphne."""
    if shutil.which("node") is None or not (CLAUDE_CODE_ACP / "dist" / "index.js").exists():
        pytest.fail("needs node and `npm ci` in tests/agents (./dev.sh test does it)")
    home = tempfile.mkdtemp(prefix="acp-claude-home-")
    agent = {
        "command": ["node", str(CLAUDE_CODE_ACP / "dist" / "index.js")],
        # A home of its own (it writes ~/.claude*), and no update checks or telemetry: offline.
        "env": {"HOME": home, "DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"},
    }
    server = DaphneServer(env={"ACP_AGENT": json.dumps(agent), "ACP_AGENT_SHUTDOWN_GRACE": "0.5"}).start()
    yield server
    server.stop()
    shutil.rmtree(home, ignore_errors=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failing test that ran a cluster (tests/cluster.py) shows its workers' and runners' logs:
    a CI failure in a cluster is otherwise a status code without a cause."""
    outcome = yield
    report = outcome.get_result()
    if call.when == "setup":
        item.stash[CLUSTERS_BEFORE] = cluster.forget_stopped_clusters()
    elif report.failed and (logs := cluster.logs_of_started_clusters(item.stash.get(CLUSTERS_BEFORE, 0))):
        report.sections.append(("cluster logs", logs))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """`ACP_TEST_CPU_LOG=<file>`: one line per test with the CPU seconds it cost this process and
    the child processes it reaped (servers count where they are stopped: at their fixture's
    teardown), and its wall time; `python -m tests.cpu_report <file>` sums them per module
    (docs/testing.md, "Where the time goes")."""
    log = os.environ.get("ACP_TEST_CPU_LOG")
    if not log:
        yield
        return
    before, forked_before, started = os.times(), forkserver.children_cpu(), time.monotonic()
    yield
    after = os.times()
    own = after.user - before.user + after.system - before.system
    children = after.children_user - before.children_user + after.children_system - before.children_system
    children += forkserver.children_cpu() - forked_before
    with open(log, "a") as lines:
        lines.write(f"{item.nodeid}\t{own:.2f}\t{children:.2f}\t{time.monotonic() - started:.2f}\n")


@pytest.fixture(autouse=True)
def worker_budget_left_as_found() -> Iterator[None]:
    """Every test leaves this process's worker budget where it found it: bytes a test's hosts
    still hold (a reader never released) would count against the tests after it (one failed so,
    far from the test that leaked)."""
    from acp_channels._host import registry

    before = registry.budget.used
    yield
    assert registry.budget.used == before, f"the worker budget went from {before} to {registry.budget.used} bytes"
