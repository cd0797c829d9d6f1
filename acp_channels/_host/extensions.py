"""Requests a connection's host answers itself instead of its agent: our extension methods
(names under `_acp-channels/`, provisional: docs/shared-sessions.md).

`_acp-channels/sessions/list` answers what `GET <endpoint>/sessions` answers (the session
directory of the connection's principal), as the result of a JSON-RPC request sent alone (in a
batch it reaches the agent, which knows no such method). The answer goes where any reply the
transport makes goes: the connection stream, or the socket.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Final, Protocol

from acp_channels import _protocol as protocol
from acp_channels._identity import Principal
from acp_channels._protocol import Frame, Single


class ConnectionHost(Protocol):
    """What of a connection's host an extension method needs."""

    connection_id: str
    principal: Principal

    def reply_from_transport(self, text: str) -> None: ...


logger = logging.getLogger("acp_channels.host")

SESSIONS_LIST: Final = "_acp-channels/sessions/list"
#: JSON-RPC's internal error, for a directory the cluster could not give.
INTERNAL_ERROR: Final = -32603

_tasks: set[asyncio.Task[None]] = set()


def answered_here(host: ConnectionHost, frame: Frame) -> bool:
    """Whether `frame` is a request the host answers itself (then it does, in a task)."""
    if not isinstance(frame, Single) or frame.message.get("method") != SESSIONS_LIST:
        return False
    request_id = frame.message.get("id")
    if request_id is None:
        return True  # a notification of it asks nothing
    task = asyncio.get_running_loop().create_task(_answer_sessions_list(host, request_id))
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)
    return True


async def _answer_sessions_list(host: ConnectionHost, request_id: Any) -> None:
    from acp_channels._directory import directory

    reply: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id}
    try:
        reply["result"] = await directory(host.principal)
    except Exception as error:
        logger.warning("connection %s: the session directory failed: %s", host.connection_id, error)
        reply["error"] = {"code": INTERNAL_ERROR, "message": "the session directory is unavailable"}
    try:
        host.reply_from_transport(protocol.dumps(reply))
    except Exception:  # the connection ended meanwhile: nobody to answer
        return
