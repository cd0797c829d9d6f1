"""Twisted-level guards for daphne against hostile and slow clients.

Imported only where daphne serves, as `daphne_compat` installs its patches (importing Twisted elsewhere
could install the wrong reactor). Each guard exists because daphne and Twisted leave a gap, and
its module says which:

- `backpressure`: `send` waits while the client does not read (`SendGate`, `gate_before_write`),
  over HTTP/1.1, WebSocket and HTTP/2 (`watch_h2_connections`);
- `reading`: request read timeouts (408), oversized headers (431, 414) and the ACP endpoint's
  body size (413, before the body is buffered), in the channel and request daphne builds
  (`GuardedHTTPFactory`);
- `h2`: what of that applies to an HTTP/2 stream, and its 413 (`H2BodyRefusal`).
"""

from __future__ import annotations

from acp_channels._daphne_guards.backpressure import SendGate, gate_before_write, watch_h2_connections
from acp_channels._daphne_guards.h2 import H2BodyRefusal, h2_connection_of
from acp_channels._daphne_guards.reading import (
    LINGER_SECONDS,
    GuardedHTTPChannel,
    GuardedHTTPFactory,
    GuardedWebRequest,
    guarded_channel_protocol,
)

__all__ = [
    "LINGER_SECONDS",
    "GuardedHTTPChannel",
    "GuardedHTTPFactory",
    "GuardedWebRequest",
    "H2BodyRefusal",
    "SendGate",
    "gate_before_write",
    "guarded_channel_protocol",
    "h2_connection_of",
    "watch_h2_connections",
]
