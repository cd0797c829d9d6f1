from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from tests.live import DaphneServer


@pytest.fixture(scope="session")
def demo_server() -> Iterator[DaphneServer]:
    """daphne serving the demo agent (the quickstart's server)."""
    server = DaphneServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def wire_server() -> Iterator[DaphneServer]:
    """daphne serving tests.wire_agent, with a short keep-alive and a small body limit knob."""
    server = DaphneServer(env={"ACP_AGENT": "tests.wire_agent.create", "ACP_KEEPALIVE_SECONDS": "0.5"}).start()
    yield server
    server.stop()


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(20.0)) as client:
        yield client


@pytest.fixture(scope="session", autouse=True)
def no_agent_process_left() -> Iterator[None]:
    """After the run, no stdio agent process the tests started is still running."""
    from tests.agent_processes import adopt_orphans, leftover_agents

    adopt_orphans()
    yield
    left = leftover_agents()
    assert not left, f"agent processes still running after the tests: {left}"
