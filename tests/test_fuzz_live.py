"""Fuzzing a live daphne over raw sockets: random bodies, headers, methods, paths, WebSocket
frames and abrupt disconnects, against the demo agent and the scripted wire agent.

Properties, for every input: never a 5xx, never a hang (each request gets a response or a clean
close within REQUEST_TIMEOUT), no traceback in the server's log; and after the fuzzing a fresh
client is served (initialize, session/new and a prompt round trip).

Hypothesis runs a fixed, modest number of derandomized examples (deadline None: the server is
on a shared machine); sizes that Hypothesis would be slow to build (multi-megabyte strings) come
from a seeded generator. Inputs go over raw sockets (tests/rawhttp.py) because httpx and
websockets would normalise them. What the fuzzing found (F1-F4) stays as explicit regression
tests.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import random
import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import malformed, rawhttp
from tests.live import DaphneServer, initialize, open_sse, post, rpc
from tests.rawhttp import Closed, Hang, RawResponse, SseStream, WsReader

REQUEST_TIMEOUT = 10.0
#: For a body of megabytes whose answers (as large) must be read before the next one is taken.
HUGE_TIMEOUT = 60.0
MAX_BODY = 16 * 1024 * 1024
FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

pytestmark = pytest.mark.timeout(90)


# -- servers -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo() -> Iterator[DaphneServer]:
    server = DaphneServer(env={"ACP_KEEPALIVE_SECONDS": "0.5"}).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def wire() -> Iterator[DaphneServer]:
    server = DaphneServer(env={"ACP_AGENT": "tests.wire_agent.create", "ACP_KEEPALIVE_SECONDS": "0.5"}).start()
    yield server
    server.stop()


class Drain:
    """Reads one stream in a thread and throws the events away, so a fuzzed connection's output
    never fills its budget (backpressure would be the server doing its job, not a finding)."""

    def __init__(self, port: int, connection_id: str, session_id: str | None = None) -> None:
        self.stream = SseStream.open(port, connection_id, session_id)
        assert self.stream.status == 200
        self.events = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with contextlib.suppress(OSError, Hang, ValueError):
            for _ in self.stream.events(3600.0):
                self.events += 1

    def close(self) -> None:
        self.stream.close()
        self._thread.join(5)


@pytest.fixture(scope="module")
def demo_connection(demo: DaphneServer) -> Iterator[str]:
    """One initialized demo connection whose connection stream is drained."""
    connection_id = rawhttp.initialize(demo.port)
    drain = Drain(demo.port, connection_id)
    yield connection_id
    drain.close()
    rawhttp.delete(demo.port, connection_id)


# -- properties -----------------------------------------------------------------------------------


def served(result: RawResponse | Closed, what: Any = "") -> RawResponse | Closed:
    """Never a 5xx (a clean close is acceptable for hostile input)."""
    if isinstance(result, RawResponse):
        assert result.status < 500, f"{result.status} {result.body[:300]!r} for {what!r:.300}"
    return result


def exchange(
    port: int, raw: bytes, *, head_only: bool = True, half_close: bool = False, timeout: float = REQUEST_TIMEOUT
) -> RawResponse | Closed:
    """Send exactly `raw` and read one response head (or the close) within `timeout`; a hang
    fails the test. `half_close` shuts our sending side after the bytes."""
    with rawhttp.connect(port, timeout) as sock:
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            sock.sendall(raw)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
        try:
            result = rawhttp.read_response(sock, timeout, head_only=head_only)
        except Hang as error:
            pytest.fail(f"no response and no close within {timeout} s for {raw[:300]!r}: {error}")
    return served(result, raw[:300])


def forget_connection(port: int, result: RawResponse | Closed) -> None:
    """An initialize the fuzzer happened to get accepted is ended, so connections do not pile up."""
    if isinstance(result, RawResponse) and (connection_id := result.header("acp-connection-id")):
        rawhttp.delete(port, connection_id)


def log_errors(server: DaphneServer, start: int) -> list[str]:
    return DaphneServer(log=server.log[start:]).errors()


@contextlib.contextmanager
def clean_log(*servers: DaphneServer) -> Iterator[None]:
    """No traceback (and no 500) in these servers' logs while the block ran."""
    starts = [len(server.log) for server in servers]
    yield
    time.sleep(0.2)  # lets the log pump thread catch up with lines already written
    for server, start in zip(servers, starts, strict=True):
        assert log_errors(server, start) == [], "".join(server.log[start:])[-4000:]


def hang_up(sock: socket.socket, reset: bool) -> None:
    """Close, with a TCP reset (SO_LINGER 0) when `reset`: a client that crashed or lost its
    network; else an orderly FIN."""
    if reset:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def open_stream_once_released(port: int, connection_id: str, session_id: str) -> SseStream:
    """GET a stream whose previous reader just hung up: the server learns of the hang-up
    asynchronously, so a 409 may come first; poll (no event tells us) up to REQUEST_TIMEOUT."""
    deadline = time.monotonic() + REQUEST_TIMEOUT
    while True:
        stream = SseStream.open(port, connection_id, session_id)
        if stream.status == 200 or time.monotonic() > deadline:
            return stream
        stream.close()
        time.sleep(0.05)


# -- strategies -----------------------------------------------------------------------------------

JSON_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40)
)
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=12), children, max_size=5),
    max_leaves=25,
)
REAL_METHODS = [
    "initialize", "authenticate", "session/new", "session/load", "session/prompt", "session/cancel",
    "session/set_mode", "session/list", "session/fork", "session/resume", "session/close",
    "$/cancel_request", "_proxy/successor", "fs/read_text_file", "session/request_permission",
]  # fmt: skip
METHODS = st.sampled_from(REAL_METHODS) | st.text(max_size=20)
IDS = st.none() | st.integers(min_value=-(2**64), max_value=2**64) | st.text(max_size=12) | JSON_LEAVES
SESSION_PARAMS = st.fixed_dictionaries(
    {},
    optional={
        "sessionId": st.text(max_size=20) | JSON_LEAVES,
        "prompt": st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=30)}), max_size=2)
        | JSON_VALUES,
        "cwd": st.text(max_size=10),
        "protocolVersion": st.integers(-5, 5) | JSON_LEAVES,
        "requestId": IDS,
    },
)
MESSAGES = st.fixed_dictionaries(
    {"jsonrpc": st.just("2.0") | JSON_LEAVES},
    optional={
        "id": IDS,
        "method": METHODS,
        "params": SESSION_PARAMS | JSON_VALUES,
        "result": JSON_VALUES,
        "error": JSON_VALUES | st.fixed_dictionaries({"code": st.integers(), "message": st.text(max_size=10)}),
    },
)
BATCHES = st.lists(MESSAGES | JSON_VALUES, max_size=30)
NESTED = st.tuples(st.sampled_from(["[", '{"a":', '[{"jsonrpc":"2.0","x":']), st.integers(1, 20000), st.booleans()).map(
    lambda t: (t[0] * t[1] + ("null" + ("]" if t[0] == "[" else "}") * t[1] if t[2] else "")).encode()
)
BODIES = (
    (MESSAGES | BATCHES | JSON_VALUES).map(lambda value: json.dumps(value).encode())
    | st.binary(max_size=300)
    | st.text(max_size=200).map(lambda text: text.encode("utf-8", "surrogatepass"))
    | NESTED
    | st.sampled_from(malformed.ALL)  # the fixed list, which tests/test_malformed_logs_live.py sends too
)


# -- bodies ---------------------------------------------------------------------------------------


def test_random_bodies(demo: DaphneServer, demo_connection: str) -> None:
    @FUZZ
    @given(body=BODIES, with_session=st.booleans())
    def fuzz(body: bytes, with_session: bool) -> None:
        headers = [
            ("Content-Type", "application/json"),
            ("Acp-Connection-Id", demo_connection),
            ("Connection", "close"),
        ]
        if with_session:
            headers.append(("Acp-Session-Id", "fuzz-session"))
        result = exchange(demo.port, rawhttp.request_bytes("POST", "/acp", headers, body))
        forget_connection(demo.port, result)

    with clean_log(demo):
        fuzz()


def test_random_bodies_without_a_connection(wire: DaphneServer) -> None:
    """Bodies that may be an initial initialize (alone or in a batch) create connections."""

    @FUZZ
    @given(body=BODIES)
    def fuzz(body: bytes) -> None:
        headers = [("Content-Type", "application/json"), ("Connection", "close")]
        result = exchange(wire.port, rawhttp.request_bytes("POST", "/acp", headers, body))
        forget_connection(wire.port, result)

    with clean_log(wire):
        fuzz()


def test_huge_strings_within_the_body_limit(demo: DaphneServer, demo_connection: str) -> None:
    """Multi-megabyte strings in every place a string can go, up to the body limit, then just over."""
    generator = random.Random(9)
    with clean_log(demo):
        for size in (1 << 20, MAX_BODY - 200):
            filler = "".join(generator.choices('abcé€\U0001f600\\"', k=64)) * (size // 256)
            for body in (
                json.dumps({"jsonrpc": "2.0", "id": 1, "method": filler}),
                json.dumps({"jsonrpc": "2.0", "id": filler, "method": "authenticate"}),
                json.dumps({"jsonrpc": "2.0", "id": 2, "method": "authenticate", "params": {"methodId": filler}}),
                json.dumps([filler]),
            ):
                data = body.encode()[:MAX_BODY]
                headers = [("Content-Type", "application/json"), ("Acp-Connection-Id", demo_connection)]
                # The POST waits while the agent's 16 MB answers to the bodies before fill the
                # connection's budget and the drain reads them: seconds of CPU on a busy machine.
                result = exchange(demo.port, rawhttp.request_bytes("POST", "/acp", headers, data), timeout=HUGE_TIMEOUT)
                assert isinstance(result, RawResponse) and result.status in (202, 400, 413), result
        over = b'"' + b"x" * MAX_BODY + b'"'
        headers = [("Content-Type", "application/json"), ("Acp-Connection-Id", demo_connection)]
        result = exchange(demo.port, rawhttp.request_bytes("POST", "/acp", headers, over))
        assert isinstance(result, RawResponse) and result.status == 413, result


def test_large_batches_of_random_shapes(demo: DaphneServer, demo_connection: str) -> None:
    """Batches around and well past the default MAX_BATCH_ENTRIES (1000), mixing requests,
    notifications, responses, duplicate ids and junk entries: an answer for each, never a 5xx."""
    generator = random.Random(11)

    def entry(index: int) -> Any:
        kind = generator.randrange(6)
        if kind == 0:
            return rpc(index, "authenticate", {"methodId": "x"})
        if kind == 1:
            return rpc(generator.choice([1, "1", index, None]), generator.choice(REAL_METHODS), {})
        if kind == 2:
            return {"jsonrpc": "2.0", "method": "_fuzz/note", "params": {"n": index}}
        if kind == 3:
            return {"jsonrpc": "2.0", "id": f"agent-{index}", "result": None}
        if kind == 4:
            return generator.choice([None, 1, "x", [], {}, [[]], {"jsonrpc": "1.0"}])
        return {"jsonrpc": "2.0", "id": index, "method": "x" * generator.randrange(1, 2000)}

    headers = [("Content-Type", "application/json"), ("Acp-Connection-Id", demo_connection)]
    with clean_log(demo):
        for size in (1, 999, 1000, 1001, 5000, 20000):
            body = json.dumps([entry(index) for index in range(size)]).encode()
            result = exchange(demo.port, rawhttp.request_bytes("POST", "/acp", headers, body))
            assert isinstance(result, RawResponse) and result.status in (202, 400, 413, 429), (size, result)
        probe = exchange(demo.port, rawhttp.request_bytes("POST", "/acp", headers, json.dumps(rpc(5, "x")).encode()))
        assert isinstance(probe, RawResponse) and probe.status == 202, probe


def test_unknown_notification_is_not_logged_as_a_traceback(demo: DaphneServer) -> None:
    start = len(demo.log)
    connection_id = rawhttp.initialize(demo.port)
    stream = SseStream.open(demo.port, connection_id)
    try:
        for method in ("foo/bar", "initialize", "session/update"):
            result = rawhttp.post_json(demo.port, {"jsonrpc": "2.0", "method": method}, connection_id)
            assert isinstance(result, RawResponse) and result.status == 202, result
        # A request queued behind the notifications: once it is answered, they were handled.
        result = rawhttp.post_json(demo.port, rpc("after", "authenticate", {"methodId": "x"}), connection_id)
        assert isinstance(result, RawResponse) and result.status == 202, result
        stream.until_reply("after")
    finally:
        stream.close()
        rawhttp.delete(demo.port, connection_id)
    # The log is read by a thread: poll for the traceback a little (no event says "all read").
    deadline = time.monotonic() + 1.0
    while not log_errors(demo, start) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert log_errors(demo, start) == [], "".join(demo.log[start:])[-2000:]


# -- headers ---------------------------------------------------------------------------------------

HEADER_TEXT = st.binary(max_size=40).filter(lambda b: b"\r" not in b and b"\n" not in b) | st.text(max_size=40).map(
    lambda text: text.encode("utf-8", "surrogatepass").replace(b"\r", b"").replace(b"\n", b"")
)
CONTENT_TYPES = (
    st.sampled_from(
        [
            b"application/json",
            b"application/json; charset=utf-8",
            b"APPLICATION/JSON",
            b"application/json-seq",
            b"application/jsonx",
            b"text/plain",
            b"",
            b"application/json\xff",
            b"application/json;;;",
            b" application/json",
            b"multipart/form-data; boundary=x",
            b"application/x-www-form-urlencoded",
        ]
    )
    | HEADER_TEXT
)
HEADER_NAMES = st.sampled_from(
    [
        b"Content-Type",
        b"Acp-Connection-Id",
        b"Acp-Session-Id",
        b"Accept",
        b"Content-Length",
        b"Transfer-Encoding",
        b"Origin",
        b"Connection",
        b"Expect",
        b"Host",
        b"Upgrade",
        b"Last-Event-ID",
        b"Authorization",
        b"Content-Encoding",
        b"acp-connection-id",
        b"ACP-SESSION-ID",
    ]
) | st.binary(min_size=1, max_size=20).filter(lambda b: b":" not in b and b"\r" not in b and b"\n" not in b)
LENGTH_LIES = st.sampled_from(["none", "short", "long", "garbage", "double", "huge-digits", "negative", "chunked-bad"])


def _length_headers(lie: str, body: bytes) -> tuple[list[tuple[bytes, bytes]], bytes, bool]:
    """Headers, body and half-close for one kind of Content-Length lie."""
    size = len(body)
    if lie == "short":
        return [(b"Content-Length", str(max(size - 3, 0)).encode())], body, False
    if lie == "long":  # more declared than sent: we half-close, so the server sees the body end early
        return [(b"Content-Length", str(size + 50).encode())], body, True
    if lie == "garbage":
        return [(b"Content-Length", b"12abc")], body, False
    if lie == "double":
        return [(b"Content-Length", str(size).encode()), (b"Content-Length", str(size + 1).encode())], body, False
    if lie == "negative":
        return [(b"Content-Length", b"-1")], body, False
    if lie == "huge-digits":  # under the body limit once parsed, but absurd text
        return [(b"Content-Length", b"0" * 500 + str(size).encode())], body, False
    if lie == "chunked-bad":
        return [(b"Transfer-Encoding", b"chunked")], b"zz\r\n" + body + b"\r\n0\r\n\r\n", False
    return [(b"Content-Length", str(size).encode())], body, False


def test_random_headers(demo: DaphneServer, demo_connection: str) -> None:
    @FUZZ
    @given(
        content_type=CONTENT_TYPES,
        connection=st.sampled_from(["valid", "none", "junk", "twice", "long"]),
        connection_junk=HEADER_TEXT,
        session=st.none() | HEADER_TEXT,
        extra=st.lists(st.tuples(HEADER_NAMES, HEADER_TEXT), max_size=4),
        lie=LENGTH_LIES,
        initialize_body=st.booleans(),
    )
    def fuzz(
        content_type: bytes,
        connection: str,
        connection_junk: bytes,
        session: bytes | None,
        extra: list[tuple[bytes, bytes]],
        lie: str,
        initialize_body: bool,
    ) -> None:
        headers: list[tuple[bytes, bytes]] = [(b"Content-Type", content_type), (b"Connection", b"close")]
        valid = demo_connection.encode()
        if connection == "valid":
            headers.append((b"Acp-Connection-Id", valid))
        elif connection == "junk":
            headers.append((b"Acp-Connection-Id", connection_junk))
        elif connection == "twice":
            headers += [(b"Acp-Connection-Id", connection_junk), (b"Acp-Connection-Id", valid)]
        elif connection == "long":
            headers.append((b"Acp-Connection-Id", valid * 300))
        if session is not None:
            headers.append((b"Acp-Session-Id", session))
        headers += [
            (name, value) for name, value in extra if name.lower() not in (b"content-length", b"transfer-encoding")
        ]
        message = rpc(0, "initialize", {"protocolVersion": 1}) if initialize_body else rpc(1, "authenticate")
        length_headers, body, half_close = _length_headers(lie, json.dumps(message).encode())
        raw = rawhttp.request_bytes("POST", "/acp", headers + length_headers, body, content_length=False)
        result = exchange(demo.port, raw, half_close=half_close)
        forget_connection(demo.port, result)

    with clean_log(demo):
        fuzz()


def test_declared_length_over_the_limit_is_refused_before_the_body(demo: DaphneServer, demo_connection: str) -> None:
    headers = [
        ("Content-Type", "application/json"),
        ("Acp-Connection-Id", demo_connection),
        ("Content-Length", str(MAX_BODY + 1)),
    ]
    with rawhttp.connect(demo.port, REQUEST_TIMEOUT) as sock:
        sock.sendall(rawhttp.request_bytes("POST", "/acp", headers) + b"[")
        try:
            result = rawhttp.read_response(sock, 3.0, head_only=True)
        except Hang:
            pytest.fail("no answer to a declared 16 MiB + 1 body within 3 s")
    assert isinstance(result, RawResponse) and result.status == 413, result


# -- methods and paths ----------------------------------------------------------------------------

HTTP_METHODS = st.sampled_from(
    [
        b"GET",
        b"POST",
        b"PUT",
        b"PATCH",
        b"DELETE",
        b"HEAD",
        b"OPTIONS",
        b"TRACE",
        b"CONNECT",
        b"get",
        b"PRI",
        b"PROPFIND",
        b"G\xc3\x89T",
    ]
) | st.binary(min_size=1, max_size=12).filter(lambda b: b" " not in b and b"\r" not in b and b"\n" not in b)
PATHS = st.sampled_from(
    [
        b"/acp",
        b"/acp/",
        b"/ACP",
        b"/acp?x=1",
        b"/acp/../acp",
        b"/acp%00",
        b"/health",
        b"*",
        b"/",
        b"http://127.0.0.1/acp",
        b"//acp",
        b"/acp#frag",
        b"/%ff%fe",
        b"/acp?" + b"a" * 8000,
        b"/" + b"x" * 20000,
    ]
) | st.binary(min_size=1, max_size=60).filter(lambda b: b" " not in b and b"\r" not in b and b"\n" not in b)
VERSIONS = st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"HTTP/0.9", b"HTTX/1.1", b""])


def test_random_methods_and_paths(demo: DaphneServer, demo_connection: str) -> None:
    @FUZZ
    @given(
        method=HTTP_METHODS,
        path=PATHS,
        version=VERSIONS,
        accept_sse=st.booleans(),
        with_connection=st.booleans(),
        body=st.none() | st.binary(max_size=50),
    )
    def fuzz(
        method: bytes, path: bytes, version: bytes, accept_sse: bool, with_connection: bool, body: bytes | None
    ) -> None:
        headers: list[tuple[bytes, bytes]] = [(b"Connection", b"close")]
        if accept_sse:
            headers.append((b"Accept", b"text/event-stream"))
        if with_connection:
            headers += [(b"Acp-Connection-Id", demo_connection.encode()), (b"Acp-Session-Id", b"fuzz-paths")]
        exchange(demo.port, rawhttp.request_bytes(method, path, headers, body, version=version))

    with clean_log(demo):
        fuzz()


def test_a_second_reader_of_a_stream_gets_409(demo: DaphneServer, demo_connection: str) -> None:
    """The drain reads the connection stream; another GET for it is refused, not shared."""
    result = exchange(demo.port, rawhttp.stream_request(demo_connection))
    assert isinstance(result, RawResponse) and result.status == 409, result


# -- WebSocket ---------------------------------------------------------------------------------------

FRAME_KINDS = st.sampled_from(
    [
        "json-rpc",
        "random-json",
        "text",
        "invalid-utf8",
        "binary",
        "fragmented",
        "ping",
        "pong",
        "unmasked",
        "reserved-bits",
        "reserved-opcode",
        "big-ping",
        "continuation-alone",
        "close",
    ]
)


def _ws_frames(kind: str, data: Any, text: str, blob: bytes) -> list[bytes]:
    frame = rawhttp.ws_frame
    if kind == "json-rpc":
        return [frame(rawhttp.TEXT, json.dumps(data).encode())]
    if kind == "random-json":
        return [frame(rawhttp.TEXT, json.dumps(data).encode("utf-8", "surrogatepass"))]
    if kind == "text":
        return [frame(rawhttp.TEXT, text.encode("utf-8", "surrogatepass"))]
    if kind == "invalid-utf8":
        return [frame(rawhttp.TEXT, b'{"jsonrpc":"2.0","id":1,"method":"\xff\xfe"}')]
    if kind == "binary":
        return [frame(rawhttp.BINARY, blob)]
    if kind == "fragmented":
        payload = json.dumps(data).encode()
        cut = len(payload) // 2
        return [
            frame(rawhttp.TEXT, payload[:cut], fin=False),
            frame(rawhttp.PING, b"mid"),
            frame(rawhttp.CONTINUATION, payload[cut:]),
        ]
    if kind == "ping":
        return [frame(rawhttp.PING, blob[:125])]
    if kind == "pong":
        return [frame(rawhttp.PONG, blob[:125])]
    if kind == "unmasked":
        return [frame(rawhttp.TEXT, b'{"jsonrpc":"2.0","id":7,"method":"x"}', mask=False)]
    if kind == "reserved-bits":
        return [frame(rawhttp.TEXT, b"{}", rsv=5)]
    if kind == "reserved-opcode":
        return [frame(0x3, blob)]
    if kind == "big-ping":
        return [frame(rawhttp.PING, b"p" * 200)]
    if kind == "continuation-alone":
        return [frame(rawhttp.CONTINUATION, blob)]
    code = data if isinstance(data, int) and 0 <= data < 65536 else 1000
    return [frame(rawhttp.CLOSE, code.to_bytes(2, "big") + text.encode("utf-8", "surrogatepass")[:100])]


def test_websocket_frames(wire: DaphneServer) -> None:
    """Random frames, then a probe request: the server answers it or has closed; never a hang."""

    @FUZZ
    @given(
        steps=st.lists(
            st.tuples(FRAME_KINDS, MESSAGES | JSON_VALUES, st.text(max_size=30), st.binary(max_size=200)),
            min_size=1,
            max_size=8,
        )
    )
    def fuzz(steps: list[tuple[str, Any, str, bytes]]) -> None:
        sock, answer = rawhttp.ws_handshake(wire.port, (), REQUEST_TIMEOUT)
        with sock:
            assert isinstance(answer, RawResponse) and answer.status == 101, answer
            with contextlib.suppress(ConnectionResetError, BrokenPipeError):
                for kind, data, text, blob in steps:
                    for frame in _ws_frames(kind, data, text, blob):
                        sock.sendall(frame)
                sock.sendall(rawhttp.ws_frame(rawhttp.TEXT, json.dumps(rpc("probe", "test/probe")).encode()))
            frames = WsReader(sock, answer.body)
            try:
                while (received := frames.next(REQUEST_TIMEOUT)) is not None:
                    opcode, payload = received
                    if opcode == rawhttp.CLOSE:
                        break
                    if opcode == rawhttp.TEXT:
                        value = json.loads(payload)
                        if isinstance(value, dict) and value.get("id") == "probe" and "method" not in value:
                            break
            except Hang:
                pytest.fail(f"WebSocket neither answered the probe nor closed after {steps!r:.500}")

    with clean_log(wire):
        fuzz()


WS_KEY = b"dGhlIHNhbXBsZSBub25jZQ=="
WS_HEADER_NAMES = (
    st.sampled_from(
        [
            b"Upgrade",
            b"Connection",
            b"Sec-WebSocket-Key",
            b"Sec-WebSocket-Version",
            b"Sec-WebSocket-Protocol",
            b"Sec-WebSocket-Extensions",
            b"Origin",
            b"Authorization",
            b"Acp-Connection-Id",
            b"Host",
        ]
    )
    | HEADER_NAMES
)


def test_websocket_handshakes(wire: DaphneServer) -> None:
    """Upgrade requests with random and missing handshake headers, paths and Origins get an HTTP
    answer (101 or 4xx) or a close, never a hang or a 5xx; an accepted socket is closed by us."""

    @FUZZ
    @given(
        drop=st.sets(st.sampled_from([b"Upgrade", b"Connection", b"Sec-WebSocket-Key", b"Sec-WebSocket-Version"])),
        replace=st.dictionaries(
            st.sampled_from([b"Upgrade", b"Connection", b"Sec-WebSocket-Key", b"Sec-WebSocket-Version"]),
            HEADER_TEXT,
            max_size=2,
        ),
        extra=st.lists(st.tuples(WS_HEADER_NAMES, HEADER_TEXT), max_size=4),
        path=st.just(b"/acp") | PATHS,
    )
    def fuzz(drop: set[bytes], replace: dict[bytes, bytes], extra: list[tuple[bytes, bytes]], path: bytes) -> None:
        base = {
            b"Upgrade": b"websocket",
            b"Connection": b"Upgrade",
            b"Sec-WebSocket-Key": WS_KEY,
            b"Sec-WebSocket-Version": b"13",
            **replace,
        }
        headers = [(name, value) for name, value in base.items() if name not in drop] + extra
        exchange(wire.port, rawhttp.request_bytes(b"GET", path, headers))

    with clean_log(wire):
        fuzz()


def _upgrade(path: bytes, *extra: tuple[bytes, bytes]) -> bytes:
    headers = [
        (b"Upgrade", b"websocket"),
        (b"Connection", b"Upgrade"),
        (b"Sec-WebSocket-Key", WS_KEY),
        (b"Sec-WebSocket-Version", b"13"),
        *extra,
    ]
    return rawhttp.request_bytes(b"GET", path, headers)


def test_non_ascii_subprotocol_is_refused_cleanly(wire: DaphneServer) -> None:
    start = len(wire.log)
    result = exchange(wire.port, _upgrade(b"/acp", (b"Sec-WebSocket-Protocol", b"acp, \xff")))
    assert isinstance(result, RawResponse) and 400 <= result.status < 500, result
    assert log_errors(wire, start) == []


def test_websocket_upgrade_to_another_path_is_refused_cleanly(wire: DaphneServer) -> None:
    start = len(wire.log)
    for path in (b"/nope", b"/acp/", b"/health"):
        result = exchange(wire.port, _upgrade(path))
        assert isinstance(result, RawResponse) and 400 <= result.status < 500, (path, result)
    assert log_errors(wire, start) == []


# -- abrupt disconnects ----------------------------------------------------------------------------


def test_requests_cut_short(demo: DaphneServer, demo_connection: str) -> None:
    """A POST cut anywhere in its head or body, closed with FIN or RST; then the server still
    answers this connection at once."""
    headers = [("Content-Type", "application/json"), ("Acp-Connection-Id", demo_connection)]
    probe = rawhttp.request_bytes("POST", "/acp", headers, json.dumps(rpc(4, "x")).encode())

    @FUZZ
    @given(cut=st.floats(0.0, 1.0), reset=st.booleans(), body_size=st.integers(0, 200_000))
    def fuzz(cut: float, reset: bool, body_size: int) -> None:
        body = json.dumps(rpc(3, "authenticate", {"methodId": "x" * body_size})).encode()
        raw = rawhttp.request_bytes("POST", "/acp", headers, body)
        sock = rawhttp.connect(demo.port, REQUEST_TIMEOUT)
        with contextlib.suppress(OSError):
            sock.sendall(raw[: int(len(raw) * cut)])
        hang_up(sock, reset)
        result = exchange(demo.port, probe)
        assert isinstance(result, RawResponse) and result.status == 202, result

    with clean_log(demo):
        fuzz()


def _session(port: int, connection_id: str, stream: SseStream, request_id: int) -> str:
    result = rawhttp.post_json(port, rpc(request_id, "session/new", {"cwd": "/tmp", "mcpServers": []}), connection_id)
    assert isinstance(result, RawResponse) and result.status == 202, result
    reply = stream.until_reply(request_id)
    return str(reply["result"]["sessionId"])


def test_disconnects_mid_stream(demo: DaphneServer) -> None:
    """SSE and WebSocket readers that vanish (FIN or RST) while the agent streams, after reading a
    random amount; each time the stream can be read again at once and a prompt still completes."""
    generator = random.Random(5)
    with clean_log(demo):
        connection_id = rawhttp.initialize(demo.port)
        stream = SseStream.open(demo.port, connection_id)
        session_id = _session(demo.port, connection_id, stream, 1)
        for round_number in range(6):
            reader = open_stream_once_released(demo.port, connection_id, session_id)
            assert reader.status == 200, f"the stream was not released after round {round_number - 1}"
            result = rawhttp.post_json(
                demo.port, rawhttp_prompt(100 + round_number, session_id, "stream 3000 512"), connection_id, session_id
            )
            assert isinstance(result, RawResponse) and result.status == 202, result
            for _ in itertools.islice(reader.events(REQUEST_TIMEOUT), generator.randrange(1, 400)):
                pass
            hang_up(reader.sock, generator.random() < 0.5)
        # The last prompts' output is still queued for the session stream: a new reader gets it all.
        reader = open_stream_once_released(demo.port, connection_id, session_id)
        result = rawhttp.post_json(
            demo.port, rawhttp_prompt(200, session_id, "echo still here"), connection_id, session_id
        )
        assert isinstance(result, RawResponse) and result.status == 202
        reply = reader.until_reply(200, timeout=REQUEST_TIMEOUT)
        assert reply["result"]["stopReason"] == "end_turn"
        reader.close()
        stream.close()
        rawhttp.delete(demo.port, connection_id)

        for _ in range(4):
            sock, answer = rawhttp.ws_handshake(demo.port)
            assert isinstance(answer, RawResponse) and answer.status == 101, answer
            frames = WsReader(sock, answer.body)
            sock.sendall(
                rawhttp.ws_frame(rawhttp.TEXT, json.dumps(rpc(0, "initialize", {"protocolVersion": 1})).encode())
            )
            frames.json_until(0)
            sock.sendall(
                rawhttp.ws_frame(
                    rawhttp.TEXT, json.dumps(rpc(1, "session/new", {"cwd": "/tmp", "mcpServers": []})).encode()
                )
            )
            ws_session = frames.json_until(1)["result"]["sessionId"]
            sock.sendall(
                rawhttp.ws_frame(rawhttp.TEXT, json.dumps(rawhttp_prompt(2, ws_session, "stream 3000 512")).encode())
            )
            for _ in range(generator.randrange(1, 300)):
                frames.next(REQUEST_TIMEOUT)
            hang_up(sock, generator.random() < 0.5)


def rawhttp_prompt(request_id: int, session_id: str, text: str) -> dict[str, Any]:
    return rpc(request_id, "session/prompt", {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]})


def test_initialize_abandoned_before_its_answer(demo: DaphneServer) -> None:
    """initialize POSTs whose clients vanish before the answer (RST and FIN) leave no error behind."""
    body = json.dumps(rpc(0, "initialize", {"protocolVersion": 1})).encode()
    raw = rawhttp.request_bytes("POST", "/acp", [("Content-Type", "application/json")], body)
    with clean_log(demo):
        for index in range(20):
            sock = rawhttp.connect(demo.port, REQUEST_TIMEOUT)
            sock.sendall(raw)
            hang_up(sock, index % 2 == 1)


# -- afterwards: a fresh client is served -----------------------------------------------------------


async def test_a_fresh_client_is_served_after_the_fuzzing(demo: DaphneServer, wire: DaphneServer) -> None:
    """Runs last in this module: initialize, session/new and a prompt round trip on the demo
    server, and an echo on the wire server (each test above checked the logs)."""
    async with httpx.AsyncClient(timeout=httpx.Timeout(REQUEST_TIMEOUT)) as client:
        connection_id = await initialize(client, demo.url)
        async with open_sse(client, demo.url, connection_id) as connection_stream:
            assert (
                await post(client, demo.url, rpc(1, "session/new", {"cwd": "/tmp", "mcpServers": []}), connection_id)
            ).status_code == 202
            reply = await connection_stream.next(REQUEST_TIMEOUT)
            session_id = reply["result"]["sessionId"]
            async with open_sse(client, demo.url, connection_id, session_id) as session_stream:
                response = await post(
                    client, demo.url, rawhttp_prompt(2, session_id, "echo after fuzzing"), connection_id, session_id
                )
                assert response.status_code == 202
                update = await session_stream.next(REQUEST_TIMEOUT)
                assert update["params"]["update"]["content"]["text"] == "after fuzzing"
                assert (await session_stream.next(REQUEST_TIMEOUT))["result"]["stopReason"] == "end_turn"
        assert (await client.delete(demo.url, headers={"Acp-Connection-Id": connection_id})).status_code == 202

        wire_id = await initialize(client, wire.url)
        async with open_sse(client, wire.url, wire_id) as wire_stream:
            assert (await post(client, wire.url, rpc(9, "test/after"), wire_id)).status_code == 202
            assert (await wire_stream.next(REQUEST_TIMEOUT))["result"]["method"] == "test/after"
