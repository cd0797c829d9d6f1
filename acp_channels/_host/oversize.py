"""Agent messages too large to relay (docs/wire-contract.md §6.7): how large is allowed, and
what becomes of a larger one (the replacement rules themselves are protocol.refuse_oversized)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from acp_channels import _metrics as metrics
from acp_channels import _protocol as protocol
from acp_channels._agents.channel import AgentChannel, AgentClosed
from acp_channels._conf import acp_settings
from acp_channels._identity import TransportKind
from acp_channels._protocol import Batch, Frame, Single

logger = logging.getLogger("acp_channels.host")


def largest_agent_message(max_buffered_bytes: int) -> int:
    """The largest agent message a connection relays: as large as a client's body plus an
    envelope, or the whole budget if that is larger. A message larger than what the budget has
    left still goes (the agent then waits until readers take it): a connection holds at most
    its budget plus the message each of its agent's tasks is handing over."""
    return max(max_buffered_bytes, acp_settings.MAX_BODY_BYTES + protocol.MESSAGE_HEADROOM)


class OversizeRefusals:
    """Refuses one connection's agent messages over `limit`: logged and counted, the agent's
    own requests in them answered with an error (in the background: the router never waits)."""

    def __init__(self, connection_id: str, transport: TransportKind, agent: AgentChannel, limit: int) -> None:
        self.connection_id = connection_id
        self.transport = transport
        self.agent = agent
        self.limit = limit
        self._answers: set[asyncio.Task[None]] = set()

    def refuse(self, frame: Frame, size: int) -> Frame | None:
        """What the client gets in the place of `frame` (None: nothing)."""
        refused = protocol.refuse_oversized(frame, size, self.limit)
        methods = sorted({str(message.get("method", "reply")) for message in protocol.frame_messages(frame)})
        logger.warning(
            "connection %s: the agent sent a message of %d characters (%s), over the largest an agent may "
            "send (%d: MAX_BODY_BYTES + 1 MiB, or MAX_BUFFERED_BYTES if larger): refused",
            self.connection_id,
            size,
            ", ".join(methods) or "malformed",
            self.limit,
        )
        metrics.record_refused_output(self.transport)
        if refused.to_agent:
            answer: Frame = Single(refused.to_agent[0]) if len(refused.to_agent) == 1 else Batch(list(refused.to_agent))
            answering = asyncio.ensure_future(self._answer(answer))
            self._answers.add(answering)
            answering.add_done_callback(self._answered)
        return refused.to_client

    async def _answer(self, frame: Frame) -> None:
        with contextlib.suppress(AgentClosed):
            await self.agent.send(frame)

    def _answered(self, answering: asyncio.Task[None]) -> None:
        self._answers.discard(answering)
        if not answering.cancelled() and (error := answering.exception()) is not None:
            logger.error("answering the agent of connection %s failed", self.connection_id, exc_info=error)
