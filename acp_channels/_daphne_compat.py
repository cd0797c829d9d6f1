"""What daphne needs to serve ACP well, installed only when daphne serves this process (`install`).

acp_channels._patches lists every patch (these, the Twisted guards, and those of Django, channels
and the rest) with where it lives and the versions it was tested with.

- Accept headers: daphne 4 drops the headers an application gives on `websocket.accept`, so a
  WebSocket client would never see `Acp-Connection-Id` on the 101 (the reference, uvicorn and
  hypercorn send it). autobahn already accepts (subprotocol, headers) from the handshake
  callback; we pass the headers through.
- Upgrade refusals with a status: daphne can only refuse an upgrade with 403 (a close before
  accept). We add the ASGI denial-response extension (`websocket.http.response.start` and
  `.body` before accept; announced in the scope's `extensions`), so a reattach the server
  cannot resume is answered 404 or 409 with a text body, as over HTTP.
- Close codes: daphne closes through autobahn's `sendClose`, which only takes 1000 and 3000-4999
  (an application API rule) and raises on the codes servers send (1009, 1011, 1013), and it drops
  the close reason. We write the close frame with the code and reason the application gave.
- Failing a socket with its code: autobahn fails a connection it must end (a text message that
  is not UTF-8: 1007; a message over the size limit: 1009; a protocol error: 1002) by dropping
  TCP at once (its `failByDrop` option, on by default), so a client that is still sending reads
  a reset, never the code. Daphne's WebSocket factory now sets `failByDrop=False` (autobahn's
  public protocol option): the close frame goes first, then the close handshake.
- Handshake bytes: daphne decodes Sec-WebSocket-Protocol as ASCII and answers other bytes with
  a 500 and a traceback; such a handshake is refused with 400.
- WebSocket scheme: daphne leaves `scheme` out of WebSocket scopes (ASGI's default is then "ws"),
  even over TLS or with --proxy-headers and `X-Forwarded-Proto: https`, so a wss page's own
  origin would look foreign. We fill it in as daphne does for HTTP.
- Graceful SIGTERM: Twisted stops the reactor at once and daphne cancels every application,
  which cuts open SSE streams mid-way. We take SIGTERM over once the reactor runs: drain first
  (lifecycle.drain), then stop the reactor.
- Send backpressure: daphne's `send` hands every response body chunk and WebSocket message to
  Twisted and returns at once, and Twisted buffers without limit, so a client that never reads
  would grow the server without bound (our connection budgets count only what was not yet
  handed over). `send` now waits while the socket's transport is paused (more than 64 KiB
  unsent) until it has written its buffer, or the client is gone. Once the client is gone, a
  streaming `send` (a WebSocket message, a body chunk with more to come) waits until the
  application is cancelled instead of being dropped at once: a stream does not race through its
  output into a dead connection, which a replay window would count as delivered. Over HTTP/2
  the wait is per stream (its flow-control window) and per connection (its transport).
- Hostile requests: daphne reads a whole body (into Twisted, then into the application's
  queue) before the application can refuse it, Twisted waits 12 hours for slow headers, and it
  drops oversized headers without an answer. Daphne's HTTP factory now builds guarded channels:
  413 for the ACP endpoint's over-limit bodies before they are read, 408 for slow headers or
  bodies (HEADER_TIMEOUT_SECONDS, BODY_TIMEOUT_SECONDS), 431 for oversized headers. Over HTTP/2
  only the 413 applies (answered on the stream; the connection's other streams go on).
- Per-frame debug formatting: autobahn builds the arguments of a debug line for every frame it
  sends (`hltype`/`hlval`, colouring through click) before the logger drops it: a tenth of a
  WebSocket frame's cost on daphne (bench/PROFILE.md). Its WebSocket module gets plain
  versions (the same text, uncoloured, when its debug log is on).
The Twisted side is in acp_channels._daphne_guards, which says why each guard works as it does.

When: `install()` (called by `routing.build_asgi_application`) wraps daphne's `Server.run` when
daphne is loaded; the wrapper installs all of the above as daphne starts serving, before it
builds its factories (its CLI and `runserver` alike). A process that never runs a daphne Server
(`manage.py migrate`, `check`, uvicorn, in-process tests) gets none of it: daphne's own app
imports `daphne.server`, so "daphne is imported" does not mean "daphne serves".
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import threading
from collections.abc import Awaitable
from typing import Any

from autobahn.exception import Disconnected  # plain exceptions: no Twisted imported

logger = logging.getLogger("acp_channels.daphne_compat")


#: Whether this process has daphne's patches (set once, by the first daphne Server that runs).
_installed = False


def install() -> bool:
    """Have daphne's patches installed when daphne serves this process; False when daphne is
    not loaded here. Idempotent, and cheap once installed (the consumer calls it per upgrade).

    The signal that daphne serves is daphne's own `Server.run()`, which its CLI and `runserver`
    call once the application is loaded, and nothing else does: it is wrapped here (a class
    attribute, inert until a Server runs) to install everything first. When Twisted's reactor
    runs already (an application built otherwise, first called at a WebSocket), the patches go
    in at once, but the request guards then miss the factory daphne built, and SIGTERM is left
    alone. Importing daphne here is never done: `daphne.server` installs Twisted's reactor."""
    if _installed:
        return True
    server_module = sys.modules.get("daphne.server")
    if server_module is None:
        return False
    _wrap_server_run(server_module.Server)
    reactor = sys.modules.get("twisted.internet.reactor")
    if getattr(reactor, "running", False):
        _install_patches(server=None)
    return True


def installed() -> bool:
    """Whether daphne serves this process with the patches in."""
    return _installed


def _wrap_server_run(server_class: Any) -> None:
    original = server_class.run
    if getattr(original, "acp_channels_serving", False):
        return

    def run(self: Any) -> Any:
        _install_patches(server=self)  # before run() builds the HTTP and WebSocket factories
        return original(self)

    run.acp_channels_serving = True  # type: ignore[attr-defined]
    server_class.run = run


def _install_patches(server: Any) -> None:
    """Every patch of the module docstring; SIGTERM only for a `server` that installs signal
    handlers (daphne's CLI; not `runserver` with its reloader), from the main thread."""
    global _installed
    if _installed:
        return
    _installed = True
    from daphne.ws_protocol import WebSocketProtocol

    _install_accept_headers(WebSocketProtocol)
    _install_denial_response(WebSocketProtocol)
    _install_handshake_guard(WebSocketProtocol)
    _install_websocket_scheme()
    _install_close_handshake_on_failure()
    _install_plain_debug_values()
    _install_guards()
    if server is not None and server.signal_handlers and threading.current_thread() is threading.main_thread():
        _install_graceful_sigterm()


def plain_type(obj: Any) -> str:
    """autobahn's `hltype` without the colours: "<module.qualname>"."""
    return f"<{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', type(obj).__qualname__)}>"


def plain_value(value: Any, color: str = "", bold: bool = True) -> str:
    """autobahn's `hlval` without the colours."""
    return str(value)


def _install_plain_debug_values() -> None:
    from autobahn.websocket import protocol

    protocol.hltype = plain_type  # type: ignore[attr-defined]
    protocol.hlval = plain_value  # type: ignore[attr-defined]


def _install_accept_headers(websocket_protocol: Any) -> None:
    original = websocket_protocol.handle_reply

    def handle_reply(self: Any, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "websocket.send":  # every message of a stream: nothing of ours to do
            original(self, message)
            return
        accepted = self.state in (self.STATE_OPEN, self.STATE_CLOSING, self.STATE_CLOSED)
        if kind == "websocket.close" and accepted:
            _send_close_frame(self, message)
            return
        if str(kind).startswith(DENIAL_PREFIX):
            _deny(self, message)
            return
        headers = message.get("headers")
        if kind != "websocket.accept" or not headers or not hasattr(self, "handshake_deferred"):
            original(self, message)
            return
        pairs = {bytes(name).decode("latin-1"): bytes(value).decode("latin-1") for name, value in headers}
        self.handshake_deferred.callback((message.get("subprotocol"), pairs))
        del self.handshake_deferred

    handle_reply.acp_channels_patched = True  # type: ignore[attr-defined]
    websocket_protocol.handle_reply = handle_reply


DENIAL_PREFIX = "websocket.http.response."


def _deny(protocol: Any, message: dict[str, Any]) -> None:
    """The application answers the upgrade with an HTTP response instead of accepting it: the
    start is kept, the response is written once its body is complete (autobahn fails the
    handshake through `sendHttpErrorResponse`, which writes ours), then the connection closes."""
    if not hasattr(protocol, "handshake_deferred"):
        return  # accepted or refused already: nothing to answer
    if message["type"] == "websocket.http.response.start":
        protocol.acp_denial = (int(message["status"]), list(message.get("headers") or []), bytearray())
        return
    denial = getattr(protocol, "acp_denial", None)
    if message["type"] != "websocket.http.response.body" or denial is None:
        return
    denial[2].extend(message.get("body", b""))
    if message.get("more_body", False):
        return
    from autobahn.websocket.types import ConnectionDeny

    deferred = protocol.handshake_deferred
    del protocol.handshake_deferred
    deferred.errback(ConnectionDeny(denial[0], _reason_phrase(denial[0])))  # type: ignore[no-untyped-call]


def _reason_phrase(status: int) -> str:
    from http import HTTPStatus

    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Refused"


def _install_denial_response(websocket_protocol: Any) -> None:
    original = websocket_protocol.sendHttpErrorResponse

    def send_http_error_response(self: Any, code: int, reason: str, responseHeaders: Any = None) -> None:
        denial = getattr(self, "acp_denial", None)
        if denial is None:
            original(self, code, reason, responseHeaders)
            return
        status, headers, body = denial
        self.acp_denial = None
        lines = [f"HTTP/1.1 {status} {_reason_phrase(status)}"]
        names = set()
        for name, value in headers:
            names.add(bytes(name).lower())
            lines.append(f"{bytes(name).decode('latin-1')}: {bytes(value).decode('latin-1')}")
        if b"content-length" not in names:
            lines.append(f"Content-Length: {len(body)}")
        lines.append("Connection: close")
        self.sendData(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + bytes(body))

    websocket_protocol.sendHttpErrorResponse = send_http_error_response


def _streams_on(message: dict[str, Any]) -> bool:
    """A WebSocket message, or a response body chunk with more to come (an event stream)."""
    kind = message.get("type")
    return kind == "websocket.send" or (kind == "http.response.body" and bool(message.get("more_body")))


def _install_close_handshake_on_failure() -> None:
    from daphne.ws_protocol import WebSocketFactory

    original = WebSocketFactory.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.setProtocolOptions(failByDrop=False)  # see the module docstring: close codes, not resets

    WebSocketFactory.__init__ = __init__


def _install_guards() -> None:
    import daphne.server

    from acp_channels._daphne_guards import GuardedHTTPFactory, gate_before_write, watch_h2_connections

    # Server.run() builds `HTTPFactory(self)` from daphne.server's namespace.
    daphne.server.HTTPFactory = GuardedHTTPFactory
    try:
        from twisted.web._http2 import H2Connection
    except ImportError:
        pass  # no h2 package: daphne serves HTTP/1.1 only
    else:
        watch_h2_connections(H2Connection)
    server_class: Any = daphne.server.Server
    original = server_class.handle_reply

    async def handle_reply(self: Any, protocol: Any, message: dict[str, Any]) -> None:
        # The application's `send`: write, then wait while the transport is over its buffer.
        connection = self.connections.get(protocol)
        if (connection is None or "disconnected" in connection) and _streams_on(message):
            # daphne drops it and returns at once: a stream would race through its output into
            # a dead connection, counted as delivered (beyond a replay window). Wait until the
            # application learns of the disconnect and cancels us (or daphne's close timeout).
            await _until_cancelled()
        gate = None if connection is None or "disconnected" in connection else gate_before_write(protocol, message)
        await send_or_wait_when_gone(original(self, protocol, message))
        if gate is not None and not gate.writable:
            await gate.wait_writable()

    server_class.handle_reply = handle_reply


async def _until_cancelled() -> None:
    await asyncio.get_running_loop().create_future()


async def send_or_wait_when_gone(write: Awaitable[None]) -> None:
    """daphne's write of a reply; when autobahn closed the WebSocket before daphne heard of it
    (the client left a moment ago: autobahn raises Disconnected), wait for the disconnect that
    is on its way, as for a connection daphne knows is gone, instead of failing the send (the
    consumer logged that as our fault, with a traceback)."""
    try:
        await write
    except Disconnected:
        await _until_cancelled()


def _install_handshake_guard(websocket_protocol: Any) -> None:
    """daphne decodes Sec-WebSocket-Protocol as ASCII inside onConnect and answers a 500 with a
    traceback when a client sends other bytes; refuse such a handshake with 400 instead."""
    from autobahn.websocket.types import ConnectionDeny

    original = websocket_protocol.onConnect

    def on_connect(self: Any, request: Any) -> Any:
        offered = request.headers.get("sec-websocket-protocol", "")
        if not offered.isascii():
            raise ConnectionDeny(ConnectionDeny.BAD_REQUEST, "Sec-WebSocket-Protocol must be ASCII")  # type: ignore[no-untyped-call]
        return original(self, request)

    websocket_protocol.onConnect = on_connect


def _send_close_frame(protocol: Any, message: dict[str, Any]) -> None:
    from autobahn.util import encode_truncate

    reason = message.get("reason")
    reason_utf8 = encode_truncate(reason, 123) if reason else None  # 125 bytes minus the code
    protocol.sendCloseFrame(code=message.get("code", 1000), reasonUtf8=reason_utf8)  # ignored once closing


def _install_websocket_scheme() -> None:
    """The scheme daphne leaves out of WebSocket scopes, and the denial-response extension."""
    from daphne.server import Server
    from twisted.internet.interfaces import ISSLTransport

    original = Server.create_application

    def create_application(self: Any, protocol: Any, scope: dict[str, Any]) -> Any:
        if scope.get("type") == "websocket":
            # Answered by daphne_compat._deny (daphne itself announces no extension).
            scope["extensions"] = {**(scope.get("extensions") or {}), "websocket.http.response": {}}
        if scope.get("type") == "websocket" and "scheme" not in scope:
            forwarded = getattr(protocol, "client_scheme", None)  # X-Forwarded-Proto, with --proxy-headers
            if forwarded is None:
                secure = ISSLTransport.providedBy(protocol.transport)
            else:
                secure = forwarded in ("https", "wss")
            scope["scheme"] = "wss" if secure else "ws"
        return original(self, protocol, scope)

    Server.create_application = create_application


def _install_graceful_sigterm() -> None:
    from twisted.internet import reactor as twisted_reactor

    reactor: Any = twisted_reactor

    draining: list[asyncio.Future[None]] = []

    def take_over_sigterm() -> None:
        signal.signal(signal.SIGTERM, lambda signum, frame: reactor.callFromThread(start_draining))

    def start_draining() -> None:
        draining.append(asyncio.ensure_future(drain_then_stop()))

    async def drain_then_stop() -> None:
        from acp_channels._conf import acp_settings
        from acp_channels._lifecycle import lifecycle

        if lifecycle.draining:
            return
        try:
            await lifecycle.drain(acp_settings.SHUTDOWN_GRACE_SECONDS)
        finally:
            reactor.stop()

    reactor.callWhenRunning(take_over_sigterm)
