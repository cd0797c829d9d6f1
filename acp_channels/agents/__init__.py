"""Agents behind one small interface: frames in, frames out, close.

The host does not know what kind of agent it talks to. An adapter turns one ACP connection's
frames into whatever its agent speaks: an in-process agent written with the `acp` SDK
(`acp_channels.agents.sdk`), an agent program on stdio, one process per connection
(`acp_channels.agents.stdio`), or a scripted agent in tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from acp_channels.identity import AgentContext
from acp_channels.protocol import Frame


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


class AgentClosed(ConnectionError):
    """The agent no longer accepts input."""


def create_agent_channel(context: AgentContext) -> AgentChannel:
    """A new agent for one connection, from the `AGENT` setting.

    A command (a dict) starts its own agent process. A dotted path names a factory that returns
    an agent written with the `acp` SDK, or an object that already speaks frames (an
    AgentChannel: it has `send`, `receive` and `close`), used as it is.
    """
    from django.utils.module_loading import import_string

    from acp_channels.agents.sdk import SdkAgentChannel
    from acp_channels.conf import acp_settings

    setting = acp_settings.AGENT
    if isinstance(setting, Mapping):
        from acp_channels.agents.stdio import LINE_HEADROOM, StdioAgentChannel

        return StdioAgentChannel.from_setting(
            setting,
            context.connection_id,
            shutdown_grace=float(acp_settings.AGENT_SHUTDOWN_GRACE),
            max_line_bytes=int(acp_settings.MAX_BODY_BYTES) + LINE_HEADROOM,
        )
    agent = import_string(setting)()
    if all(callable(getattr(agent, name, None)) for name in ("send", "receive", "close")):
        return agent  # type: ignore[no-any-return]
    return SdkAgentChannel(agent)
