"""The benchmark scenarios, identical for every server and transport. Each one checks that
nothing was lost or reordered and raises `ProtocolError` when something was.

- stream: one prompt `stream N 64` -> N agent_message_chunk updates ("00000:xxx…", 64 chars),
  then the prompt's reply; every index must arrive once, in order, before the reply.
- rtt: sequential `echo r<i>` prompts; the time from sending the prompt until its reply (and,
  over HTTP, the POST's 202) has arrived; the echoed chunk must be `r<i>` and come first.
- permission: sequential `permission` prompts: the agent's session/request_permission arrives,
  the client answers `allow`, then the chunk `permission: allow` and the reply must follow;
  the time of the whole turn (two client messages, three agent messages).
- fanout: C clients at once, each: connect (initialize, streams) -> session/new -> P prompts
  `stream K 64` (checked like stream) -> DELETE / close.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from bench.client import AcpClient, Message, ProtocolError, make_client

CHUNK = 64


async def wait(client: AcpClient, future: asyncio.Future[Any], timeout: float, what: str) -> Any:
    """Await a scenario's future; a timeout names what was missing and whether the server hung up."""
    try:
        return await asyncio.wait_for(future, timeout)
    except TimeoutError:
        reason = client.closed_reason()
        raise ProtocolError(f"no {what} within {timeout:g} s" + (f" ({reason})" if reason else "")) from None


class StreamCheck:
    """Sink for one `stream n size` prompt: counts and checks chunks in order."""

    def __init__(self, client: AcpClient, prompt_id: int, count: int, size: int = CHUNK) -> None:
        self.client = client
        self.prompt_id = prompt_id
        self.count = count
        self.size = size
        self.expected = 0
        self.errors: list[str] = []
        self.done: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.first_at = 0.0

    def __call__(self, message: Message) -> None:
        if message.get("method") == "session/update":
            try:
                text = message["params"]["update"]["content"]["text"]
                index = int(text[: text.index(":")])
            except (KeyError, ValueError, TypeError):
                self.errors.append(f"not a stream chunk: {message}")
                return
            if index != self.expected or len(text) != self.size:
                if len(self.errors) < 5:
                    self.errors.append(f"chunk {index} (len {len(text)}) where {self.expected} was due")
            if not self.expected:
                self.first_at = time.perf_counter()
            self.expected = index + 1
            return
        if message.get("id") == self.prompt_id and "method" not in message:
            if self.done.done():
                self.errors.append("second reply to the prompt")
                return
            if message.get("result", {}).get("stopReason") != "end_turn":
                self.errors.append(f"prompt reply: {message}")
            elif self.expected != self.count:
                self.errors.append(f"reply after {self.expected} of {self.count} chunks")
            self.done.set_result(time.perf_counter())
            return
        self.errors.append(f"unexpected: {str(message)[:200]}")

    def check(self) -> None:
        if self.errors:
            raise ProtocolError("; ".join(self.errors[:5]))


async def run_stream(client: AcpClient, count: int, timeout: float = 120.0, size: int = CHUNK) -> dict[str, float]:
    """One prompt streaming `count` chunks of `size` characters; messages/s from the prompt to its reply."""
    prompt_id = client.next_id()
    check = StreamCheck(client, prompt_id, count, size)
    client.sink = check
    started = time.perf_counter()
    await client.send(client.prompt(prompt_id, f"stream {count} {size}"), client.session_id)
    ended = await wait(client, check.done, timeout, "prompt reply")
    check.check()
    seconds = ended - started
    return {"messages": count, "seconds": seconds, "msg_per_s": count / seconds}


class TurnCheck:
    """Sink for sequential single-chunk turns (echo, permission)."""

    def __init__(self, client: AcpClient) -> None:
        self.client = client
        self.prompt_id: Any = None
        self.want_text = ""
        self.got_text: str | None = None
        self.permission: Message | None = None
        self.errors: list[str] = []
        self.done: asyncio.Future[float] | None = None
        self.asked: asyncio.Future[Message] | None = None

    def expect(self, prompt_id: int, text: str, permission: bool = False) -> None:
        loop = asyncio.get_running_loop()
        self.prompt_id, self.want_text, self.got_text = prompt_id, text, None
        self.done = loop.create_future()
        self.asked = loop.create_future() if permission else None

    def __call__(self, message: Message) -> None:
        method = message.get("method")
        if method == "session/update":
            if self.got_text is not None:
                self.errors.append("a second chunk in one turn")
            self.got_text = message["params"]["update"]["content"]["text"]
        elif method == "session/request_permission":
            if self.asked is None or self.asked.done():
                self.errors.append("unexpected permission request")
            else:
                self.asked.set_result(message)
        elif method is None and message.get("id") == self.prompt_id and self.done is not None:
            if self.got_text != self.want_text:
                self.errors.append(f"chunk {self.got_text!r} where {self.want_text!r} was due before the reply")
            if message.get("result", {}).get("stopReason") != "end_turn":
                self.errors.append(f"prompt reply: {message}")
            if not self.done.done():
                self.done.set_result(time.perf_counter())
        else:
            self.errors.append(f"unexpected: {str(message)[:200]}")


async def run_rtt(client: AcpClient, count: int, timeout: float = 10.0) -> list[float]:
    check = TurnCheck(client)
    client.sink = check
    samples = []
    for index in range(count):
        prompt_id = client.next_id()
        token = f"r{index}"
        check.expect(prompt_id, token)
        assert check.done is not None
        started = time.perf_counter()
        await client.send(client.prompt(prompt_id, f"echo {token}"), client.session_id)
        await wait(client, check.done, timeout, "echo reply")
        samples.append(time.perf_counter() - started)
        if check.errors:
            raise ProtocolError("; ".join(check.errors[:5]))
    return samples


async def run_permission(client: AcpClient, count: int, timeout: float = 10.0) -> list[float]:
    check = TurnCheck(client)
    client.sink = check
    samples = []
    for _ in range(count):
        prompt_id = client.next_id()
        check.expect(prompt_id, "permission: allow", permission=True)
        assert check.done is not None and check.asked is not None
        started = time.perf_counter()
        await client.send(client.prompt(prompt_id, "permission"), client.session_id)
        request = await wait(client, check.asked, timeout, "permission request")
        if request["params"].get("sessionId") != client.session_id:
            raise ProtocolError(f"permission request for another session: {request}")
        answer = {
            "jsonrpc": "2.0",
            "id": request["id"],
            "result": {"outcome": {"outcome": "selected", "optionId": "allow"}},
        }
        await client.send(answer, client.session_id)
        await wait(client, check.done, timeout, "reply after the permission answer")
        samples.append(time.perf_counter() - started)
        if check.errors:
            raise ProtocolError("; ".join(check.errors[:5]))
    return samples


@dataclass
class FanoutResult:
    clients: int
    completed: int
    seconds: float
    errors: list[str]


async def fanout_client(
    transport: str, url: str, prompts: int, chunks: int, start: asyncio.Event, options: dict[str, Any]
) -> None:
    client = make_client(transport, url, **options)
    await start.wait()
    try:
        await client.open()
        await client.new_session()
        for _ in range(prompts):
            await run_stream(client, chunks, timeout=300)
        await client.close()
    except BaseException:
        if hasattr(client, "abort"):
            client.abort()
        raise


async def run_fanout(
    transport: str,
    url: str,
    clients: int,
    prompts: int = 5,
    chunks: int = 20,
    timeout: float = 180.0,
    options: dict[str, Any] | None = None,
) -> FanoutResult:
    start = asyncio.Event()
    tasks = [
        asyncio.ensure_future(fanout_client(transport, url, prompts, chunks, start, options or {}))
        for _ in range(clients)
    ]
    await asyncio.sleep(0)
    began = time.perf_counter()
    start.set()
    done, pending = await asyncio.wait(tasks, timeout=timeout)
    seconds = time.perf_counter() - began
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    errors: dict[str, int] = {}
    completed = 0
    for task in done:
        error = task.exception()
        if error is None:
            completed += 1
        else:
            key = f"{type(error).__name__}: {str(error)[:120]}"
            errors[key] = errors.get(key, 0) + 1
    if pending:
        errors["timeout"] = len(pending)
    return FanoutResult(clients, completed, seconds, [f"{n}x {e}" for e, n in errors.items()])
