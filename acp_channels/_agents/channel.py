"""The interface every agent adapter implements: frames in, frames out, close.

The host does not know what kind of agent it talks to; an adapter (`agents.sdk`, `agents.stdio`,
a scripted agent in tests) turns one ACP connection's frames into whatever its agent speaks.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, TypeAlias

from acp_channels._protocol import Frame
from acp_channels.errors import AgentClosed

#: Optional on an adapter: `direct_sink(sink, room)`. The host's sink routes a frame as the agent
#: hands it over (and counts its bytes from then); the adapter awaits `room` after each frame the
#: sink took, which pauses the agent while the connection's output budget is full.
FrameSink: TypeAlias = Callable[[Frame], bool]
RoomWaiter: TypeAlias = Callable[[], Awaitable[None]]


class AgentChannel(Protocol):
    """One agent instance, serving exactly one ACP connection."""

    async def send(self, frame: Frame) -> None:
        """Deliver a client frame. Returns once the frame is queued; may wait (backpressure).

        Raises AgentClosed when the agent no longer takes input.
        """

    async def receive(self) -> Frame | None:
        """The agent's next frame, in emission order; None once the agent has ended."""

    async def close(self) -> None:
        """Stop the agent now (abortive); receive() then ends with None."""


__all__ = ["AgentChannel", "AgentClosed", "FrameSink", "RoomWaiter"]
