"""The demo agent without its transcript: each session forgets its history after every turn.

The demo agent keeps every turn's text for session/load, so a long stream grows the server by
the size of what it sent, whatever the server itself keeps. `bench.resume_cost` measures the
memory of the replay window with this agent (`ACP_AGENT=bench.agent_no_history.create_agent`),
so that what stays after a stream is the server's own.
"""

from __future__ import annotations

from typing import Any

from acp.schema import PromptResponse
from acp_channels._identity import AgentContext
from demo_project.agent import DemoAgent


class NoHistoryAgent(DemoAgent):
    async def prompt(self, session_id: str, prompt: list[Any], **kwargs: Any) -> PromptResponse:
        try:
            return await super().prompt(session_id, prompt, **kwargs)
        finally:
            session = self._session(session_id)
            session.history.clear()
            session.history_chars = 0


def create_agent(context: AgentContext | None = None) -> NoHistoryAgent:
    return NoHistoryAgent(context)
