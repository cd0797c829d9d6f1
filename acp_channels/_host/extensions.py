"""Requests a connection's host answers itself instead of its agent: our extension methods
(names under `_acp-channels/`, provisional: docs/shared-sessions.md), and resends of an
operation it forwarded already.

`_acp-channels/sessions/list` (acp_channels._directory) answers what `GET <endpoint>/sessions`
answers (the session directory of the connection's principal), as the result of a JSON-RPC
request sent alone (in a batch it reaches the agent, which knows no such method). The answer goes where any reply the
transport makes goes: the connection stream, or the socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final, Protocol

from acp_channels import _protocol as protocol
from acp_channels._host.sessions import SessionDirectory, operation_id
from acp_channels._identity import Principal
from acp_channels._protocol import Frame, Single


class ConnectionHost(Protocol):
    """What of a connection's host an extension method needs."""

    connection_id: str
    principal: Principal
    sessions: SessionDirectory

    def reply_from_transport(self, text: str) -> None: ...


logger = logging.getLogger("acp_channels.host")

SESSIONS_LIST: Final = "_acp-channels/sessions/list"
#: JSON-RPC's internal error, for an answer the server could not give.
INTERNAL_ERROR: Final = -32603
#: A request naming an operation forwarded already, under another JSON-RPC id (our code, in the
#: implementation-defined server range).
OPERATION_REPEATED: Final = -32010

Handler = Callable[[Principal], Awaitable[Any]]
#: The methods answered here, each by a module that implements it (registered when the app is
#: ready: the directory needs the cluster, which needs this package).
_handlers: dict[str, Handler] = {}
_tasks: set[asyncio.Task[None]] = set()


def register(method: str, handler: Handler) -> None:
    """Answer `method` here: `handler` takes the connection's principal, returns the result."""
    _handlers[method] = handler


def answered_here(host: ConnectionHost, frame: Frame) -> bool:
    """Whether `frame` is a request the host answers itself (then it does, in a task): one of
    our methods, or an operation it forwarded already (`repeated`)."""
    if not isinstance(frame, Single):
        return False
    if repeated(host, frame.message):
        return True
    handler = _handlers.get(frame.message.get("method"))  # type: ignore[arg-type]
    if handler is None:
        return False
    request_id = frame.message.get("id")
    if request_id is None:
        return True  # a notification of it asks nothing
    task = asyncio.get_running_loop().create_task(_answer(host, handler, request_id))
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)
    return True


def repeated(host: ConnectionHost, message: dict[str, Any]) -> bool:
    """A request naming an operation forwarded already is not forwarded again (its turn would
    run twice). Resent with the same JSON-RPC id, the first one's answer answers it; with
    another id, that one is answered at once with OPERATION_REPEATED, naming the first id."""
    seen, first_id = host.sessions.carried_before(message)
    if not seen:
        return False
    logger.info("connection %s: operation %s repeated: not forwarded", host.connection_id, operation_id(message))
    if first_id != message["id"]:
        error = {
            "code": OPERATION_REPEATED,
            "message": "this operation was accepted already; its answer goes to the first request",
            "data": {"operationId": operation_id(message), "firstRequestId": first_id},
        }
        with contextlib.suppress(Exception):  # the connection ended meanwhile: nobody to answer
            host.reply_from_transport(protocol.dumps({"jsonrpc": "2.0", "id": message["id"], "error": error}))
    return True


async def _answer(host: ConnectionHost, handler: Handler, request_id: Any) -> None:
    reply: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id}
    try:
        reply["result"] = await handler(host.principal)
    except Exception as error:
        logger.warning("connection %s: an extension method failed: %s", host.connection_id, error)
        reply["error"] = {"code": INTERNAL_ERROR, "message": "the server could not answer"}
    try:
        host.reply_from_transport(protocol.dumps(reply))
    except Exception:  # the connection ended meanwhile: nobody to answer
        return
