"""The stdio bridge as a real process (`python -m acp_channels.bridge URL`), driven on its stdin
and stdout as an editor drives a stdio agent:

* against our demo server (one worker, and three workers on Redis), over HTTP+SSE and WebSocket:
  a session, 16 MiB messages both ways, stdin EOF (DELETE, exit 0), SIGINT/SIGTERM (close
  first, exit 128+n), the remote ending the connection and the server dying (every pending
  request answered with an error, exit 1), tokens (never printed);
* against scripted fakes: frames relayed byte for byte both ways (a batch, extension methods,
  ids of every valid type, odd spacing and escapes);
* against a published third-party stdio agent (claude-code-acp) served by our server.

The official SDK clients spawning the bridge are in test_bridge_interop.py.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.server import ServerConnection, serve

from acp_channels.bridge._stdio import LineSplitter, LineTooLong
from tests import forked
from tests.bridge_process import BridgeProcess, text_updates
from tests.cluster import Cluster
from tests.live import ROOT, DaphneServer, wait_for_line
from tests.peers.fakes import CONNECTION_ID, Answer, Drop, FakeAcp, Reply, Request, within

TRANSPORTS = ["http", "ws"]
TOKEN = "bridge-test-token-5f2c"


def endpoint(server: DaphneServer | Cluster, transport: str) -> str:
    return server.url if transport == "http" else server.ws_url


def end_reason(transport: str) -> str:
    """How the server logs the end of a connection the bridge closed."""
    return "delete" if transport == "http" else "socket closed"


def bridge_error(message: dict[str, Any]) -> str:
    """`data.acpBridge` of an error the bridge answered itself."""
    assert message.get("error", {}).get("code") == -32603, message
    why: str = message["error"]["data"]["acpBridge"]
    return why


# -- a session, and the ways it ends ---------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_session_then_stdin_eof_closes_the_connection(
    demo_server: DaphneServer | Cluster, transport: str, tmp_path: Path
) -> None:
    async with BridgeProcess(endpoint(demo_server, transport)) as bridge:
        init = await bridge.initialize(fs={"readTextFile": True, "writeTextFile": False})
        assert init["agentInfo"]["name"] == "acp-channels-demo"
        connection_id = await bridge.connection_id()
        session_id = await bridge.new_session(str(tmp_path))

        reply, before = await bridge.prompt(session_id, "stream 20 32")
        assert reply["result"] == {"stopReason": "end_turn"}
        assert text_updates(before) == [f"{i:02d}:" + "x" * 29 for i in range(20)]

        # The agent asks the editor to read a file; the editor's answer goes back through.
        request_id = await bridge.request(
            "session/prompt", {"sessionId": session_id, "prompt": [{"type": "text", "text": "fs_read /notes.txt"}]}
        )
        ask = await bridge.receive()
        assert ask["method"] == "fs/read_text_file" and ask["params"]["path"] == "/notes.txt"
        await bridge.send({"jsonrpc": "2.0", "id": ask["id"], "result": {"content": "the notes"}})
        updates: list[Any] = []
        assert (await bridge.reply_to(request_id, collect=updates))["result"] == {"stopReason": "end_turn"}
        assert text_updates(updates) == ["the notes"]

        # Not JSON: answered by the bridge itself, and the session goes on.
        await bridge.write_line("this is not json")
        assert (await bridge.receive())["error"]["code"] == -32700
        reply, before = await bridge.prompt(session_id, "echo still here")
        assert text_updates(before) == ["still here"]

        await bridge.close_stdin()
        assert await bridge.rest_of_output() == []
        assert await bridge.wait() == 0
    assert "Traceback" not in bridge.stderr
    await wait_for_line(demo_server, rf"connection ended .*connection={connection_id} .*reason={end_reason(transport)}")


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_both_kinds_of_cancel_pass_through(
    demo_server: DaphneServer | Cluster, transport: str, tmp_path: Path
) -> None:
    """`session/cancel` ends a turn (stopReason cancelled); `$/cancel_request` cancels the request
    it names (-32800), as a connection-level notification."""
    async with BridgeProcess(endpoint(demo_server, transport)) as bridge:
        await bridge.initialize()
        session_id = await bridge.new_session(str(tmp_path))
        prompt = {"sessionId": session_id, "prompt": [{"type": "text", "text": "wait_for_cancel"}]}

        turn = await bridge.request("session/prompt", prompt)
        await bridge.send({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": session_id}})
        assert (await bridge.reply_to(turn, collect=[]))["result"] == {"stopReason": "cancelled"}

        turn = await bridge.request("session/prompt", prompt)
        await bridge.send({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": turn}})
        assert (await bridge.reply_to(turn, collect=[]))["error"]["code"] == -32800
        await bridge.close_stdin()
        assert await bridge.wait() == 0


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_stdin_eof_waits_for_the_answers_still_pending(
    demo_server: DaphneServer | Cluster, transport: str
) -> None:
    """`printf '...' | acp-bridge URL` prints the answers, though stdin closed at once."""
    async with BridgeProcess(endpoint(demo_server, transport)) as bridge:
        await bridge.request("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        await bridge.request("session/new", {"cwd": str(ROOT), "mcpServers": []})
        await bridge.close_stdin()
        answers = await bridge.rest_of_output()
        assert [answer["id"] for answer in answers] == [1, 2]
        assert answers[1]["result"]["sessionId"]
        assert await bridge.wait() == 0


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_signal_closes_the_remote_connection_then_exits(
    demo_server: DaphneServer | Cluster, transport: str, signum: signal.Signals, tmp_path: Path
) -> None:
    async with BridgeProcess(endpoint(demo_server, transport)) as bridge:
        await bridge.initialize()
        connection_id = await bridge.connection_id()
        session_id = await bridge.new_session(str(tmp_path))
        waiting = await bridge.request(
            "session/prompt", {"sessionId": session_id, "prompt": [{"type": "text", "text": "wait_for_cancel"}]}
        )
        await wait_for_line(demo_server, rf"connection={connection_id}")  # the server knows it
        bridge.signal(signum)
        answer = await bridge.reply_to(waiting, collect=[])
        assert bridge_error(answer) == "interrupted"
        assert signum.name in answer["error"]["message"]
        assert await bridge.wait() == 128 + signum
    await wait_for_line(demo_server, rf"connection ended .*connection={connection_id} .*reason={end_reason(transport)}")
    assert f"{signum.name}: closing the remote connection" in bridge.stderr


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_the_remote_ending_the_connection_fails_every_pending_request(
    demo_server: DaphneServer | Cluster, transport: str, http: httpx.AsyncClient, tmp_path: Path
) -> None:
    async with BridgeProcess(endpoint(demo_server, transport)) as bridge:
        await bridge.initialize()
        connection_id = await bridge.connection_id()
        session_id = await bridge.new_session(str(tmp_path))
        prompt = {"sessionId": session_id, "prompt": [{"type": "text", "text": "wait_for_cancel"}]}
        pending = [await bridge.request("session/prompt", prompt), await bridge.request("session/list", {})]
        listed = await bridge.reply_to(pending[1])  # the server has both; the prompt is running
        assert "result" in listed
        # Someone (an operator, another worker's reaper) ends the connection on the server.
        deleted = await http.delete(demo_server.url, headers={"Acp-Connection-Id": connection_id})
        assert deleted.status_code == 202
        answer = await bridge.reply_to(pending[0], collect=[])
        assert bridge_error(answer) == "remote-lost"
        assert await bridge.rest_of_output() == []
        assert await bridge.wait() == 1
    assert "acp-bridge: remote connection lost: " in bridge.stderr
    assert "(1 pending requests answered with an error)" in bridge.stderr


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_the_server_dying_fails_every_pending_request(transport: str, tmp_path: Path) -> None:
    server = DaphneServer().start()
    try:
        # The bridge tries to resume the dropped streams, for a bounded time.
        async with BridgeProcess(endpoint(server, transport), "--reconnect-for", "2") as bridge:
            await bridge.initialize()
            session_id = await bridge.new_session(str(tmp_path))
            prompt = {"sessionId": session_id, "prompt": [{"type": "text", "text": "wait_for_cancel"}]}
            waiting = await bridge.request("session/prompt", prompt)
            await wait_for_line(server, r"connection opened")
            assert server.process is not None
            server.process.kill()
            answer = await bridge.reply_to(waiting, collect=[])
            assert bridge_error(answer) == "remote-lost"
            assert await bridge.wait() == 1
        assert "acp-bridge: remote connection lost: " in bridge.stderr
    finally:
        server.stop()


async def test_an_unreachable_server_answers_the_initialize_with_an_error() -> None:
    async with BridgeProcess("http://127.0.0.1:9/acp") as bridge:
        request_id = await bridge.request("initialize", {"protocolVersion": 1})
        answer = await bridge.reply_to(request_id)
        assert bridge_error(answer) == "remote-lost"
        assert "could not connect" in answer["error"]["message"]
        assert await bridge.wait() == 1


# -- large messages ----------------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_sixteen_mebibyte_messages_both_ways(
    demo_server: DaphneServer | Cluster, transport: str, tmp_path: Path
) -> None:
    text = "0123456789abcdef" * (1024 * 1024 - 64)  # 16 MiB less 1 KiB: the body limit is 16 MiB
    async with BridgeProcess(endpoint(demo_server, transport)) as bridge:
        await bridge.initialize()
        session_id = await bridge.new_session(str(tmp_path))
        reply, before = await bridge.prompt(session_id, "echo " + text)
        assert reply["result"] == {"stopReason": "end_turn"}
        assert text_updates(before) == [text]
        await bridge.close_stdin()
        assert await bridge.wait() == 0


async def test_a_line_over_the_limit_is_answered_and_skipped(fake: FakeAcp) -> None:
    async with BridgeProcess(fake.url, "--max-message-size", "1000") as bridge:
        await bridge.initialize()
        await bridge.write_line(json.dumps({"jsonrpc": "2.0", "id": 2, "method": "x", "params": "y" * 2000}))
        refused = await bridge.receive()
        assert refused["id"] is None and refused["error"]["code"] == -32600
        assert "longer than 1000 bytes" in refused["error"]["message"]
        await bridge.send({"jsonrpc": "2.0", "method": "_after"})
        await within(fake.wait_for(lambda: any(r.rpc_method == "_after" for r in fake.requests)))
        assert not any(b"yyyy" in request.body for request in fake.requests)
        await bridge.close_stdin()
        assert await bridge.wait() == 0


# -- byte for byte -----------------------------------------------------------------------------

#: What an editor might write: a batch with ids of every valid type (string, negative and 64-bit
#: integers, null), extension methods, a notification, escapes and non-ASCII, odd spacing.
EDITOR_BATCH = (
    '[ {"id":"req-é","jsonrpc":"2.0","method":"_zed.dev/workspace","params":{"q":"\\u00e9\\n","n":1.50e1}},'
    '{"jsonrpc":"2.0","id":-7,"method":"_ext/m","params":[]} ,{"jsonrpc":"2.0","method":"_ext/notify"},'
    '{"jsonrpc":"2.0","id":9223372036854775807,"method":"_ext/big"},{"jsonrpc":"2.0","id":null,"method":"_ext/n"}]'
)
#: What a remote might send back: the answers as one batch, in its own formatting.
REMOTE_BATCH = (
    '[{"jsonrpc": "2.0", "id": "req-é", "result": {"x": 1.50, "s": "\\ud83d\\ude00"}},'
    '{"result":null,"id":-7,"jsonrpc":"2.0"},{"jsonrpc":"2.0","id":9223372036854775807,"result":[]},'
    '{"jsonrpc":"2.0","id":null,"error":{"code":-32601,"message":"Method not found"}}]'
)
#: An agent-to-client extension request, and the editor's answer to it.
REMOTE_REQUEST = '{"jsonrpc":"2.0","id":"agent-1","method":"_vendor/ask","params":{"k":"v ü"}}'
EDITOR_ANSWER = '{"jsonrpc":"2.0","id":"agent-1","result":{ "answer" : 42 }}'


async def test_frames_pass_byte_for_byte_over_http(fake: FakeAcp) -> None:
    async with BridgeProcess(fake.url) as bridge:
        init = '{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}'
        await bridge.write_line(init)
        # FakeAcp's reply is json.dumps'd (", " and ": "): exactly that text comes out.
        expected_init = json.dumps({"jsonrpc": "2.0", "id": 0, "result": {"protocolVersion": 1}})
        assert await bridge.read_line() == expected_init
        assert fake.of("POST")[0].body == init.encode()

        await bridge.write_line(EDITOR_BATCH)
        await within(fake.wait_for(lambda: len(fake.of("POST")) == 2))
        assert fake.of("POST")[1].body == EDITOR_BATCH.encode()

        fake.push(None, REMOTE_BATCH)
        assert await bridge.read_line() == REMOTE_BATCH
        fake.push(None, REMOTE_REQUEST)
        assert await bridge.read_line() == REMOTE_REQUEST
        await bridge.write_line(EDITOR_ANSWER)
        await within(fake.wait_for(lambda: len(fake.of("POST")) == 3))
        assert fake.of("POST")[2].body == EDITOR_ANSWER.encode()

        # An event whose JSON spans two data: lines comes out as one line, the same JSON.
        fake.push(None, b'data: {"jsonrpc":"2.0",\ndata: "method":"_ext/split"}\n\n')
        assert await bridge.read_line() == '{"jsonrpc":"2.0", "method":"_ext/split"}'

        await bridge.close_stdin()
        assert await bridge.wait() == 0
    assert [request.connection_id for request in fake.of("DELETE")] == [CONNECTION_ID]


@pytest.fixture
async def fake_websocket() -> AsyncIterator[tuple[str, list[str], asyncio.Queue[str]]]:
    """A WebSocket ACP remote: records every text received, sends what a test queues."""
    received: list[str] = []
    outgoing: asyncio.Queue[str] = asyncio.Queue()

    async def handler(socket: ServerConnection) -> None:
        async def send_queued() -> None:
            while True:
                await socket.send(await outgoing.get())

        sender = asyncio.create_task(send_queued())
        try:
            async for text in socket:
                assert isinstance(text, str)
                received.append(text)
        finally:
            sender.cancel()

    async with serve(handler, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        yield f"ws://127.0.0.1:{port}/acp", received, outgoing


async def test_frames_pass_byte_for_byte_over_websocket(
    fake_websocket: tuple[str, list[str], asyncio.Queue[str]],
) -> None:
    url, received, outgoing = fake_websocket
    async with BridgeProcess(url) as bridge:
        for line in (EDITOR_BATCH, EDITOR_ANSWER):
            await bridge.write_line(line)
        for text in (REMOTE_BATCH, REMOTE_REQUEST):
            outgoing.put_nowait(text)
            assert await bridge.read_line() == text
        await bridge.close_stdin()
        assert await bridge.wait() == 0
    assert received == [EDITOR_BATCH, EDITOR_ANSWER]


# -- operation ids -----------------------------------------------------------------------------

OPERATION_ID = "acp-channels/operationId"
#: A prompt as an editor writes it (its own spacing, a _meta of its own), without an operation id.
EDITOR_PROMPT = (
    '{"jsonrpc":"2.0", "id":7, "method":"session/prompt",'
    ' "params":{"sessionId":"sess-1","prompt":[{"type":"text","text":"h\u00e9"}],"_meta":{"zed.dev/x":1}}}'
)
#: One that names its operation already: it goes byte for byte.
NAMED_PROMPT = (
    '{"jsonrpc":"2.0", "id":8, "method":"session/prompt",'
    ' "params":{"sessionId":"sess-1","prompt":[],"_meta":{"acp-channels/operationId":"op-editor-1"}}}'
)


def operation_id(message: Any) -> str:
    """The prompt's operation id: a UUID."""
    value: str = message["params"]["_meta"][OPERATION_ID]
    assert str(uuid.UUID(value)) == value
    return value


def without_operation_id(message: Any) -> Any:
    meta = {key: value for key, value in message["params"]["_meta"].items() if key != OPERATION_ID}
    return {**message, "params": {**message["params"], "_meta": meta}}


async def test_a_prompt_gets_an_operation_id_and_a_post_whose_answer_was_lost_is_sent_again(fake: FakeAcp) -> None:
    """The bridge relays raw bytes, so it gives a prompt without an operation id one (only that
    frame is serialized again); a POST of it whose answer is lost then goes again, the same
    bytes, and the editor gets one answer. A prompt naming its operation goes byte for byte."""
    dropped: list[Request] = []

    async def on_post(request: Request) -> Answer:
        if request.rpc_method == "session/prompt" and not dropped:
            dropped.append(request)
            return Drop()  # the request arrived; its answer is lost
        if request.rpc_method == "session/prompt":
            fake.push("sess-1", {"jsonrpc": "2.0", "id": request.json()["id"], "result": {"stopReason": "end_turn"}})
        return Reply(202)

    fake.on_post = on_post
    async with BridgeProcess(fake.url) as bridge:
        await bridge.initialize()
        await bridge.write_line(EDITOR_PROMPT)
        assert await bridge.receive() == {"jsonrpc": "2.0", "id": 7, "result": {"stopReason": "end_turn"}}
        first, again = fake.of("POST", rpc_method="session/prompt")
        assert again.body == first.body  # the same bytes, the same operation
        operation_id(first.json())
        assert without_operation_id(first.json()) == json.loads(EDITOR_PROMPT)

        await bridge.write_line(NAMED_PROMPT)
        assert (await bridge.receive())["id"] == 8
        assert fake.of("POST", rpc_method="session/prompt")[2].body == NAMED_PROMPT.encode()
        await bridge.close_stdin()
        assert await bridge.rest_of_output() == []
        assert await bridge.wait() == 0
    assert "reconnecting… (POST session/prompt, attempt 1)" in bridge.stderr
    assert "resumed the POST session/prompt: nothing lost" in bridge.stderr
    assert "Traceback" not in bridge.stderr


async def test_a_prompt_over_websocket_gets_an_operation_id(
    fake_websocket: tuple[str, list[str], asyncio.Queue[str]],
) -> None:
    url, received, _ = fake_websocket
    # The prompts are never answered: after stdin closes the bridge sends what it read, then
    # waits for the answers, up to --drain-timeout.
    async with BridgeProcess(url, "--drain-timeout", "1") as bridge:
        for line in (EDITOR_PROMPT, NAMED_PROMPT, EDITOR_ANSWER):
            await bridge.write_line(line)
        await bridge.close_stdin()
        await bridge.wait()
    stamped, named, answer = received
    operation_id(json.loads(stamped))
    assert without_operation_id(json.loads(stamped)) == json.loads(EDITOR_PROMPT)
    assert (named, answer) == (NAMED_PROMPT, EDITOR_ANSWER)


# -- credentials -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def token_server() -> Iterator[DaphneServer]:
    """The demo with the shared bearer token turned on (ACP_TOKEN on the server side)."""
    # The bridge's --token-subprotocol is the old browser form: opt-in on the server.
    server = DaphneServer(env={"ACP_TOKEN": TOKEN, "ACP_ALLOW_BEARER_SUBPROTOCOL": "1"}).start()
    yield server
    server.stop()


@pytest.mark.parametrize(
    ("args", "env"),
    [
        pytest.param([], {"ACP_TOKEN": TOKEN}, id="environment"),
        pytest.param(["--token", TOKEN], {}, id="option"),
        pytest.param(["-H", f"Authorization: Bearer {TOKEN}"], {}, id="header"),
        pytest.param(["--token", TOKEN, "--token-subprotocol"], {}, id="subprotocol"),
    ],
)
async def test_credentials_reach_the_server_and_are_never_printed(
    token_server: DaphneServer, args: list[str], env: dict[str, str]
) -> None:
    transport = "ws" if "--token-subprotocol" in args else "http"
    async with BridgeProcess(endpoint(token_server, transport), "-v", *args, env=env) as bridge:
        init = await bridge.initialize()
        assert init["agentInfo"]["name"] == "acp-channels-demo"
        await bridge.close_stdin()
        assert await bridge.wait() == 0
    assert TOKEN not in bridge.stderr


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_wrong_token_is_refused_clearly(token_server: DaphneServer, transport: str) -> None:
    wrong = "not-the-token-83c1"
    async with BridgeProcess(endpoint(token_server, transport), "-v", env={"ACP_TOKEN": wrong}) as bridge:
        request_id = await bridge.request("initialize", {"protocolVersion": 1})
        answer = await bridge.reply_to(request_id)
        assert bridge_error(answer) == "remote-lost"
        assert "401" in answer["error"]["message"] or "403" in answer["error"]["message"]
        assert await bridge.wait() == 1
    assert wrong not in bridge.stderr and wrong not in json.dumps(answer)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["ftp://example.com"], "not an http(s):// or ws(s):// URL"),
        (["http://127.0.0.1:9", "--token", "has space"], "space"),
        (["http://127.0.0.1:9", "--token", "t", "-H", "Authorization: Basic eA=="], "not both"),
        (["http://127.0.0.1:9", "--max-message-size", "0"], "must be positive"),
        (["http://127.0.0.1:9", "--reconnect-for", "-1"], "must not be negative"),
        (["http://127.0.0.1:9", "--restart", "--no-reconnect"], "--restart needs reconnecting"),
    ],
)
def test_bad_usage_exits_2_with_one_line(argv: list[str], message: str) -> None:
    result = forked.run(
        [sys.executable, "-m", "acp_channels.bridge", *argv],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr


# -- a published third-party agent behind our server ----------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_claude_code_acp_through_the_bridge(claude_server: DaphneServer, transport: str, tmp_path: Path) -> None:
    async with BridgeProcess(endpoint(claude_server, transport)) as bridge:
        init = await bridge.initialize()
        assert init["agentInfo"]["name"] == "@zed-industries/claude-code-acp"
        connection_id = await bridge.connection_id()
        result = await bridge.call("session/new", {"cwd": str(tmp_path), "mcpServers": []}, collect=[])
        assert result["sessionId"]
        await bridge.close_stdin()
        await bridge.rest_of_output(60)
        assert await bridge.wait(60) == 0
    await wait_for_line(claude_server, rf"connection ended .*connection={connection_id}", timeout=30)


# -- the line splitter -------------------------------------------------------------------------


def test_line_splitter_cuts_lines_across_chunks_and_skips_long_ones() -> None:
    splitter = LineSplitter(limit=5)
    assert splitter.feed(b"ab") == []
    assert splitter.feed(b"c\nde\n12") == [b"abc", b"de"]
    out = splitter.feed(b"3456789")  # "123456789": over the limit before its newline
    assert len(out) == 1 and isinstance(out[0], LineTooLong)
    assert splitter.feed(b"xyz\nok\n") == [b"ok"]  # the rest of the long line is dropped
    out = splitter.feed(b"toolong\nfine\n")  # over the limit within one chunk
    assert isinstance(out[0], LineTooLong) and out[1:] == [b"fine"]
    assert splitter.feed(b"last") == []
    assert splitter.finish() == b"last"
