"""HttpClient pieces that need no server: endpoint rules, the SSE parser, the error types, the
inbox, and what the client refuses locally before sending anything."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from acp_channels.client import (
    ClientUsageError,
    HttpClient,
    HttpStatusError,
    StreamEndedError,
    TransportClosedError,
    TransportError,
    TransportTimeoutError,
    WebSocketClosedError,
    resolve_endpoint,
)
from acp_channels.client._base import Inbox, received_value
from acp_channels.client._sse import SseEvent, SseParser, SseTooLarge
from tests.live import ROOT


@pytest.mark.parametrize(
    ("url", "endpoint", "kind"),
    [
        ("http://h:8000", "http://h:8000/acp", "http"),
        ("http://h:8000/", "http://h:8000/acp", "http"),
        ("https://h/acp", "https://h/acp", "http"),
        ("https://h/base/", "https://h/base/acp", "http"),
        ("http://h/x/acp?token=1", "http://h/x/acp?token=1", "http"),
        ("http://h/x?token=1", "http://h/x/acp?token=1", "http"),
        ("ws://h:8000", "ws://h:8000/acp", "ws"),
        ("WSS://h/acp", "wss://h/acp", "ws"),
    ],
)
def test_endpoint_gets_acp_unless_it_ends_with_it(url: str, endpoint: str, kind: str) -> None:
    assert resolve_endpoint(url) == (endpoint, kind)


def test_exact_endpoint_is_kept() -> None:
    assert resolve_endpoint("http://h/custom?x=1", exact=True) == ("http://h/custom?x=1", "http")
    assert HttpClient("http://h/custom", exact_url=True).url == "http://h/custom"


@pytest.mark.parametrize("url", ["ftp://h/acp", "h:8000", "/acp", "http:///acp"])
def test_other_urls_are_refused(url: str) -> None:
    with pytest.raises(ClientUsageError):
        HttpClient(url)


def test_http_only_options_are_refused_for_websocket() -> None:
    with pytest.raises(ClientUsageError):
        HttpClient("ws://h", stream_idle_timeout=5.0)


def test_error_types() -> None:
    status = HttpStatusError("POST session/prompt", 500, "boom\n")
    assert isinstance(status, TransportError) and isinstance(status, ConnectionError)
    assert str(status) == "POST session/prompt: HTTP 500: boom"
    assert (status.status_code, status.body) == (500, "boom\n")
    assert isinstance(TransportTimeoutError("x"), TimeoutError)
    assert isinstance(ClientUsageError("x"), ValueError)
    assert str(StreamEndedError(None)) == "connection SSE stream ended: the server ended it"
    assert "session 's1'" in str(StreamEndedError("s1"))
    assert WebSocketClosedError(1011, "bye").code == 1011


# ------------------------------------------------------------------------------------ SSE


def feed_all(parser: SseParser, chunks: list[bytes]) -> list[SseEvent]:
    return [event for chunk in chunks for event in parser.feed(chunk)]


@pytest.mark.parametrize("end", [b"\n", b"\r\n", b"\r"])
def test_sse_line_ends(end: bytes) -> None:
    stream = b"data: a" + end + b"data: b" + end + end + b": keep-alive" + end + end + b"data:c" + end + end
    whole = feed_all(SseParser(), [stream])
    bytewise = feed_all(SseParser(), [bytes([byte]) for byte in stream])
    assert [event.data for event in whole] == ["a\nb", "c"]
    assert bytewise == whole


def test_sse_crlf_split_across_chunks_is_one_line_end() -> None:
    events = feed_all(SseParser(), [b"data: x\r", b"\n\r", b"\ndata: y\r\n\r\n"])
    assert [event.data for event in events] == ["x", "y"]


def test_sse_fields() -> None:
    parser = SseParser()
    events = feed_all(parser, [b"\xef\xbb\xbfid: 7\nevent: note\nretry: 10\ndata: {}\n\nid: 8\n\ndata: z\n\n"])
    assert events == [
        SseEvent("{}", "note", "7", 10, has_id_field=True),
        SseEvent("", "message", "8", None, has_id_field=True),  # id only: updates the last event id
        SseEvent("z", "message", "8", None, has_id_field=False),  # the id persists
    ]


def test_sse_limit() -> None:
    parser = SseParser(max_event_size=100)
    parser.feed(b"data: " + b"x" * 50 + b"\n")
    with pytest.raises(SseTooLarge):
        parser.feed(b"data: " + b"x" * 60 + b"\n")
    with pytest.raises(SseTooLarge):
        SseParser(max_event_size=100).feed(b"data: " + b"y" * 200)  # no line end yet


def test_sse_large_event_in_small_chunks_is_linear() -> None:
    payload = b"x" * (8 * 1024 * 1024)
    data = b"data: " + payload + b"\n\n"
    parser = SseParser()
    events = feed_all(parser, [data[i : i + 4096] for i in range(0, len(data), 4096)])
    assert len(events) == 1 and len(events[0].data) == len(payload)


# ------------------------------------------------------------------------------ received frames


def test_malformed_received_text_becomes_an_error_object() -> None:
    assert received_value("{not json") == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32700, "message": "Parse error", "data": {"line": "{not json"}},
    }
    assert received_value("17")["error"]["code"] == -32600
    batch = [{"jsonrpc": "2.0", "id": 1, "result": {}}, 17]
    assert received_value('[{"jsonrpc":"2.0","id":1,"result":{}},17]') == batch


async def test_inbox_keeps_batches_for_frames_and_splits_them_for_messages() -> None:
    inbox = Inbox()
    batch = [{"jsonrpc": "2.0", "id": 1, "result": {}}, 17]
    inbox.put(batch)
    inbox.put(batch)
    inbox.end(StreamEndedError(None))
    async with asyncio.timeout(5):
        assert await inbox.get_frame() == batch
        assert await inbox.get_message() == batch[0]
        assert (await inbox.get_message() or {})["error"]["code"] == -32600
        with pytest.raises(StreamEndedError):
            await inbox.get_message()
        with pytest.raises(TransportClosedError):
            await inbox.get_frame()


# ----------------------------------------------------------------- refused before any network


INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}


async def test_first_message_must_be_a_single_initialize() -> None:
    # Port 9 (discard) is never contacted: each of these is refused locally.
    client = HttpClient("http://127.0.0.1:9", timeout=1)
    with pytest.raises(ClientUsageError, match="initialize"):
        await client.send({"jsonrpc": "2.0", "id": 1, "method": "session/new", "params": {}})
    with pytest.raises(ClientUsageError, match="initialize"):
        await client.send([INIT])
    with pytest.raises(ClientUsageError, match="initialize"):
        await client.send({"jsonrpc": "2.0", "id": 1, "result": {}})
    with pytest.raises(ClientUsageError):
        await client.send([])  # type: ignore[arg-type]
    with pytest.raises(ClientUsageError):
        await client.send("text")  # type: ignore[arg-type]
    assert client.transport.error is None
    await client.close()
    with pytest.raises(TransportClosedError):
        await client.send(INIT)


def test_client_module_does_not_import_django() -> None:
    code = "import sys, acp_channels.client, acp_channels.client._terminal; print('django' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "False", result.stderr


@pytest.mark.parametrize(
    "argv", [["--help"], ["ftp://example.test"], ["http://example.test", "--permissions", "maybe"]]
)
def test_help_and_usage_errors_answer_without_loading_the_sdk(argv: list[str]) -> None:
    """`acp-client --help` and a usage error exit before the acp SDK and the terminal's libraries
    load (most of the second a session start takes)."""
    code = (
        "import sys\n"
        "from acp_channels.client.__main__ import main\n"
        "try:\n"
        f"    status = main({argv!r})\n"
        "except SystemExit as exit:\n"
        "    status = exit.code\n"
        "loaded = {m.split('.')[0] for m in sys.modules} & {'acp', 'prompt_toolkit'}\n"
        "print(status, sorted(loaded), file=sys.stderr)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.stderr.splitlines()[-1] == f"{0 if argv == ['--help'] else 2} []", result.stderr
