"""The wire contract of the ACP HTTP transport, as pure functions (no Django, no I/O).

Every rule the edges apply lives here: how a body becomes a frame, which messages are
session-scoped, how `Acp-Session-Id` is applied, what counts as an initial `initialize`, where the
agent's output is routed, the JSON-RPC error objects the transport itself produces, the media
type a POST must have, the batch-size limit, and SSE encoding. The `…_in_slices` variants of the
batch rules are coroutines only to yield to the event loop between slices of a big batch.
Section numbers (§N) refer to docs/wire-contract.md, the wire contract we implement.
"""

from __future__ import annotations

import asyncio
import gc
import json
import re
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeAlias, TypeVar

import orjson

CONNECTION_HEADER: Final = "acp-connection-id"
SESSION_HEADER: Final = "acp-session-id"
#: A reader resuming a stream names the last event it received (SSE: its id; WebSocket: a count).
LAST_EVENT_ID_HEADER: Final = "last-event-id"
#: On a reattached WebSocket's 101: how many messages the server received from the client.
RECEIVED_HEADER: Final = "acp-received"
#: The same count as the first text message on a reattached WebSocket, for browsers (which cannot
#: read the 101's headers): sent for a reattach in the query form, or one that asks with
#: `?acp_received=message`. Not numbered among the server's messages, never replayed.
RECEIVED_NOTIFICATION: Final = "_acp-channels/received"
RECEIVED_QUERY: Final = "acp_received"
RECEIVED_AS_MESSAGE: Final = "message"

JSONRPC_VERSION: Final = "2.0"
PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INTERNAL_ERROR: Final = -32603
REQUEST_CANCELLED: Final = -32800

CANCEL_REQUEST_METHOD: Final = "$/cancel_request"
SUCCESSOR_METHOD: Final = "_proxy/successor"
INITIALIZE_METHOD: Final = "initialize"

#: Client methods that only make sense for one session (§4.2): they need a session id.
SESSION_SCOPED_METHODS: Final = frozenset(
    {
        "session/prompt",
        "session/cancel",
        "session/close",
        "session/delete",
        "session/fork",
        "session/load",
        "session/resume",
        "session/set_config_option",
        "session/set_mode",
        "session/set_model",
    }
)

_I64_MIN: Final = -(2**63)
_I64_MAX: Final = 2**63 - 1

Message: TypeAlias = dict[str, Any]
MessageKind: TypeAlias = Literal["request", "notification", "response"]

#: Which outbound stream a message goes to: None is the connection stream, a string names a
#: session stream (the empty string is a legal session key, as in the reference).
StreamKey: TypeAlias = str | None
CONNECTION_STREAM: Final[StreamKey] = None


# --------------------------------------------------------------------------------------------
# Big batches: processed in slices, and limited in size

#: Batch entries handled between two yields to the event loop: a slice costs well under a
#: millisecond in each stage (classifying, planning, dispatching, regrouping), so other
#: connections wait about that long, plus the agent's own handling of a slice's requests.
SLICE_ENTRIES: Final = 256

T = TypeVar("T")

#: A computation over a batch, written once as a generator that yields between slices; it is
#: run at once (`run_at_once`) or with a yield to the event loop at each slice (`run_in_slices`).
Steps: TypeAlias = Generator[None, None, T]


def run_at_once(steps: Steps[T]) -> T:
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


async def run_in_slices(steps: Steps[T]) -> T:
    """Run a computation, letting every other ready task run between two of its slices."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        await asyncio.sleep(0)


class BatchTooLarge(ValueError):
    """A client batch with more entries than the limit: refused whole, none of it dispatched.

    The transport answers it itself (`reply`, a -32600 with `id: null`), on the stream where
    the agent's answer to a malformed frame would go; it never reaches the agent.
    """

    def __init__(self, entries: int, limit: int) -> None:
        super().__init__(f"batch of {entries} entries is over the limit of {limit}")
        self.entries = entries
        self.limit = limit

    @property
    def reply(self) -> Message:
        return error_response(None, INVALID_REQUEST, "Invalid Request", str(self))


#: The batch-size limit, asked for only when a frame is a batch (a settings lookup costs about
#: as much as parsing a small message); None: no limit.
BatchLimit: TypeAlias = Callable[[], int | None]


def check_batch_size(entries: int, limit: BatchLimit | None) -> None:
    """Raise BatchTooLarge for a batch of `entries` over the limit."""
    maximum = limit() if limit is not None else None
    if maximum is not None and entries > maximum:
        raise BatchTooLarge(entries, maximum)


# --------------------------------------------------------------------------------------------
# Frames (§4.1)


@dataclass(frozen=True, slots=True)
class Single:
    """One valid JSON-RPC message; `raw` is the text it came as, relayed unchanged when known."""

    message: Message
    raw: str | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class MalformedEntry:
    """A batch entry that is not a valid message; the JSON value is kept as it came."""

    value: Any


BatchEntry: TypeAlias = Message | MalformedEntry


@dataclass(frozen=True, slots=True)
class Batch:
    """A non-empty JSON array; each entry is a valid message or a malformed entry."""

    entries: list[BatchEntry]
    raw: str | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class Malformed:
    """Text that is not a message or a batch, with the error the agent side answers it with."""

    raw: str
    error: Message = field(repr=False)


Frame: TypeAlias = Single | Batch | Malformed


def message_kind(value: Any) -> MessageKind | None:
    """Classify a decoded JSON value as a JSON-RPC message, or None if it is not a valid one."""
    if not isinstance(value, dict) or value.get("jsonrpc") != JSONRPC_VERSION:
        return None
    if "id" in value and not _valid_id(value["id"]):
        return None
    if "method" in value:
        if "result" in value or "error" in value or not isinstance(value["method"], str):
            return None
        params = value.get("params")
        if params is not None and not isinstance(params, dict | list):
            return None
        return "request" if "id" in value else "notification"
    if "id" in value and (("result" in value) != ("error" in value)):
        if "error" in value and not _valid_error(value["error"]):
            return None
        return "response"
    return None


def _valid_id(value: Any) -> bool:
    if value is None or isinstance(value, str):
        return True
    return isinstance(value, int) and not isinstance(value, bool) and _I64_MIN <= value <= _I64_MAX


def _valid_error(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get("code"), int)
        and not isinstance(value.get("code"), bool)
        and isinstance(value.get("message"), str)
    )


def is_response_shaped(value: Any) -> bool:
    """An object with no `method` and a `result` or `error`, valid or not (§4.1)."""
    return isinstance(value, dict) and "method" not in value and ("result" in value or "error" in value)


def _not_json(literal: str) -> Any:
    raise ValueError(f"{literal} is not JSON")


def _finite_float(literal: str) -> float:
    value = float(literal)
    if value in (float("inf"), float("-inf")):
        raise ValueError("number out of range")
    return value


_decoder = json.JSONDecoder(parse_constant=_not_json, parse_float=_finite_float)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
#: Every byte but an ASCII digit becomes a space, so a run of digits is a run of "0"s.
_DIGITS_ONLY: Final = bytes(0x30 if 0x30 <= byte <= 0x39 else 0x20 for byte in range(256))
#: orjson reads an integer literal beyond 64 bits as a float; such a literal has 19 digits or more.
_LONG_DIGIT_RUN: Final = b"0" * 19


#: Text at least this long is decoded with the cyclic garbage collector paused: decoding builds
#: millions of containers, and the collections they trigger meanwhile cost more than the
#: decoding itself (16 MiB of `[],`: 1.4 s with, 0.4 s without, plus 0.4 s of collection after).
PAUSE_GC_FROM: Final = 1024 * 1024


def decode_json(text: str) -> Any:
    """Strict JSON, as the reference's parser: NaN/Infinity, numbers out of range and lone
    surrogate escapes raise ValueError (Python's json would accept them).

    orjson is strict that way already and faster than the standard library (16 MiB of floats:
    0.2 s against 2.5 s); text with a run of 19 digits or more (maybe an integer beyond 64
    bits, which orjson would turn into a float) takes the standard library, so such integers
    stay exact. Either way decoding is one call that holds the event loop: its cost is bounded
    by MAX_BODY_BYTES.
    """
    if len(text) < PAUSE_GC_FROM or not gc.isenabled():
        return _decode_json(text)
    gc.disable()
    try:
        return _decode_json(text)
    finally:
        gc.enable()


def _decode_json(text: str) -> Any:
    if _LONG_DIGIT_RUN not in text.encode("utf-8", "surrogatepass").translate(_DIGITS_ONLY):
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError as error:
            raise ValueError(str(error)) from None
    value = _decoder.decode(text)
    if _SURROGATE_ESCAPE.search(text):
        json.dumps(value, ensure_ascii=False).encode("utf-8")  # raises on a lone surrogate
    return value


def parse_frame(text: str) -> Frame:
    """Turn a POST body or a WebSocket text message into a frame; never raises.

    The whole frame at once: for the edges, `read_frame` classifies a big batch in slices and
    applies the batch-size limit.
    """
    try:
        value = decode_json(text)
    except (ValueError, RecursionError):
        return Malformed(text, parse_error(text))
    return frame_from_value(value, text)


async def read_frame(text: str, batch_limit: BatchLimit | None = None) -> Frame:
    """`parse_frame` for input from a client: a batch's entries are classified in slices that
    let other tasks run, and a batch over `batch_limit()` raises BatchTooLarge before any of it
    is classified. The JSON decoding itself is one call (see `decode_json`)."""
    try:
        value = decode_json(text)
    except (ValueError, RecursionError):
        return Malformed(text, parse_error(text))
    if isinstance(value, list) and value:
        check_batch_size(len(value), batch_limit)
        if len(value) > SLICE_ENTRIES:
            return Batch(await run_in_slices(_classify_entries(value)), text)
    return frame_from_value(value, text)


def frame_from_value(value: Any, raw: str | None = None) -> Frame:
    """Classify an already decoded JSON value; `raw` is kept for malformed frames."""
    if isinstance(value, list):
        if not value:
            return Malformed(raw if raw is not None else "[]", invalid_request())
        return Batch(run_at_once(_classify_entries(value)), raw)
    if message_kind(value):
        return Single(value, raw)
    return Malformed(raw if raw is not None else dumps(value), invalid_request())


def _classify_entries(values: list[Any]) -> Steps[list[BatchEntry]]:
    entries: list[BatchEntry] = []
    for start in range(0, len(values), SLICE_ENTRIES):
        if start:
            yield
        entries.extend(
            entry if message_kind(entry) else MalformedEntry(entry) for entry in values[start : start + SLICE_ENTRIES]
        )
    return entries


def frame_value(frame: Frame) -> Any:
    """The JSON value of a frame (a malformed frame has none: its raw text is the payload)."""
    if isinstance(frame, Single):
        return frame.message
    if isinstance(frame, Batch):
        return [entry.value if isinstance(entry, MalformedEntry) else entry for entry in frame.entries]
    raise TypeError("a malformed frame has no JSON value")


def serialize_frame(frame: Frame) -> str:
    """The text of a frame: as it came when unchanged (byte-faithful relay, no re-encoding),
    else compact JSON. A malformed frame is relayed as its raw text (§6.4)."""
    if frame.raw is not None:
        return frame.raw
    return dumps(frame_value(frame))


def dumps(value: Any) -> str:
    """Compact JSON, as the reference writes it (no spaces, non-ASCII kept).

    orjson: every frame an in-process agent emits is serialized once, on the hot path. The
    standard library covers what orjson refuses (integers beyond 64 bits, non-string keys).
    """
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def frame_messages(frame: Frame) -> list[Message]:
    """The valid messages of a frame, in order."""
    if isinstance(frame, Single):
        return [frame.message]
    if isinstance(frame, Batch):
        return [entry for entry in frame.entries if not isinstance(entry, MalformedEntry)]
    return []


# --------------------------------------------------------------------------------------------
# JSON-RPC errors the transport side produces (§12)


def error_response(request_id: Any, code: int, message: str, data: Any = None) -> Message:
    error: Message = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": JSONRPC_VERSION, "id": request_id, "error": error}


#: An agent message may be as large as a client's body (MAX_BODY_BYTES) plus this, for the
#: envelope a reply wraps around what it echoes (§6.7; a stdio agent's output line, the same).
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
MAX_ECHOED_CHARS: Final = 1024


def parse_error(raw: str) -> Message:
    """The reference's -32700 echoes the whole input in `data.line`; input longer than
    MAX_ECHOED_CHARS is echoed as its beginning and a note of its length, so a huge invalid body
    does not come back whole (over a WebSocket, past the client's message size)."""
    return error_response(None, PARSE_ERROR, "Parse error", {"line": echoed_input(raw)})


def echoed_input(raw: str) -> str:
    if len(raw) <= MAX_ECHOED_CHARS:
        return raw
    return f"{raw[:MAX_ECHOED_CHARS]}... [truncated: the input was {len(raw)} characters]"


def invalid_request() -> Message:
    return error_response(None, INVALID_REQUEST, "Invalid Request")


def is_error_response(message: Message) -> bool:
    return "error" in message and "method" not in message


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


class SessionHeaderError(ValueError):
    """A POST's session header does not fit one of its messages (§4.3): answered with 400."""


MISMATCHED_SESSION = "Acp-Session-Id header does not match params.sessionId"
NON_STRING_SESSION = "params.sessionId must be a string"
ARRAY_PARAMS = "Acp-Session-Id header requires object params"
SESSION_REQUIRED = "Acp-Session-Id header required"


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


# --------------------------------------------------------------------------------------------
# Header values and SSE (§3.1, §6.6)


def header_value(values: Iterable[str] | str | None) -> str | None:
    """The first value of a header, or None when absent or not visible ASCII (§3.1)."""
    if values is None:
        return None
    value = values if isinstance(values, str) else next(iter(values), None)
    if value is None or _VISIBLE_ASCII.fullmatch(value) is None:
        return None
    return value


_VISIBLE_ASCII: Final = re.compile(r"[\t -~]*")


_TOKEN: Final = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_MEDIA_TYPE = re.compile(rf"({_TOKEN})/({_TOKEN})")
#: One `; name=value` of a media type (RFC 9110 §8.3.1); a parameter may be empty (`;;`).
_MEDIA_PARAMETER = re.compile(rf'[ \t]*;[ \t]*(?:({_TOKEN})=({_TOKEN}|"(?:[^"\\]|\\.)*"))?')


def is_json_content_type(value: str | None) -> bool:
    """A POST's Content-Type: `application/json` in any case, with optional parameters; a
    `charset`, if given, must be utf-8 (quoted or not, any case). Anything else is 415."""
    if value is None:
        return False
    value = value.strip(" \t")
    match = _MEDIA_TYPE.match(value)
    if match is None or match[1].lower() != "application" or match[2].lower() != "json":
        return False
    position = match.end()
    while position < len(value):
        parameter = _MEDIA_PARAMETER.match(value, position)
        if parameter is None:
            return False
        name, raw = parameter[1], parameter[2]
        if name is not None and name.lower() == "charset":
            charset = re.sub(r"\\(.)", r"\1", raw[1:-1]) if raw.startswith('"') else raw
            if charset.lower() != "utf-8":
                return False
        position = parameter.end()
    return True


SSE_OPENING: Final = b": \n\n"
SSE_KEEPALIVE: Final = b": \n\n"


def event_id(tag: str, seq: int) -> str:
    """The SSE id of a stream's `seq`-th event (opaque to clients)."""
    return f"{tag}-{seq}"


def parse_event_id(value: str) -> tuple[str, int] | None:
    """(tag, seq) of an id made by `event_id`; None for anything else."""
    tag, dash, seq = value.strip().rpartition("-")
    if not dash or not tag or not seq.isdigit() or len(seq) > 18:
        return None
    return tag, int(seq)


_NON_ASCII = re.compile(r"[^\x00-\x7f]+")


def _json_escape(match: re.Match[str]) -> str:
    units = match.group().encode("utf-16-be")
    return "".join(f"\\u{units[i]:02x}{units[i + 1]:02x}" for i in range(0, len(units), 2))


def ascii_json(text: str) -> str:
    """The same JSON with non-ASCII characters as \\u escapes.

    The Python SDK client decodes each network chunk as UTF-8 on its own, so a character split
    across two reads would kill its stream; pure ASCII events cannot be split that way.
    """
    return text if text.isascii() else _NON_ASCII.sub(_json_escape, text)


def sse_event(payload: str, event_id: str | None = None) -> bytes:
    """One SSE event, with an `id:` line when given; text with line breaks (relayed malformed
    output) becomes several data lines."""
    payload = ascii_json(payload)
    head = b"id: " + event_id.encode() + b"\n" if event_id is not None else b""
    if "\n" not in payload and "\r" not in payload:
        return head + b"data: " + payload.encode() + b"\n\n"
    lines = payload.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return head + "".join(f"data: {line}\n" for line in lines).encode() + b"\n"


RESPONSE_SESSION_MISMATCH = "Acp-Session-Id header does not match the session of the request this answers"


def check_response_session(header: str | None, request_route: StreamKey | Literal[False]) -> None:
    """A client's response to an agent request may carry `Acp-Session-Id` or not; when it does,
    it must name the stream the agent's request went to (False: no such request was seen)."""
    if header is not None and request_route is not False and request_route != header:
        raise SessionHeaderError(RESPONSE_SESSION_MISMATCH)
