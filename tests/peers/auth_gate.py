"""An ASGI middleware that lets through only requests carrying one bearer token, answering the
way acp-channels refuses (issue 10's wire decisions), so the clients' credential handling can be
tested end to end against a peer server without acp-channels' own authentication:

* HTTP: `Authorization: Bearer <token>` on every request, else 401 with
  `WWW-Authenticate: Bearer realm="acp"` (plus `error="invalid_token"` when a wrong token came)
  and a text body that never echoes it.
* WebSocket: the same header on the upgrade, or the browser form: subprotocols
  `acp, acp.bearer.<token>`, accepted with subprotocol `acp`. A refusal closes before accept
  (the server answers 403).

`seen` counts what it let through and refused, per (scope type, method).
"""

from __future__ import annotations

import collections
import hmac
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

SUBPROTOCOL_PREFIX = "acp.bearer."


class BearerGate:
    def __init__(self, app: App, token: str) -> None:
        self.app = app
        self.token = token.encode()
        self.seen: collections.Counter[tuple[str, str, bool]] = collections.Counter()

    def _matches(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self.token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = [(name.decode("latin-1").lower(), value.decode("latin-1")) for name, value in scope["headers"]]
        authorizations = [value for name, value in headers if name == "authorization"]
        scheme, _, header_token = authorizations[0].partition(" ") if len(authorizations) == 1 else ("", "", "")
        given = header_token.strip() if scheme.lower() == "bearer" else None
        offered = [item.strip() for item in scope.get("subprotocols", [])]
        by_subprotocol = None
        if scope["type"] == "websocket" and given is None:
            tokens = [item[len(SUBPROTOCOL_PREFIX) :] for item in offered if item.startswith(SUBPROTOCOL_PREFIX)]
            by_subprotocol = tokens[0] if len(tokens) == 1 and "acp" in offered else None
            given = by_subprotocol
        allowed = self._matches(given)
        self.seen[(scope["type"], scope.get("method", "GET"), allowed)] += 1
        if scope["type"] == "http":
            if allowed:
                await self.app(scope, receive, send)
                return
            challenge = 'Bearer realm="acp"' + (', error="invalid_token"' if given is not None else "")
            body = b"invalid token\n" if given is not None else b"authentication required\n"
            await send(
                {
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [
                        (b"content-type", b"text/plain; charset=utf-8"),
                        (b"www-authenticate", challenge.encode()),
                        (b"content-length", str(len(body)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        if not allowed:
            await receive()  # websocket.connect
            await send({"type": "websocket.close", "code": 1008})
            return
        if by_subprotocol is None:
            await self.app(scope, receive, send)
            return

        async def send_choosing_acp(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "websocket.accept":
                message = {**message, "subprotocol": "acp"}  # never the token one
            await send(message)

        await self.app(scope, receive, send_choosing_acp)
