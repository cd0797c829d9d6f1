"""What an agent message too large to relay becomes (§6.7).
Section numbers (§N) refer to docs/wire-contract.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from acp_channels._protocol.base import INTERNAL_ERROR, JSONRPC_VERSION, Message, error_response
from acp_channels._protocol.frames import Batch, BatchEntry, Frame, MalformedEntry, Single
from acp_channels._protocol.routing import message_session_id

MESSAGE_HEADROOM: Final = 1024 * 1024

#: What an agent message larger than its connection's output budget becomes (§6.7): replies an
#: error, the agent's own requests an error back to the agent, notifications this notice.
MESSAGE_TOO_LARGE_METHOD: Final = "_acp-channels/message_too_large"
MESSAGE_TOO_LARGE: Final = "agent message too large (over MAX_BODY_BYTES + 1 MiB, and over MAX_BUFFERED_BYTES)"


@dataclass(frozen=True, slots=True)
class Refused:
    """An agent frame too large to relay, refused (`refuse_oversized`): what the client gets in
    its place (None: nothing), and the error replies the agent gets for its own requests."""

    to_client: Frame | None
    to_agent: list[Message]


def refuse_oversized(frame: Frame, size: int, limit: int) -> Refused:
    """Refuse an agent frame of `size` characters over `limit`, message by message, so nobody
    waits for an answer that will not come and nothing disappears without a word: a reply
    becomes an error with its id, an agent request is answered to the agent with an error, a
    notification (or malformed output) becomes a `MESSAGE_TOO_LARGE_METHOD` notice that names
    its method and session (and so goes to the same stream)."""
    data = {"size": size, "limit": limit}
    to_client: list[BatchEntry] = []
    to_agent: list[Message] = []
    entries: list[BatchEntry] = (
        frame.entries
        if isinstance(frame, Batch)
        else ([frame.message] if isinstance(frame, Single) else [MalformedEntry(None)])
    )
    for entry in entries:
        if isinstance(entry, MalformedEntry) or "method" not in entry:
            if isinstance(entry, MalformedEntry) or entry.get("id") is None:
                to_client.append(_too_large_notice(None, None, data))
            else:
                to_client.append(error_response(entry["id"], INTERNAL_ERROR, MESSAGE_TOO_LARGE, data))
        elif entry.get("id") is not None:
            to_agent.append(error_response(entry["id"], INTERNAL_ERROR, MESSAGE_TOO_LARGE, data))
        else:
            method = entry["method"] if isinstance(entry["method"], str) else None
            to_client.append(_too_large_notice(method, message_session_id(entry), data))
    if not to_client:
        return Refused(None, to_agent)
    if isinstance(frame, Batch):
        return Refused(Batch(to_client), to_agent)
    only = to_client[0]
    assert not isinstance(only, MalformedEntry)
    return Refused(Single(only), to_agent)


def _too_large_notice(method: str | None, session_id: str | None, data: dict[str, int]) -> Message:
    params: dict[str, Any] = {"method": method, **data}
    if session_id is not None:
        params["sessionId"] = session_id
    return {"jsonrpc": JSONRPC_VERSION, "method": MESSAGE_TOO_LARGE_METHOD, "params": params}


#: A parse error echoes at most this many characters of the input it answers.
