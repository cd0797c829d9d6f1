"""The stdio bridge: a local stdio ACP agent that is a remote `/acp` endpoint.

    acp-bridge https://agents.example.com/acp         # HTTP+SSE
    acp-bridge wss://agents.example.com/acp           # one WebSocket
    ACP_TOKEN=... python -m acp_channels.bridge URL   # the same, with a bearer token
    acp-bridge --attach SESSION_ID URL                # a live session another client started

Editors launch it where they launch any stdio agent; every frame is relayed unchanged both ways,
but a `session/prompt` without an operation id gets one (relay.py); with `--attach` the client
attaches and the editor's session is the attached one (attach.py). Exit status:
0 after stdin closed, 1 when the remote went away or refused, 2 on bad usage, 128 + n after
signal n. See docs/bridge.md.
"""

from __future__ import annotations

from ._relay import BRIDGE_ERROR, Bridge, BridgeEnd

__all__ = ["BRIDGE_ERROR", "Bridge", "BridgeEnd"]
