"""Let daphne send the headers an application gives on `websocket.accept`.

daphne 4 drops them, so a WebSocket client never sees `Acp-Connection-Id` on the 101 (the
reference, uvicorn and hypercorn send it), and cannot use its connection id with POST or DELETE.
autobahn, under daphne, already accepts (subprotocol, headers) from the handshake callback; we
only pass the headers through. Installed once from AppConfig.ready() when daphne is present.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)


def install() -> bool:
    try:
        from daphne.ws_protocol import WebSocketProtocol
    except ImportError:
        return False
    original = WebSocketProtocol.handle_reply
    if getattr(original, "acp_channels_patched", False):
        return True

    def handle_reply(self: Any, message: dict[str, Any]) -> None:
        headers = message.get("headers")
        if message.get("type") != "websocket.accept" or not headers or not hasattr(self, "handshake_deferred"):
            original(self, message)
            return
        pairs = {bytes(name).decode("latin-1"): bytes(value).decode("latin-1") for name, value in headers}
        self.handshake_deferred.callback((message.get("subprotocol"), pairs))
        del self.handshake_deferred

    handle_reply.acp_channels_patched = True  # type: ignore[attr-defined]
    WebSocketProtocol.handle_reply = handle_reply
    return True
