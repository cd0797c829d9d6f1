"""A tiny ACP agent on stdio for the tests: standard library only, so it starts in milliseconds.

    python tests/stdio_script_agent.py [--ignore-eof] [--ignore-term] [--child] [--stderr-at-start N]

Newline-delimited JSON-RPC on stdin/stdout. It answers:
- initialize: protocolVersion 1, no auth methods, `_meta` {"pid": its pid, "child": the pid of
  its child or null};
- session/new: {"sessionId": "s<n>"};
- session/prompt, by the first text block:
  - `echo TEXT`: a session/update chunk with TEXT, then stopReason end_turn;
  - `crash N`: exits with status N at once, answering nothing;
  - `hang`: never answers;
  - `big N`: a session/update chunk of N characters, then end_turn;
  - `burst N SIZE`: N chunks of SIZE characters, writing `wrote K` on stderr after each, then
    end_turn;
  - `stderr N`: N lines on stderr, then end_turn; `stderr-line N`: one stderr line of N chars;
- test/raw: {"line": the exact line it received}; test/size: {"bytes": its length};
- test/env: {"env": its environment, "cwd": its working directory};
- test/verbatim: writes params.text as its output line, exactly;
- a batch: one array line answering each request entry with {"entry": index}, except entries
  named test/ignore;
- a line that is not JSON: an id-null -32700 "agent: parse error"; other requests: -32601.

Options: --ignore-eof keeps running after stdin ends; --ignore-term ignores SIGTERM; --child
starts a child process (same process group, holding stdout open) that sleeps;
--stderr-at-start N writes N bytes of stderr lines before reading anything; --mark FILE appends
`eof` to FILE when stdin ends and `term` when SIGTERM arrives (then dies of it). initialize can
set the same per connection: params._meta {"ignoreEof": true, "ignoreTerm": true, "mark": FILE}.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

OUT = sys.stdout.buffer
ERR = sys.stderr.buffer


def write(value: Any) -> None:
    OUT.write(json.dumps(value).encode() + b"\n")
    OUT.flush()


def reply(request_id: Any, result: Any) -> None:
    write({"jsonrpc": "2.0", "id": request_id, "result": result})


def chunk(session_id: str, text: str) -> None:
    update = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}
    write({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": session_id, "update": update}})


def prompt(request_id: Any, params: dict[str, Any]) -> None:
    session_id = params.get("sessionId", "")
    blocks = params.get("prompt") or [{}]
    command, _, rest = str(blocks[0].get("text", "")).partition(" ")
    if command == "crash":
        os._exit(int(rest or 1))
    if command == "hang":
        return
    if command == "echo":
        chunk(session_id, rest)
    elif command == "big":
        chunk(session_id, "x" * int(rest))
    elif command == "burst":
        count, size = (int(arg) for arg in rest.split())
        for index in range(count):
            chunk(session_id, f"{index}:".ljust(size, "x"))
            ERR.write(f"wrote {index + 1}\n".encode())
            ERR.flush()
    elif command == "stderr":
        for index in range(int(rest)):
            ERR.write(f"stderr line {index}\n".encode())
        ERR.flush()
    elif command == "stderr-line":
        ERR.write(b"y" * int(rest) + b"\n")
        ERR.flush()
    reply(request_id, {"stopReason": "end_turn"})


def handle(line: bytes, state: dict[str, Any]) -> None:
    try:
        message = json.loads(line)
    except ValueError:
        write({"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "agent: parse error"}})
        return
    if isinstance(message, list):
        answers = [
            {"jsonrpc": "2.0", "id": entry["id"], "result": {"entry": index}}
            for index, entry in enumerate(message)
            if isinstance(entry, dict) and "method" in entry and "id" in entry and entry["method"] != "test/ignore"
        ]
        if answers:
            OUT.write(b"[ " + b" , ".join(json.dumps(answer).encode() for answer in answers) + b" ]\n")
            OUT.flush()
        return
    method, params, request_id = message.get("method"), message.get("params") or {}, message.get("id")
    if "id" not in message or method is None:
        return  # notifications (session/cancel) and client responses
    if method == "initialize":
        options = params.get("_meta") or {}  # the command-line options, per connection
        if options.get("ignoreTerm"):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        state["ignore_eof"] = state["ignore_eof"] or bool(options.get("ignoreEof"))
        state["mark"] = options.get("mark", state["mark"])
        meta = {"pid": os.getpid(), "child": state.get("child")}
        reply(request_id, {"protocolVersion": 1, "agentCapabilities": {}, "authMethods": [], "_meta": meta})
    elif method == "session/new":
        state["sessions"] = state.get("sessions", 0) + 1
        reply(request_id, {"sessionId": f"s{state['sessions']}"})
    elif method == "session/prompt":
        prompt(request_id, params)
    elif method == "test/raw":
        reply(request_id, {"line": line.decode().removesuffix("\n")})
    elif method == "test/size":
        reply(request_id, {"bytes": len(line.removesuffix(b"\n"))})
    elif method == "test/env":
        reply(request_id, {"env": dict(os.environ), "cwd": os.getcwd()})
    elif method == "test/verbatim":
        OUT.write(params["text"].encode() + b"\n")
        OUT.flush()
    else:
        error = {"code": -32601, "message": f"agent: method not found: {method}"}
        write({"jsonrpc": "2.0", "id": request_id, "error": error})


STATE: dict[str, Any] = {}


def mark(event: str) -> None:
    if STATE.get("mark"):
        with open(STATE["mark"], "a") as file:
            file.write(event + "\n")


def on_sigterm(signum: int, frame: Any) -> None:
    mark("term")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def main(argv: list[str]) -> None:
    state = STATE
    state["ignore_eof"] = "--ignore-eof" in argv
    state["mark"] = argv[argv.index("--mark") + 1] if "--mark" in argv else None
    signal.signal(signal.SIGTERM, signal.SIG_IGN if "--ignore-term" in argv else on_sigterm)
    if "--child" in argv:
        sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
        state["child"] = subprocess.Popen(sleeper, stdin=subprocess.DEVNULL).pid
    if "--stderr-at-start" in argv:
        remaining = int(argv[argv.index("--stderr-at-start") + 1])
        line = b"e" * 99 + b"\n"
        while remaining > 0:
            ERR.write(line * 1000)
            remaining -= 100 * 1000
        ERR.flush()
    for line in sys.stdin.buffer:
        handle(line, state)
    mark("eof")
    if state["ignore_eof"]:
        while True:
            time.sleep(3600)


if __name__ == "__main__":
    main(sys.argv[1:])
