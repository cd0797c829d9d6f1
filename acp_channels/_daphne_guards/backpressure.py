"""Send backpressure: daphne's `send` waits while the client does not read.

daphne's ASGI `send` of `http.response.body` and `websocket.send` writes to the Twisted transport
and returns at once; the transport buffers without limit, so a client that stops reading grows
the server without bound and every budget counted above the server is bypassed. Twisted
transports tell their registered producer to pause once more than `bufferSize` (64 KiB) is
unsent and to resume when it has all been written; the HTTP channel forwards that to the
producer registered by the request (and keeps forwarding after daphne upgrades the connection
to a WebSocket, as it stays the transport's producer). A `SendGate` registered there makes
`send` wait after its write while the transport is paused (`gate_before_write`, called by
daphne_compat's `handle_reply`); resuming wakes it, and so does a lost connection.

Over HTTP/2 it works per stream and per connection. The gate is registered with the H2Stream,
which pauses it when the client's flow-control window for the stream is used up (queued data
counts) and resumes it on the client's WINDOW_UPDATE: a stream its client does not read pauses
its agent, the other streams go on. But the window is the client's to choose (up to 2 GiB), and
a client that stops reading the socket stops only the connection's writer, not the streams: each
would queue up to its window. So every gate of the connection is also closed while the
connection's transport is paused (`watch_h2_connections`), as over HTTP/1.1.
"""

from __future__ import annotations

import weakref
from typing import Any

from twisted.internet.interfaces import IPushProducer
from twisted.web import http
from zope.interface import implementer

from acp_channels._daphne_guards.h2 import h2_connection_of
from acp_channels._handoff import LazyEvent


@implementer(IPushProducer)
class SendGate:
    """A push producer registered with an HTTP channel: closed while the transport holds more
    than its buffer size unsent, open again once it has written everything, or the connection
    is gone (so nobody waits on a dead socket). Over HTTP/2 it is registered with the stream
    (closed while the stream's window is used up) and also closed while the connection's
    transport is paused: open only when neither holds it."""

    def __init__(self) -> None:
        self._open = LazyEvent()
        self._open.set()
        self._held_by: set[str] = set()
        self.stopped = False

    def hold(self, reason: str) -> None:
        if not self.stopped:
            self._held_by.add(reason)
            self._open.clear()

    def release(self, reason: str) -> None:
        self._held_by.discard(reason)
        if not self._held_by:
            self._open.set()

    def pauseProducing(self) -> None:
        self.hold("consumer")

    def resumeProducing(self) -> None:
        self.release("consumer")

    def stopProducing(self) -> None:
        self.stopped = True
        self._held_by.clear()
        self._open.set()

    @property
    def writable(self) -> bool:
        """Open now: a writer need not wait (checked first, so the common case awaits nothing)."""
        return self._open.is_set()

    async def wait_writable(self) -> None:
        await self._open.wait()


def gate_before_write(protocol: Any, message: dict[str, Any]) -> SendGate | None:
    """The gate a `send` of `message` must wait on after writing it, registered before the write
    so the write's own pause is seen. The last body message unregisters it (Twisted expects a
    request's producer to be gone before the request finishes)."""
    kind = message.get("type")
    if kind == "http.response.body":
        return _response_gate(protocol, more_body=bool(message.get("more_body", False)))
    if kind == "websocket.send":
        return _websocket_gate(protocol)
    return None


def _response_gate(request: Any, *, more_body: bool) -> SendGate | None:
    gate: SendGate | None = getattr(request, "acp_send_gate", None)
    if not more_body:
        if gate is not None:
            request.acp_send_gate = None
            gate.stopProducing()
            if request.producer is gate and request.channel is not None:
                request.unregisterProducer()
        return None
    if gate is None:
        if request.channel is None or request.finished or request.producer is not None:
            return None
        gate = request.acp_send_gate = SendGate()
        request.registerProducer(gate, True)
        connection = h2_connection_of(request.channel)
        if connection is not None:
            _watch_h2_gate(connection, gate)
    return gate


def _websocket_gate(protocol: Any) -> SendGate | None:
    gate: SendGate | None = getattr(protocol, "acp_send_gate", None)
    if gate is None:
        channel = _upgraded_channel(getattr(protocol, "transport", None))
        if channel is None or channel._requestProducer is not None:
            return None
        gate = protocol.acp_send_gate = SendGate()
        channel.registerProducer(gate, True)
    return gate


def _upgraded_channel(transport: Any) -> Any:
    """The HTTP channel a WebSocket was upgraded from: still the transport's producer (directly
    over TCP, through the TLS wrapper's producer membrane over TLS)."""
    producer = getattr(transport, "producer", None)
    if not isinstance(producer, http.HTTPChannel):
        producer = getattr(getattr(transport, "_producer", None), "_producer", None)
    return producer if isinstance(producer, http.HTTPChannel) else None


# -- HTTP/2: the connection's transport holds every gate of its streams ------------------------


def _watch_h2_gate(connection: Any, gate: SendGate) -> None:
    gates: weakref.WeakSet[SendGate] | None = getattr(connection, "acp_send_gates", None)
    if gates is None:
        gates = connection.acp_send_gates = weakref.WeakSet()
    gates.add(gate)
    if getattr(connection, "_consumerBlocked", None) is not None:
        gate.hold("connection")  # the transport is paused right now


def watch_h2_connections(h2_connection_class: Any) -> None:
    """Close every send gate of an HTTP/2 connection while its transport is paused (the client
    does not read the socket), open them again when it resumes. Wraps Twisted's
    H2Connection.pauseProducing/resumeProducing, which the transport calls."""
    if getattr(h2_connection_class, "acp_gates_watched", False):
        return
    pause, resume = h2_connection_class.pauseProducing, h2_connection_class.resumeProducing

    def pause_producing(self: Any) -> None:
        pause(self)
        for gate in list(getattr(self, "acp_send_gates", ())):
            gate.hold("connection")

    def resume_producing(self: Any) -> None:
        resume(self)
        for gate in list(getattr(self, "acp_send_gates", ())):
            gate.release("connection")

    h2_connection_class.pauseProducing = pause_producing
    h2_connection_class.resumeProducing = resume_producing
    h2_connection_class.acp_gates_watched = True
