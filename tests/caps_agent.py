"""A test agent for the caps tests (ACP_AGENT=tests.caps_agent.create): the wire agent, plus
requests it holds unanswered and a report of its host's state from inside the server process.

- caps/hold: never answered until caps/answer_held (a request in flight as long as the test wants).
- caps/answer_held: answers every held request (result {"held": true}), then itself; sent as a
  notification it works too (a connection at its cap of requests in flight can still send it).
- caps/die: ends the agent at once, answering nothing (held requests never get replies).
- caps/state: result {"sessionStreams", "pendingRequests" (this request included),
  "bufferedBytes", "workerBufferedBytes", "connections"} of the connection hosting this agent.
Everything else behaves as tests.wire_agent (test/received, test/burst, echoes, ...).
"""

from __future__ import annotations

from typing import Any

from acp_channels._host import ConnectionHost, registry
from acp_channels._protocol import Message
from tests.wire_agent import WireAgent


class CapsAgent(WireAgent):
    def __init__(self) -> None:
        super().__init__()
        self._held: list[Message] = []

    def _handle(self, message: Message) -> None:
        method = message.get("method")
        if method == "caps/hold" and "id" in message:
            self._held.append(message)
        elif method == "caps/answer_held":
            held, self._held = self._held, []
            for request in held:
                self._reply(request, {"held": True})
            if "id" in message:
                self._reply(message, {"answered": len(held)})
        elif method == "caps/die":
            self._end()
        elif method == "caps/state" and "id" in message:
            self._reply(message, self.state())
        else:
            super()._handle(message)

    def host(self) -> ConnectionHost:
        return next(host for host in registry if host.agent is self)

    def state(self) -> dict[str, Any]:
        host = self.host()
        return {
            "sessionStreams": host.session_streams,
            "pendingRequests": host.pending_requests,
            "bufferedBytes": host.buffered_bytes,
            "workerBufferedBytes": registry.budget.used,
            "connections": len(registry),
        }


def create() -> CapsAgent:
    return CapsAgent()
