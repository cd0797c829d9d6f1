"""What the live tests of shared sessions share: servers that authenticate with the test tokens
(tests/auth_fixtures.py: ALICE, BOB), in the layouts those tests run on, and the messages they
send and read."""

from __future__ import annotations

from typing import Any

import pytest

from tests.cluster import Cluster
from tests.conftest import start_server
from tests.live import DaphneServer, rpc

#: Bearer tokens through tests.auth_fixtures.lookup; keep-alives often (a reader notices a cut).
TOKEN_ENV = {
    "ACP_AUTHENTICATE": "acp_channels.auth.bearer_token",
    "ACP_TOKEN_LOOKUP": "tests.auth_fixtures.lookup",
    "ACP_KEEPALIVE_SECONDS": "0.5",
}
#: The layouts: SHAPES (tests/conftest.py), and two web workers placing agents on two runners.
RUNNERS = "runners"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def start_token_server(request: pytest.FixtureRequest, layout: str) -> DaphneServer | Cluster:
    """A started server of `layout` (a SHAPES entry, or RUNNERS) with TOKEN_ENV."""
    if layout == RUNNERS:  # two web workers host nothing; two runners host the agents
        redis = request.getfixturevalue("redis_server")
        return Cluster(redis, size=2, runner_count=2, env={**TOKEN_ENV, "ACP_AGENT_HOSTS": "runners"}).start()
    return start_server(layout, TOKEN_ENV, request)


def prompt(request_id: Any, session_id: str, text: str) -> dict[str, Any]:
    return rpc(request_id, "session/prompt", {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]})


def text_of(message: dict[str, Any]) -> str | None:
    """The text of an agent message chunk, else None."""
    if message.get("method") != "session/update":
        return None
    update = message["params"]["update"]
    if update.get("sessionUpdate") != "agent_message_chunk":
        return None
    return str(update["content"]["text"])
