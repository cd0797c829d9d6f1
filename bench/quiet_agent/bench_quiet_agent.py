"""The demo agent without its own copy of what it sends (bench.adversarial --scenarios large).

The demo agent keeps every chunk of a turn (`turn.output`, joined into the session's history when
the turn ends), so `stream 50 15000000` holds 715 MiB in the agent, and twice that while the turn
ends, whatever the server does with the chunks. This agent sends the same chunks and keeps none of
them: what the server process grows by is then the server's own.

A top-level module in a directory of its own: bench.adversarial appends this directory to the
PYTHONPATH of a daphne started from any checkout (`ACP_AGENT=bench_quiet_agent.create_agent`),
and it overrides the demo agent's `_say`, which that checkout must still have.
"""

from __future__ import annotations

from typing import Any

from acp.helpers import update_agent_message_text
from acp_channels._identity import AgentContext
from demo_project.agent import DemoAgent


class QuietAgent(DemoAgent):
    async def _say(self, turn: Any, text: str) -> None:
        await self.conn.session_update(turn.session.session_id, update_agent_message_text(text))


def create_agent(context: AgentContext | None = None) -> QuietAgent:
    return QuietAgent(context)
