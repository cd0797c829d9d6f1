"""Every place acp_channels patches, subclasses, or reaches into the internals of the packages it
runs on, what each one fixes, and where it lives; and the versions of those packages it was
tested with (`TESTED_VERSIONS`, the pins of pyproject.toml; system check acp_channels.W006 warns
about any other). A new version of one of them may rename what is listed here: run the test
suite against it before widening a pin.

Each daphne fix below (1-5 and the send backpressure of 7) is also written as a patch of
daphne's own code, with tests in daphne's test suite, in docs/upstream/ (its README says which
is which; none has been proposed to daphne yet). The request guards of 6 and 7's other half,
the Twisted and autobahn patches (8, 9) and SIGTERM's drain (10) are acp-channels' policy or
optimisation, not daphne bugs: they have none.

Installed only when daphne serves (`daphne_compat.install()`, called by
`routing.build_asgi_application`, wraps daphne's `Server.run`; the wrapper installs these just
before daphne builds its factories, see "When" below). They are process-wide:

1. daphne `WebSocketProtocol.handle_reply`, replaced (daphne_compat `_install_accept_headers`):
   the headers of `websocket.accept` reach the 101 (daphne drops them); `websocket.close` after
   accept writes the close frame with the application's code and reason through autobahn's
   `sendCloseFrame` (daphne's `serverClose` goes through `sendClose`, which refuses 1009, 1011,
   1013 and drops the reason); `websocket.http.response.*` before accept is kept for the denial.
2. daphne `WebSocketProtocol.sendHttpErrorResponse` (autobahn's method), overridden on daphne's
   class (`_install_denial_response`): writes the application's denial response (status,
   headers, body) where autobahn writes its own for a failed handshake.
3. daphne `WebSocketProtocol.onConnect`, wrapped (`_install_handshake_guard`): a non-ASCII
   Sec-WebSocket-Protocol is refused with 400 (daphne answered 500 with a traceback).
4. daphne `Server.create_application`, wrapped (`_install_websocket_scheme`): WebSocket scopes
   get `scheme` (ws/wss, from TLS or X-Forwarded-Proto) and announce the
   `websocket.http.response` extension.
5. daphne `WebSocketFactory.__init__`, wrapped (`_install_close_handshake_on_failure`): sets
   autobahn's `failByDrop=False`, so a socket failed with 1007/1009/1002 gets its close frame
   instead of a TCP reset.
6. daphne `daphne.server.HTTPFactory` (the module global `Server.run` builds from), replaced by
   `daphne_guards.GuardedHTTPFactory` (`_install_guards`): the request guards below.
7. daphne `Server.handle_reply`, wrapped (`_install_guards`): send backpressure (the
   application's `send` waits while the transport is paused), and a streaming send to a client
   that is gone waits for cancellation instead of racing on; reads daphne's `Server.connections`
   and its "disconnected" key.
8. Twisted `twisted.web._http2.H2Connection.pauseProducing`/`resumeProducing` (a private
   module), wrapped (`daphne_guards.watch_h2_connections`): an HTTP/2 connection whose transport
   is paused closes the send gates of all its streams.
9. autobahn `autobahn.websocket.protocol.hltype`/`hlval`, replaced by uncoloured versions
   (`_install_plain_debug_values`): autobahn formatted a debug line per frame (through click)
   before its logger dropped it, a tenth of a frame's cost.
10. SIGTERM (`_install_graceful_sigterm`): once the reactor runs, SIGTERM drains
    (`lifecycle.drain`, up to SHUTDOWN_GRACE_SECONDS) before stopping the reactor; Twisted
    stopped at once and daphne cancelled every application mid-stream. Only when daphne installs
    signal handlers itself (its CLI; not `runserver` with its reloader) and in the main thread.

The Twisted and daphne internals those guards use (daphne_guards, taking effect through 6):

- `GuardedHTTPChannel(twisted.web.http.HTTPChannel)` overrides connectionMade, dataReceived,
  lineReceived, lineLengthExceeded, headerReceived, allHeadersReceived, rawDataReceived,
  allContentReceived, requestDone and connectionLost, and reads the private `_receivedHeaderSize`,
  `_receivedHeaderCount`, `_command` and `_path`: 408 for slow headers and bodies, 431/414 for
  oversized headers, 413 before an over-limit body is read. It is wrapped in Twisted's private
  `http._GenericHTTPChannelProtocol`, as Twisted's `_genericHTTPChannelProtocolFactory` does.
- `GuardedWebRequest(daphne.http_protocol.WebRequest)` overrides gotLength, handleContentChunk,
  requestReceived and connectionLost, and sets Twisted's private `_parsePOSTFormSubmission` to
  False (Twisted parsed form bodies that daphne never reads).
- `GuardedHTTPFactory(daphne.http_protocol.HTTPFactory)` sets `protocol` and the built
  protocol's `requestFactory`.
- Send gates register as producers with the HTTP channel (reading its private
  `_requestProducer`), with the channel a WebSocket was upgraded from (through the TLS
  transport's private `_producer._producer` membrane), and with an HTTP/2 stream (its private
  `_conn`; the connection's private `_consumerBlocked`).
- `H2BodyRefusal` (413 over HTTP/2) uses H2Connection's private `_reactor`, `_stillProducing`,
  `_streamIsActive()`, `_tryToWriteControlData()` and `_requestDone()`, its `abortRequest()` and
  its h2 state machine `conn`.

In every process (imported, or installed by `AppConfig.ready()`; none of them reaches daphne,
Twisted or autobahn):

- Django: `apps._skip_database_request_hooks` disconnects django.db's `reset_queries` and
  `close_old_connections` from `request_started`/`request_finished` when no database is
  configured (where they have nothing to do, and each cost an OS thread per open stream).
- Django: `handler.AcpASGIHandler` subclasses `ASGIHandler`, overriding `__call__` and `handle`
  (Django 5.2's, step for step, with one disconnect watcher) and adding `close_response`; it
  reads the private `Signal._live_receivers()` and `HttpResponseBase._resource_closers`, and
  gives asgiref's `ThreadSensitiveContext` an `executor` (Django's way without it). _views.py
  appends a `LoopCloser` to a response's private `_resource_closers`.
- channels: `consumers.AcpWebsocketConsumer.dispatch` overrides `AsyncConsumer.dispatch`,
  skipping channels' `close_old_connections` (a thread hop per frame) for `websocket.receive`.
- the acp SDK (pinned ==): `agents.sdk.SdkAgentChannel` wraps the private
  `AgentSideConnection._conn._handler` and closes `_conn`.
- httpcore (the client only): `client.h2_transport` subclasses the private
  `httpcore._async.http2.AsyncHTTP2Connection`, overriding `_receive_events` and
  `_response_closed` and adding a read of its own; without the names it expects it uses
  httpcore's own classes.

When: daphne's CLI (`daphne myproject.asgi:application`) and daphne's `runserver` import
`daphne.server` before the ASGI application, and `build_asgi_application` then wraps
`Server.run` (a class attribute: it does nothing until a daphne Server runs). The wrapper, run
once, installs 1-10 before daphne builds its HTTP and WebSocket factories, under runserver too.
Nothing else is touched by `manage.py check`, `migrate` or any other command (daphne's app
imports `daphne.server`, which installs Twisted's asyncio reactor: that is daphne's doing), nor
by a process that imports the application without serving it with daphne (uvicorn, hypercorn,
tests driving it in-process). An application not built by `build_asgi_application` gets 1-9 at
its first WebSocket (the consumer calls `install()`, which installs them at once when Twisted's
reactor is already running), but not the request guards of 6 (daphne built its factory then)
nor SIGTERM: call `acp_channels._daphne_compat.install()` in its asgi.py.
"""

from __future__ import annotations

import importlib.metadata
import re
from typing import Final

__all__ = ["TESTED_VERSIONS", "release", "specifier", "untested_versions"]

#: Distribution -> (lowest tested release, first untested release): the pins of pyproject.toml
#: (`name>=low,<high`), which tests/test_patches.py keeps equal to these.
TESTED_VERSIONS: Final[dict[str, tuple[str, str]]] = {
    "Django": ("5.2", "5.3"),
    "channels": ("4.3", "4.4"),
    "daphne": ("4.2", "4.3"),
    "Twisted": ("26.10", "26.11"),
    "autobahn": ("26.11", "26.12"),
}


def release(version: str) -> tuple[int, ...]:
    """The release numbers a version starts with ("4.2.3" and "4.2.3rc1": (4, 2, 3))."""
    match = re.match(r"\d+(?:\.\d+)*", version.strip())
    return tuple(int(part) for part in match.group().split(".")) if match else ()


def specifier(name: str) -> str:
    low, high = TESTED_VERSIONS[name]
    return f">={low},<{high}"


def installed_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def untested_versions() -> list[tuple[str, str, str]]:
    """(distribution, installed version, tested specifier) for each installed distribution of
    TESTED_VERSIONS outside its tested range (one not installed is not listed)."""
    found = []
    for name, (low, high) in TESTED_VERSIONS.items():
        version = installed_version(name)
        if version is not None and not release(low) <= release(version) < release(high):
            found.append((name, version, specifier(name)))
    return found
