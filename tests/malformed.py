"""The malformed and invalid messages the tests know, in one place: the fuzz suite draws its
fixed bodies from here (tests/test_fuzz_live.py) and the log test sends every one of them over
both transports (tests/test_malformed_logs_live.py).

Each entry is the exact bytes of one message (a POST body, a WebSocket text message). Entries
that are not UTF-8 cannot be a WebSocket text message: there they close the socket with 1007
(tests/test_websocket_failures_live.py), so `over_websocket()` leaves them out.
"""

from __future__ import annotations

import json
from typing import Any, Final


def _dumps(value: Any) -> bytes:
    return json.dumps(value).encode()


#: Bodies that are not JSON-RPC at all, or barely: the fuzz suite's fixed list.
NOT_JSON_RPC: Final[list[bytes]] = [
    b"",
    b"[]",
    b"{}",
    b"null",
    b"[[]]",
    b"[1,2]",
    b'"\\ud800"',
    b"1e99999",
    b"NaN",
    b'{"jsonrpc":"2.0","id":1,"method":"x"}' * 2,
    b"\xef\xbb\xbf{}",
    b"[" * 100000,
    b"not json {",
]

#: Nesting deeper than a JSON parser recurses (the fuzz suite draws depths up to 20000), closed
#: and left open.
DEEPLY_NESTED: Final[list[bytes]] = [
    (opening * 20000 + ("null" + closing * 20000 if closed else "")).encode()
    for opening, closing in (("[", "]"), ('{"a":', "}"), ('[{"jsonrpc":"2.0","x":', "}]"))
    for closed in (True, False)
]

#: Valid JSON that JSON-RPC, a session method or the SDK's schemas refuse.
INVALID_MESSAGES: Final[list[bytes]] = [
    _dumps(value)
    for value in [
        {"jsonrpc": "2.0", "method": "session/cancel"},
        {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": 5}},
        {"jsonrpc": "2.0", "method": "session/cancel", "params": [1, 2]},
        {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "s1", "_meta": 5}},
        {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "no-such-session"}},
        {"jsonrpc": "2.0", "id": 1, "method": "session/prompt", "params": {}},
        {"jsonrpc": "2.0", "id": 2, "method": "session/prompt", "params": {"sessionId": "nope", "prompt": 5}},
        {"jsonrpc": "2.0", "id": 3, "method": "session/new", "params": {"cwd": 5}},
        {"jsonrpc": "2.0", "id": 4, "method": "session/set_mode", "params": {"sessionId": "s1"}},
        {"jsonrpc": "2.0", "id": 12, "method": "session/load", "params": {"sessionId": "x", "cwd": "/"}},
        {"jsonrpc": "2.0", "id": 14, "method": "session/list", "params": 5},
        {"jsonrpc": "2.0", "method": "session/update", "params": {}},
        {"jsonrpc": "2.0", "id": 5, "method": "fs/read_text_file", "params": {}},
        {"jsonrpc": "2.0", "id": 17, "method": "session/request_permission", "params": {}},
        {"jsonrpc": "2.0", "id": 13, "method": "authenticate", "params": {}},
        {"jsonrpc": "2.0", "id": 6, "result": {}},
        {"jsonrpc": "2.0", "id": 7, "error": {"code": "x"}},
        {"jsonrpc": "2.0", "id": 18, "error": {"code": 1, "message": "x"}},
        {"jsonrpc": "2.0", "id": 8, "method": "initialize", "params": {"protocolVersion": "x"}},
        {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {}},
        {"jsonrpc": "2.0", "id": 15, "method": "$/cancel_request", "params": {"requestId": [1]}},
        {"jsonrpc": "2.0", "method": "_proxy/successor", "params": 5},
        {"jsonrpc": "2.0", "id": 16, "method": "_proxy/successor", "params": {"message": 5}},
        {"jsonrpc": "2.0", "method": "no/such/method", "params": {"x": 1}},
        {"jsonrpc": "2.0", "id": 9, "method": "no/such/method"},
        {"jsonrpc": "1.0", "id": 10, "method": "session/new"},
        {"jsonrpc": 2, "id": 19, "method": "initialize"},
        {"id": 20, "method": "session/new"},
        {"jsonrpc": "2.0", "method": 5},
        {"jsonrpc": "2.0", "id": 1.5, "method": "session/new"},
        {"jsonrpc": "2.0", "id": [1], "method": "session/new"},
        {"jsonrpc": "2.0", "id": {"a": 1}, "method": "session/new"},
        {"jsonrpc": "2.0", "id": True, "method": "session/new"},
        [1, "x"],
        [{"jsonrpc": "2.0", "method": "session/cancel"}, {"jsonrpc": "2.0", "id": 11, "method": "session/prompt"}],
        [{"jsonrpc": "2.0", "id": index, "method": "x"} for index in range(1001)],  # over MAX_BATCH_ENTRIES
    ]
] + [
    b'{"jsonrpc":"2.0","id":1e400,"method":"session/new"}',
    b'{"jsonrpc":"2.0","id":"\\ud800","method":"x"}',
    b'{"jsonrpc":"2.0","method":"session/prompt","params":{"sessionId":"\\ud800"}}',
]

#: Bytes that are not UTF-8 (a POST body; over WebSocket, a 1007 close).
NOT_UTF8: Final[list[bytes]] = [
    b'{"jsonrpc":"2.0","id":1,"method":"\xff\xfe"}',
    "\ud800".encode("utf-8", "surrogatepass"),
    b"\xc3\x28",
]

#: Everything above.
ALL: Final[list[bytes]] = [*NOT_JSON_RPC, *DEEPLY_NESTED, *INVALID_MESSAGES, *NOT_UTF8]

#: How many of ALL are a session method without a string `params.sessionId` (HTTP: 400 without
#: a session header; WebSocket: a -32602 error), with the ids of their requests (None: none).
SESSION_REFUSALS: Final[list[Any]] = [None, None, None, 1, 11]


def is_utf8(body: bytes) -> bool:
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def over_websocket() -> list[str]:
    """The entries a WebSocket text message can carry."""
    return [body.decode("utf-8") for body in ALL if is_utf8(body)]
