"""Agents behind one small interface: frames in, frames out, close.

The host does not know what kind of agent it talks to. An adapter turns one ACP connection's
frames into whatever its agent speaks: an in-process agent written with the `acp` SDK
(`acp_channels._agents.sdk`), an agent program on stdio, one process per connection
(`acp_channels._agents.stdio`), or a scripted agent in tests.

The interface lives in `agents.channel` (the adapters import only it), the `AGENT` setting's
factory in `agents.factory`; this package re-exports both and imports no adapter.
"""

from __future__ import annotations

from acp_channels._agents.channel import AgentChannel, AgentClosed
from acp_channels._agents.factory import (
    FactoryCall,
    FactorySignatureError,
    call_agent_factory,
    create_agent_channel,
    factory_call,
    factory_problem,
)

__all__ = [
    "AgentChannel",
    "AgentClosed",
    "FactoryCall",
    "FactorySignatureError",
    "call_agent_factory",
    "create_agent_channel",
    "factory_call",
    "factory_problem",
]
