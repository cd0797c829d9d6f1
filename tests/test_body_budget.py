"""The bodies a worker holds at once are bounded (acp_channels._limits.BodyBudget): many clients
posting large bodies at once cannot grow a worker by requests x MAX_BODY_BYTES. In process,
through `BodyLimit` with an application that holds each request until told to answer."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from acp_channels._limits import BODIES_FULL, RETRY_AFTER_BODIES, BodyLimit, Message, Receive, Scope, Send, body_budget

KiB = 1024


@pytest.fixture(autouse=True)
def small_worker_budget(settings: Any) -> None:
    settings.ACP_CHANNELS = {**getattr(settings, "ACP_CHANNELS", {}), "MAX_WORKER_BUFFERED_BYTES": 100 * KiB}


class HeldApplication:
    """Answers 202 to each request once `release` is set; records the bodies it got."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.bodies: list[bytes] = []
        self.started = asyncio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = await receive()
        self.bodies.append(message["body"])
        self.started.set()
        await self.release.wait()
        await send({"type": "http.response.start", "status": 202, "headers": []})
        await send({"type": "http.response.body", "body": b""})


async def post(app: BodyLimit, body: bytes, chunk: int = 16 * KiB) -> tuple[int, dict[bytes, bytes], bytes]:
    parts = [body[start : start + chunk] for start in range(0, len(body), chunk)] or [b""]
    incoming = [
        {"type": "http.request", "body": part, "more_body": index < len(parts) - 1} for index, part in enumerate(parts)
    ]
    sent: list[Message] = []

    async def receive() -> Message:
        if incoming:
            return incoming.pop(0)
        await asyncio.get_running_loop().create_future()  # no disconnect: the client waits
        raise AssertionError

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/acp", "root_path": "", "headers": []}
    await app(scope, receive, send)
    start = sent[0]
    return start["status"], dict(start["headers"]), b"".join(part.get("body", b"") for part in sent[1:])


async def test_bodies_held_at_once_are_bounded_and_given_back() -> None:
    held = HeldApplication()
    app = BodyLimit(held)
    before = body_budget.used
    first = asyncio.ensure_future(post(app, b"a" * 80 * KiB))
    await held.started.wait()
    assert body_budget.used == before + 80 * KiB
    status, headers, text = await post(app, b"b" * 40 * KiB)  # would hold 120 KiB
    assert (status, text.decode()) == (503, BODIES_FULL)
    assert headers[b"retry-after"] == str(RETRY_AFTER_BODIES).encode()
    assert held.bodies == [b"a" * 80 * KiB]  # the refused body never reached the application
    assert body_budget.used == before + 80 * KiB  # and what it had reserved was given back
    held.release.set()
    assert (await first)[0] == 202
    assert body_budget.used == before
    assert (await post(app, b"b" * 40 * KiB))[0] == 202


async def test_one_body_always_fits_when_none_is_held() -> None:
    held = HeldApplication()
    held.release.set()
    assert body_budget.used == 0
    assert (await post(BodyLimit(held), b"c" * 150 * KiB))[0] == 202  # over the budget, alone
    assert body_budget.used == 0
