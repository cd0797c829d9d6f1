"""The WebSocket edge of `/acp`: one JSON-RPC frame per text message, thin over the host (§8)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from typing import Any

from autobahn.exception import PayloadExceededError
from channels.generic.websocket import AsyncWebsocketConsumer

from acp_channels import cors, daphne_compat, protocol
from acp_channels.agents import AgentClosed, create_agent_channel
from acp_channels.auth import SUBPROTOCOL, Refused, RequestContext, authenticate
from acp_channels.conf import acp_settings
from acp_channels.host import ConnectionHost, QuotaExceeded, ServerFull, registry
from acp_channels.lifecycle import lifecycle
from acp_channels.protocol import InboundPlan

TRY_AGAIN_LATER = 1013  # WebSocket close code: the server, or the principal, is at its connection limit
INTERNAL_ERROR = 1011  # WebSocket close code: the agent could not be started, or sending failed
MESSAGE_TOO_BIG = 1009  # WebSocket close code: an agent message exceeds the socket's message limit

logger = logging.getLogger(__name__)


class AcpWebsocketConsumer(AsyncWebsocketConsumer):  # type: ignore[misc]
    # No channel of its own on the layer: the host reaches the socket directly, and an unused
    # layer receive (a Redis read timing out) would end the consumer and cut the socket.
    channel_layer_alias = None
    host: ConnectionHost | None = None
    writer: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        daphne_compat.install()  # under `runserver` daphne is imported after our ready()
        if lifecycle.draining or cors.refusal(cors.websocket_request(self.scope)) is not None:
            await self.close()  # before accept: the server answers 403
            return
        context = RequestContext.for_websocket(self.scope)
        try:
            # Once, at the upgrade: every frame on the socket is this principal's.
            principal = await authenticate(context)
        except Refused as refused:
            # Before accept: daphne answers 403 (it cannot send a 401 or a challenge there).
            logger.info("refused a WebSocket upgrade from %s: %s", context.remote_address or "-", refused)
            await self.close()
            return
        # The subprotocol is "acp" when offered, never the token-carrying one.
        subprotocol = SUBPROTOCOL if SUBPROTOCOL in context.subprotocols else None
        try:
            self.host = registry.create(
                create_agent_channel,
                "websocket",
                max_buffered_bytes=acp_settings.MAX_BUFFERED_BYTES,
                principal=principal,
                remote_address=context.remote_address,
            )
        except (ServerFull, QuotaExceeded):  # MAX_CONNECTIONS, the output budget, the principal's quota
            await self.accept(subprotocol)
            await self.close(code=TRY_AGAIN_LATER)
            return
        except Exception:
            logger.exception("the agent could not be started")
            await self.accept(subprotocol)
            await self.close(code=INTERNAL_ERROR)
            return
        self.host.start()
        # The id on the 101 (under daphne through acp_channels.daphne_compat).
        connection_header = (protocol.CONNECTION_HEADER.encode(), self.host.connection_id.encode())
        await self.accept(subprotocol, headers=[connection_header])
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
        """Send the agent's frames in order; once the connection ends, drain and close.

        A failure to send ends the connection with a close code the client can read (1009 for a
        message over the server's limit, 1011 otherwise) and a log line, never silently.
        """
        try:
            while (items := await host.socket_outbox.take(None)) is not None:
                for item in items:
                    await self.send(text_data=item)
            await self.close()
        except PayloadExceededError as error:
            # daphne (autobahn) refuses a message over --websocket-max-message-size before
            # writing any of it, so the socket can still carry a close frame. uvicorn has no
            # outgoing limit.
            reason = too_big_reason(len(item.encode()), error)
            logger.warning("connection %s: %s; closing the socket", host.connection_id, reason)
            await self.end_after_failure(host, MESSAGE_TOO_BIG, reason)
        except OSError:
            # uvicorn's ClientDisconnected: the client left; disconnect() ends the connection.
            logger.debug("connection %s: the client left while a message was sent", host.connection_id)
        except Exception:
            logger.exception("connection %s: sending to the socket failed; closing it", host.connection_id)
            await self.end_after_failure(host, INTERNAL_ERROR, "the server failed to send an agent message")

    async def end_after_failure(self, host: ConnectionHost, code: int, reason: str) -> None:
        """Tell the client why (the close frame first, so it learns at once), then end the agent."""
        with contextlib.suppress(OSError):  # the client may have left meanwhile (uvicorn)
            await self.close(code=code, reason=reason)
        await host.terminate("send failed")

    async def disconnect(self, code: Any) -> None:
        if self.writer is not None:
            self.writer.cancel()
        if self.host is not None:
            await self.host.terminate("socket closed")


#: autobahn's wording: "... exceeding payload limit of 16781312 octets".
_AUTOBAHN_LIMIT = re.compile(r"limit of (\d+)")


def too_big_reason(size: int, error: Exception) -> str:
    """The close reason for an agent message over the socket's limit (fits a close frame)."""
    limit = _AUTOBAHN_LIMIT.search(str(error))
    if limit is None:
        return f"agent message of {size} bytes exceeds the socket's limit"
    return f"agent message of {size} bytes exceeds the socket's limit of {limit.group(1)}"
