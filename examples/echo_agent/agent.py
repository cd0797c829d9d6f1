# mysite/agent.py: a whole ACP agent, written with the official Python SDK (`acp`)
import uuid
from typing import Any

from acp import PROTOCOL_VERSION, text_block, update_agent_message
from acp.interfaces import Client
from acp.schema import InitializeResponse, NewSessionResponse, PromptResponse


class EchoAgent:
    """Answers each prompt with its text. acp_channels makes one per ACP connection."""

    def on_connect(self, client: Client) -> None:
        self.client = client  # what the agent sends to: session updates, permission requests

    async def initialize(self, protocol_version: int, **kwargs: Any) -> InitializeResponse:
        return InitializeResponse(protocol_version=min(protocol_version, PROTOCOL_VERSION))

    async def new_session(self, cwd: str, **kwargs: Any) -> NewSessionResponse:
        return NewSessionResponse(session_id=uuid.uuid4().hex)

    async def prompt(self, session_id: str, prompt: list[Any], **kwargs: Any) -> PromptResponse:
        text = " ".join(block.text for block in prompt if block.type == "text")
        reply = update_agent_message(text_block(f"You said: {text}"))
        await self.client.session_update(session_id=session_id, update=reply)
        return PromptResponse(stop_reason="end_turn")

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        pass  # session/cancel: nothing to stop, a prompt is answered at once
