"""The WebSocket edge of `/acp`: one JSON-RPC frame per text message, thin over the host (§8)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from channels.generic.websocket import AsyncWebsocketConsumer

from acp_channels import daphne_compat, protocol
from acp_channels.agents import AgentClosed, create_agent_channel
from acp_channels.conf import acp_settings
from acp_channels.cors import origin_allowed
from acp_channels.host import ConnectionHost, ServerFull, registry
from acp_channels.lifecycle import lifecycle
from acp_channels.protocol import InboundPlan

TRY_AGAIN_LATER = 1013  # WebSocket close code: the server is at its connection limit
INTERNAL_ERROR = 1011  # WebSocket close code: the agent could not be started

logger = logging.getLogger(__name__)


class AcpWebsocketConsumer(AsyncWebsocketConsumer):  # type: ignore[misc]
    # No channel of its own on the layer: the host reaches the socket directly, and an unused
    # layer receive (a Redis read timing out) would end the consumer and cut the socket.
    channel_layer_alias = None
    host: ConnectionHost | None = None
    writer: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        daphne_compat.install()  # under `runserver` daphne is imported after our ready()
        headers = dict(self.scope.get("headers", []))
        origin = headers.get(b"origin")
        if lifecycle.draining or not origin_allowed(origin.decode("latin-1") if origin is not None else None):
            await self.close()  # before accept: the server answers 403
            return
        max_connections: int | None = acp_settings.MAX_CONNECTIONS
        if max_connections is not None and len(registry) >= max_connections:
            await self.accept()
            await self.close(code=TRY_AGAIN_LATER)
            return
        try:
            self.host = registry.create(
                create_agent_channel, "websocket", max_buffered_bytes=acp_settings.MAX_BUFFERED_BYTES
            )
        except ServerFull:  # at MAX_CONNECTIONS or the worker's output budget
            await self.accept()
            await self.close(code=TRY_AGAIN_LATER)
            return
        except Exception:
            logger.exception("the agent could not be started")
            await self.accept()
            await self.close(code=INTERNAL_ERROR)
            return
        self.host.start()
        # The id on the 101 (under daphne through acp_channels.daphne_compat).
        await self.accept(headers=[(protocol.CONNECTION_HEADER.encode(), self.host.connection_id.encode())])
        self.writer = asyncio.create_task(self.write_outbound(self.host))

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if text_data is None or self.host is None:
            return  # binary messages are ignored, as in the reference
        with contextlib.suppress(AgentClosed):
            try:
                frame = await protocol.read_frame(text_data, lambda: acp_settings.MAX_BATCH_ENTRIES)
            except protocol.BatchTooLarge as refused:
                self.host.reply_from_transport(protocol.dumps(refused.reply))
                return
            await self.host.submit(InboundPlan(frame, [], []))

    async def write_outbound(self, host: ConnectionHost) -> None:
        """Send the agent's frames in order; once the connection ends, drain and close."""
        while (items := await host.socket_outbox.take(None)) is not None:
            for item in items:
                await self.send(text_data=item)
        await self.close()

    async def disconnect(self, code: Any) -> None:
        if self.writer is not None:
            self.writer.cancel()
        if self.host is not None:
            await self.host.terminate()
