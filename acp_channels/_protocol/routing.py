"""Scopes and session ids (§4.2), the session header on a POST (§4.3), what an initial
`initialize` is (§5.1), and where replies and the agent's output go (§6.4, §7.3).
Section numbers (§N) refer to docs/wire-contract.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from acp_channels._protocol.base import (
    CANCEL_REQUEST_METHOD,
    CONNECTION_STREAM,
    INITIALIZE_METHOD,
    SESSION_SCOPED_METHODS,
    SLICE_ENTRIES,
    SUCCESSOR_METHOD,
    Message,
    Steps,
    StreamKey,
    run_at_once,
    run_in_slices,
)
from acp_channels._protocol.frames import (
    Batch,
    BatchEntry,
    Frame,
    Malformed,
    MalformedEntry,
    Single,
    dumps,
    frame_messages,
    is_response_shaped,
)
from acp_channels.errors import SessionHeaderError

# --------------------------------------------------------------------------------------------
# Scoping and session ids (§4.2)


def is_connection_scoped(message: Message) -> bool:
    """`$/…` calls, and `_proxy/successor` envelopes wrapping `$/cancel_request` (at any depth)."""
    method = message.get("method")
    if not isinstance(method, str):
        return False
    if method.startswith("$/"):
        return True
    # Checked in this order because every agent notification passes here.
    return method == SUCCESSOR_METHOD and "id" not in message and _wraps_cancel_request(message)


def _wraps_cancel_request(message: Message) -> bool:
    # The envelope's params are the wrapped message itself: {"method": ..., "params": ...}.
    while message.get("method") == SUCCESSOR_METHOD:
        inner = message.get("params")
        if not isinstance(inner, dict):
            return False
        message = inner
    return message.get("method") == CANCEL_REQUEST_METHOD


def message_session_id(message: Message) -> str | None:
    """`params.sessionId` of a call that is not connection-scoped, if it is a string."""
    if "method" not in message:
        return None
    params = message.get("params")
    if not isinstance(params, dict):
        return None
    session_id = params.get("sessionId")
    if not isinstance(session_id, str) or is_connection_scoped(message):
        return None
    return session_id


MISMATCHED_SESSION = "Acp-Session-Id header does not match params.sessionId"
NON_STRING_SESSION = "params.sessionId must be a string"
ARRAY_PARAMS = "Acp-Session-Id header requires object params"
SESSION_REQUIRED = "Acp-Session-Id header required"
#: The same refusal over WebSocket, where there are no headers (§8).
SESSION_PARAM_REQUIRED = "params.sessionId (a string) required: a session method names its session"


def apply_session_header(message: Message, header: str | None) -> tuple[Message, StreamKey]:
    """Apply `Acp-Session-Id` to one inbound message and give the route of its reply (§4.3).

    Returns the message to forward (a copy when the header is injected) and the stream the
    agent's reply belongs on. Responses and connection-scoped messages ignore the header.
    Raises SessionHeaderError with the reference's 400 text.
    """
    if "method" not in message:
        return message, CONNECTION_STREAM
    if is_connection_scoped(message):
        return message, CONNECTION_STREAM
    if header is not None:
        params = message.get("params")
        if params is None:
            message = {**message, "params": {"sessionId": header}}
        elif isinstance(params, list):
            raise SessionHeaderError(ARRAY_PARAMS)
        elif "sessionId" not in params:
            message = {**message, "params": {**params, "sessionId": header}}
        elif not isinstance(params["sessionId"], str):
            raise SessionHeaderError(NON_STRING_SESSION)
        elif params["sessionId"] != header:
            raise SessionHeaderError(MISMATCHED_SESSION)
    session_id = message_session_id(message)
    if session_id is not None:
        return message, session_id
    if message["method"] in SESSION_SCOPED_METHODS:
        raise SessionHeaderError(SESSION_REQUIRED)
    return message, CONNECTION_STREAM


@dataclass(frozen=True, slots=True)
class InboundPlan:
    """A client frame after session processing: what to forward, and the replies it expects."""

    frame: Frame
    #: (request id key, route) for every request with a non-null id, in frame order.
    routes: list[tuple[str, StreamKey]]
    #: Session streams this POST names; they are created before the frame is forwarded.
    sessions: list[str]
    #: The POST's `Acp-Session-Id`, checked against the routes of agent requests it answers.
    session_header: str | None = None


def plan_inbound(frame: Frame, header: str | None, *, skip_index: int | None = None) -> InboundPlan:
    """Session processing for a whole POST (§4.3); one failing entry rejects all of it.

    `skip_index` leaves one batch entry alone (the initialize entry of an initial batch, §5.2).
    """
    if isinstance(frame, Batch):
        return run_at_once(_plan_batch(frame, header, skip_index))
    return _plan_one(frame, header)


async def plan_inbound_in_slices(frame: Frame, header: str | None, *, skip_index: int | None = None) -> InboundPlan:
    """`plan_inbound`, letting other tasks run between slices of a big batch."""
    if isinstance(frame, Batch) and len(frame.entries) > SLICE_ENTRIES:
        return await run_in_slices(_plan_batch(frame, header, skip_index))
    return plan_inbound(frame, header, skip_index=skip_index)


def _plan_one(frame: Single | Malformed, header: str | None) -> InboundPlan:
    if isinstance(frame, Malformed):
        return InboundPlan(frame, [], [], header)
    planner = _Planner(header)
    forwarded = planner.process(frame.message)
    single = frame if forwarded is frame.message else Single(forwarded)
    return InboundPlan(single, planner.routes, list(planner.sessions), header)


def _plan_batch(frame: Batch, header: str | None, skip_index: int | None) -> Steps[InboundPlan]:
    planner = _Planner(header)
    entries: list[BatchEntry] = []
    changed = False
    for start in range(0, len(frame.entries), SLICE_ENTRIES):
        if start:
            yield
        for index, entry in enumerate(frame.entries[start : start + SLICE_ENTRIES], start):
            if isinstance(entry, MalformedEntry) or index == skip_index:
                entries.append(entry)
                continue
            forwarded = planner.process(entry)
            changed = changed or forwarded is not entry
            entries.append(forwarded)
    return InboundPlan(Batch(entries) if changed else frame, planner.routes, list(planner.sessions), header)


class _Planner:
    """What session processing collects over a frame's messages."""

    __slots__ = ("header", "routes", "sessions")

    def __init__(self, header: str | None) -> None:
        self.header = header
        self.routes: list[tuple[str, StreamKey]] = []
        self.sessions: dict[str, None] = {}  # ordered, and a big batch's lookups stay cheap

    def process(self, message: Message) -> Message:
        forwarded, route = apply_session_header(message, self.header)
        if "method" in forwarded:
            if route is not None:
                self.sessions[route] = None
            if "id" in forwarded and forwarded["id"] is not None:
                self.routes.append((id_key(forwarded["id"]), route))
        return forwarded


def id_key(request_id: Any) -> str:
    """A hashable key for a JSON-RPC id that keeps its JSON type (1 and "1" differ)."""
    return dumps(request_id)


# --------------------------------------------------------------------------------------------
# initialize (§5.1)


def initialize_entry(frame: Frame) -> int | None:
    """If the frame is an initial `initialize` frame, the index of the initialize request.

    A single request gives 0. In a batch, response-shaped predecessors are skipped and the first
    call-shaped entry decides; anything else means "not initial".
    """
    if isinstance(frame, Single):
        message = frame.message
        return 0 if message.get("method") == INITIALIZE_METHOD and "id" in message else None
    if isinstance(frame, Malformed):
        return None
    for index, entry in enumerate(frame.entries):
        if isinstance(entry, MalformedEntry):
            if is_response_shaped(entry.value):
                continue
            return None
        if "method" not in entry:
            continue
        return index if entry["method"] == INITIALIZE_METHOD and "id" in entry else None
    return None


def find_reply(frame: Frame, request_id: Any) -> Message | None:
    """The response to `request_id` inside an agent frame, if it carries one."""
    for message in frame_messages(frame):
        if "method" not in message and "id" in message and message["id"] == request_id:
            if type(message["id"]) is type(request_id):
                return message
    return None


# --------------------------------------------------------------------------------------------
# Outbound routing (§6.4, §7.3)

RouteLookup: TypeAlias = Callable[[str], StreamKey | Literal[False]]
"""Pops the oldest recorded route for an id key; False when none is recorded."""


def route_outbound(frame: Frame, pop_route: RouteLookup) -> StreamKey:
    """The stream an agent frame goes to. Consumes recorded reply routes."""
    if isinstance(frame, Malformed):
        return CONNECTION_STREAM
    if isinstance(frame, Single):
        return _route_message(frame.message, pop_route)
    chosen: set[StreamKey] = set()
    for entry in frame.entries:
        if isinstance(entry, MalformedEntry) or "method" in entry:
            chosen.add(CONNECTION_STREAM)
        else:
            chosen.add(_route_message(entry, pop_route))
    return chosen.pop() if len(chosen) == 1 else CONNECTION_STREAM


def _route_message(message: Message, pop_route: RouteLookup) -> StreamKey:
    if "method" in message:
        return message_session_id(message)
    request_id = message.get("id")
    if request_id is None:
        return CONNECTION_STREAM
    route = pop_route(id_key(request_id))
    return CONNECTION_STREAM if route is False else route


RESPONSE_SESSION_MISMATCH = "Acp-Session-Id header does not match the session of the request this answers"


def check_response_session(header: str | None, request_route: StreamKey | Literal[False]) -> None:
    """A client's response to an agent request may carry `Acp-Session-Id` or not; when it does,
    it must name the stream the agent's request went to (False: no such request was seen)."""
    if header is not None and request_route is not False and request_route != header:
        raise SessionHeaderError(RESPONSE_SESSION_MISMATCH)
