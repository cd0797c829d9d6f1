"""Agents know whom they serve: the agent factory gets the connection's AgentContext (principal,
connection id, transport, remote address) when it takes one, zero-argument factories keep
working, and a stdio agent's `configure` callable shapes its command, directory and environment
per connection (each principal its own workspace), refusing the connection cleanly when it fails.

In process through the registry with explicit principals, and live over daphne. The live tests
run once per entry of IDENTITIES: anonymous, and a bearer-token principal (server settings,
request headers, the principal the agent must see).
"""

from __future__ import annotations

import asyncio
import functools
import json
import sys
import time
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets

import tests.context_agent
from acp_channels import _agents as agents
from acp_channels import _protocol as protocol
from acp_channels._agents import (
    FactorySignatureError,
    call_agent_factory,
    create_agent_channel,
    factory_call,
    factory_problem,
)
from acp_channels._agents import stdio as stdio_module
from acp_channels._agents.sdk import SdkAgentChannel
from acp_channels._agents.stdio import (
    CONNECTION_ENV,
    PRINCIPAL_ID_ENV,
    PRINCIPAL_KIND_ENV,
    AgentConfigurationError,
    StdioAgentChannel,
    setting_problems,
)
from acp_channels._agents.stdio import process as stdio_process
from acp_channels._host import ConnectionHost, registry
from acp_channels._identity import ANONYMOUS, AgentContext, Principal
from acp_channels._worker import new_connection_id
from tests.agent_processes import running_agents, supported
from tests.live import JSON, DaphneServer, open_sse, post, rpc
from tests.wire_agent import WireAgent

SCRIPT = Path(__file__).with_name("stdio_script_agent.py")
COMMAND = [sys.executable, str(SCRIPT)]
BUDGET = 1024 * 1024
ADA = Principal("user", "42", "Ada Lovelace")
BOB = Principal("user", "7", "Bob")

linux_only = pytest.mark.skipif(not supported(), reason="process checks read /proc (Linux)")


# -- how a factory is called -------------------------------------------------------------------


def no_arguments() -> str:
    return "agent"


def optional_only(verbose: bool = False) -> str:
    return "agent"


def keyword_context(*, context: AgentContext) -> str:
    return "agent"


def optional_context(context: AgentContext | None = None) -> str:
    return "agent"


def positional(ctx: AgentContext) -> str:
    return "agent"


def positional_only_context(context: AgentContext | None = None, /) -> str:
    return "agent"


def two_required(context: AgentContext, workspace: str) -> str:
    return "agent"


def required_keyword(*, workspace: str) -> str:
    return "agent"


async def async_factory(context: AgentContext) -> str:
    return "agent"


class ClassTakingContext:
    def __init__(self, ctx: AgentContext) -> None:
        self.context = ctx


class ClassTakingNothing:
    pass


@pytest.mark.parametrize(
    ("factory", "expected"),
    [
        (no_arguments, "none"),
        (optional_only, "none"),  # not written for a context: called as before
        (lambda *args, **kwargs: "agent", "none"),  # a forwarding wrapper: called as before
        (ClassTakingNothing, "none"),
        (keyword_context, "keyword"),
        (optional_context, "keyword"),  # e.g. demo_project.agent.create_agent
        (positional, "positional"),
        (lambda _: "agent", "positional"),
        (positional_only_context, "positional"),
        (ClassTakingContext, "positional"),
        (functools.partial(two_required, workspace="/srv"), "keyword"),
    ],
)
def test_how_a_factory_is_called(factory: Callable[..., Any], expected: str) -> None:
    assert factory_call(factory) == expected
    assert factory_problem(factory) is None


@pytest.mark.parametrize(
    ("factory", "problem"),
    [
        (two_required, "needs the argument(s) 'workspace'"),
        (required_keyword, "needs the argument(s) 'workspace'"),
        (lambda a, b: "agent", "needs the argument(s) 'b'"),
        (async_factory, "is async: agent factories are called synchronously"),
        ("not a callable", "is not callable"),
    ],
)
def test_factories_that_cannot_be_called_are_configuration_problems(factory: Any, problem: str) -> None:
    found = factory_problem(factory)
    assert found is not None and found.startswith(problem), found
    if callable(factory):
        with pytest.raises(FactorySignatureError, match=problem.replace("(", r"\(").replace(")", r"\)")):
            call_agent_factory(factory, AgentContext(ADA, "c1", "http"))


def test_a_factory_is_called_once_and_its_signature_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Any, ...]] = []

    def factory(context: AgentContext) -> str:
        calls.append((context,))
        return "agent"

    reads = 0
    real_signature = agents.factory.inspect.signature

    def counting_signature(target: Any) -> Any:
        nonlocal reads
        reads += 1
        return real_signature(target)

    monkeypatch.setattr(agents.factory.inspect, "signature", counting_signature)
    first, second = AgentContext(ADA, "c1", "http"), AgentContext(BOB, "c2", "websocket")
    call_agent_factory(factory, first)
    call_agent_factory(factory, second)
    assert calls == [(first,), (second,)]
    assert reads == 1


def test_a_factory_returning_a_coroutine_is_refused_without_a_warning() -> None:
    async def make() -> str:
        return "agent"

    def hides_a_coroutine() -> Any:  # looks sync: only its result tells
        return make()

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "coroutine ... was never awaited" would be a RuntimeWarning
        with pytest.raises(FactorySignatureError, match="returned an awaitable"):
            call_agent_factory(hides_a_coroutine, AgentContext(ADA, "c1", "http"))


# -- the registry hands the context to the factory ---------------------------------------------


@pytest.fixture
async def hosts() -> AsyncIterator[list[ConnectionHost]]:
    made: list[ConnectionHost] = []
    yield made
    for host in made:
        await host.terminate()
        if isinstance(host.agent, StdioAgentChannel):
            await asyncio.wait_for(host.agent.wait_closed(), 10)  # gone before the test's loop is


async def test_a_zero_argument_factory_still_works(settings: Any, hosts: list[ConnectionHost]) -> None:
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "AGENT": "tests.context_agent.zero"}
    host = registry.create(
        create_agent_channel, "http", connection_id=new_connection_id(), max_buffered_bytes=BUDGET, principal=ADA
    )
    hosts.append(host)
    assert type(host.agent) is WireAgent


async def test_the_factory_gets_the_connections_context(settings: Any, hosts: list[ConnectionHost]) -> None:
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "AGENT": "tests.context_agent.create"}
    tests.context_agent.seen.clear()
    ada = registry.create(
        create_agent_channel,
        "http",
        connection_id=new_connection_id(),
        max_buffered_bytes=BUDGET,
        principal=ADA,
        remote_address="203.0.113.9",
    )
    hosts.append(ada)
    bob = registry.create(
        create_agent_channel, "websocket", connection_id=new_connection_id(), max_buffered_bytes=BUDGET, principal=BOB
    )
    hosts.append(bob)
    assert tests.context_agent.seen == [
        AgentContext(ADA, ada.connection_id, "http", "203.0.113.9"),
        AgentContext(BOB, bob.connection_id, "websocket", None),
    ]
    assert tests.context_agent.seen[0].principal.display == "Ada Lovelace"


async def test_a_bad_factory_creates_no_connection(settings: Any) -> None:
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "AGENT": "tests.test_agent_context.two_required"}
    before = len(registry)
    with pytest.raises(FactorySignatureError):
        registry.create(
            create_agent_channel, "http", connection_id=new_connection_id(), max_buffered_bytes=BUDGET, principal=ADA
        )
    assert len(registry) == before


async def _exchange(channel: Any, message: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Send a request; its reply, and the notifications that came before it."""
    await channel.send(protocol.parse_frame(json.dumps(message)))
    before: list[dict[str, Any]] = []
    async with asyncio.timeout(20):
        while (frame := await channel.receive()) is not None:
            assert isinstance(frame, protocol.Single)
            if frame.message.get("id") == message["id"] and "method" not in frame.message:
                return frame.message, before
            before.append(frame.message)
    raise AssertionError(f"the agent ended before answering {message}")


async def _say_whoami(channel: Any) -> list[str]:
    """Drive an SDK demo agent to a `whoami` prompt: what it said."""
    await _exchange(channel, rpc(0, "initialize", {"protocolVersion": 1}))
    session = (await _exchange(channel, rpc(1, "session/new", {"cwd": "/tmp", "mcpServers": []})))[0]
    prompt = {"sessionId": session["result"]["sessionId"], "prompt": [{"type": "text", "text": "whoami"}]}
    reply, updates = await _exchange(channel, rpc(2, "session/prompt", prompt))
    assert reply["result"]["stopReason"] == "end_turn"
    return [update["params"]["update"]["content"]["text"] for update in updates]


async def test_an_sdk_agent_learns_whom_it_serves(settings: Any, hosts: list[ConnectionHost]) -> None:
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "AGENT": "demo_project.agent.create_agent"}
    host = registry.create(
        create_agent_channel,
        "websocket",
        connection_id=new_connection_id(),
        max_buffered_bytes=BUDGET,
        principal=ADA,
        remote_address="198.51.100.4",
    )
    hosts.append(host)
    channel = host.agent
    assert isinstance(channel, SdkAgentChannel)
    said = await _say_whoami(channel)
    assert said == [
        f"principal=user:Ada Lovelace connection={host.connection_id} transport=websocket remote=198.51.100.4"
    ]


async def test_the_demo_agent_as_a_subprocess_learns_whom_it_serves_from_its_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from demo_project.agent import create_agent

    for name, value in ((PRINCIPAL_KIND_ENV, "user"), (PRINCIPAL_ID_ENV, "42"), (CONNECTION_ENV, "c-env")):
        monkeypatch.setenv(name, value)
    channel = SdkAgentChannel(create_agent())  # as `python -m demo_project.agent` makes it: no context
    try:
        said = await _say_whoami(channel)
    finally:
        await channel.close()
    assert said == ["principal=user:42 connection=c-env transport=stdio"]


# -- a stdio agent's configure -----------------------------------------------------------------


@pytest.fixture
def workspaces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ACP_TEST_WORKSPACES", str(tmp_path))
    return tmp_path


async def _agent_env(channel: Any) -> dict[str, Any]:
    """What the agent process reports: {"env": its environment, "cwd": its directory}."""
    reply, _ = await _exchange(channel, rpc("env", "test/env"))
    result: dict[str, Any] = reply["result"]
    return result


@linux_only
async def test_configure_gives_each_principal_its_own_workspace(
    settings: Any, workspaces: Path, hosts: list[ConnectionHost]
) -> None:
    settings.ACP_CHANNELS = {
        **settings.ACP_CHANNELS,
        "AGENT": {"command": COMMAND, "env": {"SHARED": "yes"}, "configure": "tests.context_agent.workspace"},
        "AGENT_SHUTDOWN_GRACE": 0.3,
    }
    seen = {}
    for principal in (ADA, BOB):
        host = registry.create(
            create_agent_channel,
            "http",
            connection_id=new_connection_id(),
            max_buffered_bytes=BUDGET,
            principal=principal,
        )
        hosts.append(host)
        assert isinstance(host.agent, StdioAgentChannel)
        seen[principal.id] = (host.connection_id, await _agent_env(host.agent))
    for principal in (ADA, BOB):
        connection_id, reported = seen[principal.id]
        env = reported["env"]
        assert reported["cwd"] == str(workspaces / f"user-{principal.id}")
        assert env["AGENT_KEY"] == f"key-for-{principal.id}"  # configured, per principal
        assert env["SHARED"] == "yes"  # the setting's env, under the configured one
        assert (env[PRINCIPAL_KIND_ENV], env[PRINCIPAL_ID_ENV]) == ("user", principal.id)
        assert env[CONNECTION_ENV] == connection_id  # ours: configure cannot forge it


@linux_only
async def test_without_configure_the_agent_still_learns_its_principal(
    settings: Any, hosts: list[ConnectionHost]
) -> None:
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "AGENT": {"command": COMMAND}, "AGENT_SHUTDOWN_GRACE": 0.3}
    host = registry.create(
        create_agent_channel, "http", connection_id=new_connection_id(), max_buffered_bytes=BUDGET, principal=ADA
    )
    hosts.append(host)
    env = (await _agent_env(host.agent))["env"]
    assert (env[PRINCIPAL_KIND_ENV], env[PRINCIPAL_ID_ENV], env[CONNECTION_ENV]) == ("user", "42", host.connection_id)
    assert "Ada" not in json.dumps(env)  # the display name is for logs, not an identifier


@linux_only
@pytest.mark.parametrize(
    ("configure", "message"),
    [
        ("tests.context_agent.broken_configure", "failed: RuntimeError('this configure cannot configure')"),
        ("tests.context_agent.garbage_configure", "returned list, not a mapping of command, cwd, env"),
    ],
)
async def test_a_failing_configure_refuses_the_connection_and_starts_nothing(
    settings: Any, configure: str, message: str, hosts: list[ConnectionHost]
) -> None:
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "AGENT": {"command": COMMAND, "configure": configure}}
    before = (len(registry), dict(stdio_process._running), running_agents())
    with pytest.raises(AgentConfigurationError) as refused:
        host = registry.create(
            create_agent_channel, "http", connection_id=new_connection_id(), max_buffered_bytes=BUDGET, principal=ADA
        )
        hosts.append(host)  # not refused: stopped after the test like any other
    assert message in str(refused.value)
    assert f"({ADA})" in str(refused.value)  # whose connection it was, for the log
    assert (len(registry), dict(stdio_process._running), running_agents()) == before


@pytest.mark.parametrize(
    ("returned", "problem"),
    [
        ({"cwd": "/no/such/directory"}, "'cwd' must be None or an existing directory, not '/no/such/directory'"),
        ({"command": "just a string"}, "'command' must be a non-empty list of strings"),
        ({"command": ["no-such-acp-agent-xyz"]}, "the program 'no-such-acp-agent-xyz' was not found"),
        ({"env": {"KEY": 1}}, "'env' must be a dict of strings to strings"),
        ({"env_passthrough": ["SECRET"]}, "unknown key 'env_passthrough' (known: command, cwd, env)"),
    ],
)
def test_a_configuration_that_cannot_start_is_refused(
    returned: dict[str, Any], problem: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tests.context_agent, "garbage_configure", lambda context: returned)
    spec = {"command": COMMAND, "configure": "tests.context_agent.garbage_configure"}
    with pytest.raises(AgentConfigurationError, match="returned an unusable configuration") as refused:
        stdio_module.configured_setting(spec, AgentContext(ADA, "c1", "http"))
    assert problem in str(refused.value)


@pytest.mark.parametrize(
    ("configure", "problem"),
    [
        (None, None),
        ("tests.context_agent.workspace", None),
        (42, "'configure' must be the dotted path of a callable, not 42"),
        ("tests.context_agent.no_such_thing", "'configure' = 'tests.context_agent.no_such_thing' cannot be imported"),
        ("tests.context_agent.seen", "'configure' = 'tests.context_agent.seen' is not callable"),
        ("tests.context_agent.zero", "'configure' = 'tests.context_agent.zero' must take exactly one argument"),
        ("tests.test_agent_context.two_required", "must take exactly one argument, the connection's AgentContext"),
        ("tests.test_agent_context.async_factory", "is async: it is called synchronously"),
    ],
)
def test_the_configure_key_is_validated_with_the_setting(configure: Any, problem: str | None) -> None:
    spec: dict[str, Any] = {"command": COMMAND}
    if configure is not None:
        spec["configure"] = configure
    problems = setting_problems(spec)
    if problem is None:
        assert problems == []
    else:
        assert len(problems) == 1 and problem in problems[0], problems


# -- live ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Identity:
    """Who the live tests connect as: the server's extra settings, the request headers, and the
    principal (kind, id) the agent must see."""

    name: str
    principal: tuple[str, str]
    server_env: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)


IDENTITIES = [
    Identity("anonymous", (ANONYMOUS.kind, ANONYMOUS.id)),
    # The demo's shared bearer token (ACP_TOKEN): the principal is ("token", "team").
    Identity(
        "token",
        ("token", "team"),
        server_env={"ACP_TOKEN": "context-test-token"},
        headers={"Authorization": "Bearer context-test-token"},
    ),
]


@pytest.fixture(scope="module", params=IDENTITIES, ids=lambda identity: identity.name)
def identity(request: pytest.FixtureRequest) -> Identity:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def context_server(identity: Identity) -> Iterator[DaphneServer]:
    server = DaphneServer(env={"ACP_AGENT": "tests.context_agent.create", **identity.server_env}).start()
    yield server
    server.stop()


async def _initialize_http(http: httpx.AsyncClient, server: DaphneServer, identity: Identity) -> tuple[str, Any]:
    headers = {**JSON, **identity.headers}
    response = await http.post(server.url, headers=headers, json=rpc(0, "initialize", {"protocolVersion": 1}))
    assert response.status_code == 200, response.text
    return response.headers["acp-connection-id"], response.json()["result"]


async def _initialize_websocket(server: DaphneServer, identity: Identity) -> tuple[str, Any]:
    async with websockets.connect(server.ws_url, additional_headers=identity.headers) as socket:
        assert socket.response is not None
        connection_id = socket.response.headers["acp-connection-id"]
        await socket.send(json.dumps(rpc(0, "initialize", {"protocolVersion": 1})))
        reply = json.loads(await asyncio.wait_for(socket.recv(), 10))
    return connection_id, reply["result"]


async def _live_context(transport: str, http: httpx.AsyncClient, server: DaphneServer, identity: Identity) -> Any:
    if transport == "http":
        connection_id, result = await _initialize_http(http, server, identity)
    else:
        connection_id, result = await _initialize_websocket(server, identity)
    context = result["_meta"]["context"]
    assert context["connectionId"] == connection_id  # the id the client got
    return context


@pytest.mark.parametrize("transport", ["http", "websocket"])
async def test_live_the_factory_gets_the_context(
    transport: str, http: httpx.AsyncClient, context_server: DaphneServer, identity: Identity
) -> None:
    context = await _live_context(transport, http, context_server, identity)
    assert (context["transport"], tuple(context["principal"][:2])) == (transport, identity.principal)


@pytest.mark.parametrize("transport", ["http", "websocket"])
async def test_live_the_factory_gets_the_remote_address(
    transport: str, http: httpx.AsyncClient, context_server: DaphneServer, identity: Identity
) -> None:
    context = await _live_context(transport, http, context_server, identity)
    assert context["remoteAddress"] == "127.0.0.1"


def _configure_refusals(log: list[str], expected: int) -> dict[str, str]:
    """The logged configure failures, by connection id, once there are `expected` of them (the
    log arrives through a pipe read by a thread: polled, with a deadline)."""
    deadline = time.monotonic() + 10
    while True:
        found = {}
        for line in list(log):
            if line.startswith("acp_channels._agents.stdio.AgentConfigurationError:"):
                found[line.split("for connection ", 1)[1].split(" ", 1)[0]] = line
        if len(found) >= expected or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def _stdio_server(identity: Identity, configure: str, workspaces: Path) -> DaphneServer:
    agent = {"command": COMMAND, "configure": configure}
    env = {"ACP_AGENT": json.dumps(agent), "ACP_AGENT_SHUTDOWN_GRACE": "0.3", "ACP_TEST_WORKSPACES": str(workspaces)}
    return DaphneServer(env={**env, **identity.server_env}).start()


@pytest.fixture(scope="module")
def live_workspaces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("workspaces")


@pytest.fixture(scope="module")
def workspace_server(identity: Identity, live_workspaces: Path) -> Iterator[DaphneServer]:
    server = _stdio_server(identity, "tests.context_agent.workspace", live_workspaces)
    yield server
    server.stop()


@linux_only
@pytest.mark.parametrize("transport", ["http", "websocket"])
async def test_live_a_stdio_agent_runs_in_its_principals_workspace(
    transport: str, http: httpx.AsyncClient, workspace_server: DaphneServer, identity: Identity, live_workspaces: Path
) -> None:
    server = workspace_server
    headers = {**JSON, **identity.headers}
    if transport == "http":
        response = await http.post(server.url, headers=headers, json=rpc(0, "initialize", {"protocolVersion": 1}))
        assert response.status_code == 200, response.text
        connection_id = response.headers["acp-connection-id"]
        async with open_sse(http, server.url, connection_id, **identity.headers) as stream:
            accepted = await post(http, server.url, rpc(1, "test/env"), connection_id, **identity.headers)
            assert accepted.status_code == 202
            reported = (await stream.next())["result"]
        await http.delete(server.url, headers={"Acp-Connection-Id": connection_id, **identity.headers})
    else:
        async with websockets.connect(server.ws_url, additional_headers=identity.headers) as socket:
            assert socket.response is not None
            connection_id = socket.response.headers["acp-connection-id"]
            await socket.send(json.dumps(rpc(0, "initialize", {"protocolVersion": 1})))
            await asyncio.wait_for(socket.recv(), 10)
            await socket.send(json.dumps(rpc(1, "test/env")))
            reported = json.loads(await asyncio.wait_for(socket.recv(), 10))["result"]
    kind, principal_id = identity.principal
    assert reported["cwd"] == str(live_workspaces / f"{kind}-{principal_id}".rstrip("-"))
    env = reported["env"]
    assert (env[PRINCIPAL_KIND_ENV], env[PRINCIPAL_ID_ENV]) == identity.principal
    assert env[CONNECTION_ENV] == connection_id and env["AGENT_KEY"] == f"key-for-{principal_id or 'nobody'}"


@linux_only
@pytest.mark.parametrize("configure", ["broken_configure", "garbage_configure"])
async def test_live_a_failing_configure_gives_500_and_1011_and_no_process(
    configure: str, http: httpx.AsyncClient, identity: Identity, tmp_path: Path
) -> None:
    server = _stdio_server(identity, f"tests.context_agent.{configure}", tmp_path)
    try:
        assert server.process is not None
        headers = {**JSON, **identity.headers}
        response = await http.post(server.url, headers=headers, json=rpc(0, "initialize", {"protocolVersion": 1}))
        assert (response.status_code, response.text) == (500, "the agent could not be started (see the server log)")
        assert "acp-connection-id" not in response.headers
        async with websockets.connect(server.ws_url, additional_headers=identity.headers) as socket:
            with pytest.raises(websockets.ConnectionClosedError) as closed:
                await socket.recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1011
        assert running_agents(server.process.pid) == {}  # nothing was started, so nothing is left
        refused = _configure_refusals(server.log, 2)  # one logged refusal per connection, naming it
        assert len(refused) == 2 and configure in next(iter(refused.values()))
    finally:
        server.stop()
