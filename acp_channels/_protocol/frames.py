"""Frames (§4.1): how text becomes a single message, a batch or malformed input, and back.
Section numbers (§N) refer to docs/wire-contract.md.
"""

from __future__ import annotations

import gc
import json
import re
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias

import orjson

from acp_channels._protocol.base import (
    _I64_MAX,
    _I64_MIN,
    JSONRPC_VERSION,
    SLICE_ENTRIES,
    BatchLimit,
    Message,
    MessageKind,
    Steps,
    check_batch_size,
    invalid_request,
    parse_error,
    run_at_once,
    run_in_slices,
)

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
