"""What daphne needs to serve ACP well. Installed from AppConfig.ready() when daphne is present.

- Accept headers: daphne 4 drops the headers an application gives on `websocket.accept`, so a
  WebSocket client would never see `Acp-Connection-Id` on the 101 (the reference, uvicorn and
  hypercorn send it). autobahn already accepts (subprotocol, headers) from the handshake
  callback; we pass the headers through.
- Graceful SIGTERM: Twisted stops the reactor at once and daphne cancels every application,
  which cuts open SSE streams mid-way. We take SIGTERM over once the reactor runs: drain first
  (lifecycle.drain), then stop the reactor.
- Send backpressure: daphne's `send` hands every response body chunk and WebSocket message to
  Twisted and returns at once, and Twisted buffers without limit, so a client that never reads
  would grow the server without bound (our connection budgets count only what was not yet
  handed over). `send` now waits while the socket's transport is paused (more than 64 KiB
  unsent) until it has written its buffer, or the client is gone.
- Hostile requests: daphne reads a whole body (into Twisted, then into the application's
  queue) before the application can refuse it, Twisted waits 12 hours for slow headers, and it
  drops oversized headers without an answer. Daphne's HTTP factory now builds guarded channels:
  413 for the ACP endpoint's over-limit bodies before they are read, 408 for slow headers or
  bodies (HEADER_TIMEOUT_SECONDS, BODY_TIMEOUT_SECONDS), 431 for oversized headers.
The Twisted side is in acp_channels.daphne_guards, which says why each guard works as it does.
Under `runserver`, daphne's server is created before this runs: there only the WebSocket and
send patches apply (they take effect for connections made after the first WebSocket).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from typing import Any

logger = logging.getLogger(__name__)


def install() -> bool:
    """Patch daphne if this process runs under it (importing daphne's Twisted parts anywhere
    else could install the wrong reactor before daphne installs its own). Idempotent."""
    if "daphne.server" not in sys.modules:
        return False
    from daphne.ws_protocol import WebSocketProtocol

    if getattr(WebSocketProtocol.handle_reply, "acp_channels_patched", False):
        return True
    _install_accept_headers(WebSocketProtocol)
    _install_guards()
    _install_graceful_sigterm()
    return True


def _install_accept_headers(websocket_protocol: Any) -> None:
    original = websocket_protocol.handle_reply

    def handle_reply(self: Any, message: dict[str, Any]) -> None:
        headers = message.get("headers")
        if message.get("type") != "websocket.accept" or not headers or not hasattr(self, "handshake_deferred"):
            original(self, message)
            return
        pairs = {bytes(name).decode("latin-1"): bytes(value).decode("latin-1") for name, value in headers}
        self.handshake_deferred.callback((message.get("subprotocol"), pairs))
        del self.handshake_deferred

    handle_reply.acp_channels_patched = True  # type: ignore[attr-defined]
    websocket_protocol.handle_reply = handle_reply


def _install_guards() -> None:
    import daphne.server

    from acp_channels.daphne_guards import GuardedHTTPFactory, gate_before_write

    # Server.run() builds `HTTPFactory(self)` from daphne.server's namespace.
    daphne.server.HTTPFactory = GuardedHTTPFactory
    server_class: Any = daphne.server.Server
    original = server_class.handle_reply

    async def handle_reply(self: Any, protocol: Any, message: dict[str, Any]) -> None:
        # The application's `send`: write, then wait while the transport is over its buffer.
        connection = self.connections.get(protocol)
        gate = None if connection is None or "disconnected" in connection else gate_before_write(protocol, message)
        await original(self, protocol, message)
        if gate is not None:
            await gate.wait_writable()

    server_class.handle_reply = handle_reply


def _install_graceful_sigterm() -> None:
    from twisted.internet import reactor as twisted_reactor

    reactor: Any = twisted_reactor

    draining: list[asyncio.Future[None]] = []

    def take_over_sigterm() -> None:
        signal.signal(signal.SIGTERM, lambda signum, frame: reactor.callFromThread(start_draining))

    def start_draining() -> None:
        draining.append(asyncio.ensure_future(drain_then_stop()))

    async def drain_then_stop() -> None:
        from acp_channels.conf import acp_settings
        from acp_channels.lifecycle import lifecycle

        if lifecycle.draining:
            return
        try:
            await lifecycle.drain(float(acp_settings.SHUTDOWN_GRACE_SECONDS))
        finally:
            reactor.stop()

    reactor.callWhenRunning(take_over_sigterm)
