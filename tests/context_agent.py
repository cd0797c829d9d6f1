"""Agent factories and stdio `configure` callables that show what they learned about their
connection (ACP_AGENT=tests.context_agent.create, or a command form naming a configure here).

- `create(context)`: a wire agent (tests.wire_agent) whose initialize reply carries
  `_meta.context` {principal: [kind, id, display], connectionId, transport, remoteAddress};
- `zero()`: a factory taking no arguments, as every factory did before contexts existed;
- `workspace(context)`: a configure giving each principal its own directory under
  $ACP_TEST_WORKSPACES (created on demand) and its own `AGENT_KEY`; it also tries to forge the
  connection id, which must not work;
- `broken_configure` raises, `garbage_configure` returns something that is not a configuration.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from acp_channels._identity import AgentContext
from acp_channels._protocol import Message
from tests.wire_agent import WireAgent

#: Every context a factory here was called with, in this process (for in-process tests).
seen: list[AgentContext] = []


class ContextAgent(WireAgent):
    def __init__(self, context: AgentContext) -> None:
        super().__init__()
        self.context = context

    def _initialize(self, message: Message, params: dict[str, Any]) -> None:
        context = self.context
        shown = {
            "principal": context.principal.to_wire(),
            "connectionId": context.connection_id,
            "transport": context.transport,
            "remoteAddress": context.remote_address,
        }
        self._reply(message, {"protocolVersion": 1, "agentCapabilities": {}, "_meta": {"context": shown}})


def create(context: AgentContext) -> ContextAgent:
    seen.append(context)
    return ContextAgent(context)


def zero() -> WireAgent:
    return WireAgent()


def workspace_for(context: AgentContext) -> Path:
    """$ACP_TEST_WORKSPACES/<kind>-<id>: ids are checked, never trusted as path components."""
    principal = context.principal
    if not re.fullmatch(r"[A-Za-z0-9_-]*", principal.kind + principal.id):
        raise ValueError(f"no workspace for {principal}: unsafe characters in its id")
    return Path(os.environ["ACP_TEST_WORKSPACES"]) / f"{principal.kind}-{principal.id}".rstrip("-")


def workspace(context: AgentContext) -> dict[str, Any]:
    directory = workspace_for(context)
    directory.mkdir(parents=True, exist_ok=True)
    env = {"AGENT_KEY": f"key-for-{context.principal.id or 'nobody'}", "ACP_CHANNELS_CONNECTION_ID": "forged"}
    return {"cwd": str(directory), "env": env}


def broken_configure(context: AgentContext) -> dict[str, Any]:
    raise RuntimeError("this configure cannot configure")


def garbage_configure(context: AgentContext) -> Any:
    return ["not", "a", "mapping"]
