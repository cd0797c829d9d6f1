"""Fakes of a server whose tokens expire (docs/authentication.md, expiry and refresh), for the
client's token refresh tests:

* `Minting`, a `TokenSource` handing out `tok-1`, `tok-2`, ... and recording each refresh
  (which a test may hold, to make refusals meet);
* `ExpiringSse` turns a `FakeAcp` into one that wants a valid bearer token on every request
  (else 401 `error="invalid_token"`), numbers and keeps its stream events, resumes a stream
  after `Last-Event-ID`, and can end every live stream at once, as at a credential's expiry;
* `ExpiringWs`, a `ResumableWs` that wants a valid token on every upgrade (else 401 with the
  challenge), and closes a connection's socket at expiry with the expiry close code.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from websockets.asyncio.server import ServerConnection
from websockets.http11 import Request as WsRequest
from websockets.http11 import Response as WsResponse

from tests.peers.fakes import CONNECTION_ID, Answer, FakeAcp, Reply, Request, Stream, sse
from tests.peers.resumable import ResumableWs, initialize_result, notification, rpc_result

CHALLENGE = 'Bearer realm="acp", error="invalid_token", error_description="The access token has expired."'
AUTH_EXPIRING = "_acp-channels/auth_expiring"
EXPIRED_CLOSE_CODE = 4401


def expiring_notice(expires_at: str = "2030-01-01T00:00:00Z") -> dict[str, Any]:
    return notification(AUTH_EXPIRING, {"expiresAt": expires_at})


class Minting:
    """A token source: `tok-1` first, a new one for each refresh (None once `last` is handed out).
    `hold`: while set to an unset event, a refresh waits for it."""

    def __init__(self, last: int = 99) -> None:
        self.number = 1
        self.last = last
        self.refreshed: list[str] = []
        self.hold: asyncio.Event | None = None
        self.asked = asyncio.Event()

    @property
    def current(self) -> str:
        return f"tok-{self.number}"

    async def token(self) -> str:
        return self.current

    async def refresh(self, rejected: str) -> str | None:
        self.refreshed.append(rejected)
        self.asked.set()
        if self.hold is not None:
            await self.hold.wait()
        if self.number >= self.last:
            return None
        self.number += 1
        return self.current


class ExpiringSse:
    """Token-gated, numbered, resumable streams for a `FakeAcp` (installs its routes)."""

    def __init__(self, fake: FakeAcp, *, valid: set[str] | None = None) -> None:
        self.fake = fake
        self.valid = {"tok-1"} if valid is None else valid
        self.events: dict[str | None, list[bytes]] = {}
        self._grew: dict[str | None, asyncio.Event] = {}
        self._cut = asyncio.Event()
        #: (method, path, session, status, token) of every request, in order.
        self.seen: list[tuple[str, str, str | None, int, str | None]] = []
        self._route = fake.handler
        fake.handler = self._gate
        fake.on_initialize = self._on_initialize
        fake.on_get = self._on_get

    def push(self, session_id: str | None, value: Any) -> None:
        events = self.events.setdefault(session_id, [])
        events.append(sse(value, event_id=f"t1-{len(events) + 1}"))
        self._grew.pop(session_id, asyncio.Event()).set()

    def expire(self, token: str, successor: str | None = None) -> None:
        """`token` is no longer valid (`successor` is, when given); every live stream ends."""
        self.valid.discard(token)
        if successor is not None:
            self.valid.add(successor)
        self._cut.set()
        self._cut = asyncio.Event()

    def refusals(self) -> list[tuple[str, str, str | None, int, str | None]]:
        return [entry for entry in self.seen if entry[3] == 401]

    async def _gate(self, request: Request) -> Answer:
        authorization = request.headers.get("authorization", "")
        token = authorization.removeprefix("Bearer ") if authorization.startswith("Bearer ") else None
        status = 200 if token in self.valid else 401
        self.seen.append((request.method, request.rpc_method or request.path, request.session_id, status, token))
        if status == 401:
            return Reply(401, "the access token has expired\n", {"www-authenticate": CHALLENGE})
        return await self._route(request)

    async def _on_initialize(self, request: Request) -> Answer:
        reply = rpc_result(request.json()["id"], initialize_result(advertise=True))
        return Reply(200, reply, {"acp-connection-id": CONNECTION_ID})

    async def _on_get(self, request: Request) -> Answer:
        if request.path.endswith("/sessions"):
            return Reply(200, {"sessions": [], "connections": [], "complete": True})
        last = request.headers.get("last-event-id")
        start = int(last.rpartition("-")[2]) if last else 0
        return Stream(self._feed(request.session_id, start, self._cut))

    async def _feed(self, session_id: str | None, start: int, cut: asyncio.Event) -> AsyncIterator[bytes]:
        yield b": \n\n"
        position = start
        while not cut.is_set():
            events = self.events.setdefault(session_id, [])
            while position < len(events):
                yield events[position]
                position += 1
            grew = self._grew.setdefault(session_id, asyncio.Event())
            waiters = {asyncio.ensure_future(grew.wait()), asyncio.ensure_future(cut.wait())}
            _, pending = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            for waiter in pending:
                waiter.cancel()


class ExpiringWs(ResumableWs):
    """A `ResumableWs` that wants `Authorization: Bearer <valid token>` on every upgrade."""

    def __init__(self, *, valid: set[str] | None = None) -> None:
        super().__init__()
        self.valid = {"tok-1"} if valid is None else valid
        #: (token, status) of every upgrade, in order.
        self.upgrade_tokens: list[tuple[str | None, int]] = []

    async def __aenter__(self) -> ExpiringWs:
        await super().__aenter__()
        return self

    def _process_request(self, connection: ServerConnection, request: WsRequest) -> WsResponse | None:
        authorization = request.headers.get("Authorization", "")
        token = authorization.removeprefix("Bearer ") if authorization.startswith("Bearer ") else None
        if token not in self.valid:
            self.upgrade_tokens.append((token, 401))
            response = connection.respond(401, "the access token has expired\n")
            response.headers["WWW-Authenticate"] = CHALLENGE
            return response
        self.upgrade_tokens.append((token, 101))
        return super()._process_request(connection, request)

    async def expire(self, token: str, successor: str | None = None) -> None:
        """`token` is no longer valid; every socket is closed with the expiry code."""
        self.valid.discard(token)
        if successor is not None:
            self.valid.add(successor)
        for state in self.connections.values():
            if state.socket is not None:
                await state.socket.close(EXPIRED_CLOSE_CODE, "the credential expired")

    def texts(self, connection_index: int = 0) -> list[Any]:
        """What the agent part got on a connection, decoded."""
        return [json.loads(text) for text in self.order[connection_index].received]
