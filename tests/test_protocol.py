"""Unit tests of the pure wire rules in acp_channels._protocol (no Django, no I/O).

Section numbers refer to docs/wire-contract.md; "item N" is an entry of its §14
conformance checklist, re-expressed here at the function level.
"""

from __future__ import annotations

import gc
import json
from collections import deque
from collections.abc import Iterator
from typing import Any, Literal

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from acp_channels import _protocol as protocol
from acp_channels._protocol import (
    ARRAY_PARAMS,
    CONNECTION_STREAM,
    MISMATCHED_SESSION,
    NON_STRING_SESSION,
    RESPONSE_SESSION_MISMATCH,
    SESSION_REQUIRED,
    SLICE_ENTRIES,
    Batch,
    BatchTooLarge,
    Malformed,
    MalformedEntry,
    SessionHeaderError,
    Single,
    StreamKey,
    apply_session_header,
    check_response_session,
    find_reply,
    header_value,
    initialize_entry,
    is_json_content_type,
    is_response_shaped,
    message_kind,
    parse_frame,
    plan_inbound,
    plan_inbound_in_slices,
    read_frame,
    route_outbound,
    serialize_frame,
    sse_event,
)
from tests.loop_turns import LoopTurns

_ABSENT: Any = object()

PARSE_ERROR_CODE = -32700
INVALID_REQUEST_REPLY = {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "Invalid Request"}}


def req(request_id: Any, method: str, params: Any = _ABSENT) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not _ABSENT:
        message["params"] = params
    return message


def notif(method: str, params: Any = _ABSENT) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if params is not _ABSENT:
        message["params"] = params
    return message


def resp(request_id: Any, result: Any = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": {} if result is None else result}


def err(request_id: Any, code: int = -32603, message: str = "boom") -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}


def text(value: Any) -> str:
    return json.dumps(value)


class Routes:
    """A pending-route table like the host's: id key -> FIFO of routes, with a call log."""

    def __init__(self, *recorded: tuple[Any, StreamKey]) -> None:
        self.table: dict[str, deque[StreamKey]] = {}
        self.popped: list[str] = []
        for request_id, route in recorded:
            self.table.setdefault(protocol.id_key(request_id), deque()).append(route)

    def pop(self, key: str) -> StreamKey | Literal[False]:
        self.popped.append(key)
        routes = self.table.get(key)
        if not routes:
            return False
        route = routes.popleft()
        if not routes:
            del self.table[key]
        return route


# --------------------------------------------------------------------------------------------
# §4.1 parse_frame


class TestParseFrame:
    @pytest.mark.parametrize("raw", ["{not json", "", "   ", '{"jsonrpc":"2.0",', "[1,", "nul", "'x'"])
    def test_invalid_json_is_a_parse_error_keeping_the_whole_raw_text(self, raw: str) -> None:
        frame = parse_frame(raw)
        assert isinstance(frame, Malformed)
        assert frame.raw == raw
        assert frame.error == {
            "jsonrpc": "2.0",
            "id": None,
            "error": {"code": PARSE_ERROR_CODE, "message": "Parse error", "data": {"line": raw}},
        }

    def test_deep_nesting_is_a_parse_error_not_a_crash(self) -> None:
        raw = "[" * 100_000 + "]" * 100_000
        frame = parse_frame(raw)
        assert isinstance(frame, Malformed)
        assert frame.error["error"]["code"] == PARSE_ERROR_CODE

    @pytest.mark.parametrize("raw", ["[]", "[ ]", " [\n] "])
    def test_empty_array_is_invalid_request_with_raw_kept(self, raw: str) -> None:
        frame = parse_frame(raw)
        assert isinstance(frame, Malformed)
        assert frame.raw == raw
        assert frame.error == INVALID_REQUEST_REPLY

    @pytest.mark.parametrize("raw", ["17", "-1", "1.5", '"text"', "null", "true", "false", "{}"])
    def test_scalars_and_empty_object_are_invalid_request(self, raw: str) -> None:
        frame = parse_frame(raw)
        assert isinstance(frame, Malformed)
        assert frame.raw == raw
        assert frame.error == INVALID_REQUEST_REPLY

    @pytest.mark.parametrize(
        "envelope",
        [
            {"id": 1, "method": "m"},  # no jsonrpc
            {"jsonrpc": "1.0", "id": 1, "method": "m"},
            {"jsonrpc": 2.0, "id": 1, "method": "m"},
            {"jsonrpc": None, "id": 1, "method": "m"},
            {"jsonrpc": "2.0 ", "id": 1, "method": "m"},
        ],
    )
    def test_bad_jsonrpc_version_is_malformed(self, envelope: dict[str, Any]) -> None:
        raw = text(envelope)
        frame = parse_frame(raw)
        assert isinstance(frame, Malformed)
        assert frame.raw == raw
        assert frame.error == INVALID_REQUEST_REPLY

    @pytest.mark.parametrize("request_id", [None, "abc", "", 0, 1, -1, 2**63 - 1, -(2**63)], ids=repr)
    def test_valid_ids(self, request_id: Any) -> None:
        frame = parse_frame(text(req(request_id, "m")))
        assert frame == Single(req(request_id, "m"))
        assert type(frame.message["id"]) is type(request_id)
        response = parse_frame(text(resp(request_id)))
        assert response == Single(resp(request_id))

    @pytest.mark.parametrize(
        "raw_id", ["9223372036854775808", "-9223372036854775809", "true", "false", "1.0", "1.5", "1e3", "[]", "{}"]
    )
    def test_invalid_ids(self, raw_id: str) -> None:
        for raw in (
            f'{{"jsonrpc":"2.0","id":{raw_id},"method":"m"}}',
            f'{{"jsonrpc":"2.0","id":{raw_id},"result":{{}}}}',
        ):
            frame = parse_frame(raw)
            assert isinstance(frame, Malformed), raw
            assert frame.error == INVALID_REQUEST_REPLY

    def test_batch_keeps_order_and_marks_each_malformed_entry(self) -> None:
        entries = [
            req(1, "session/new", {"cwd": "/"}),
            17,
            {},
            notif("n"),
            {"jsonrpc": "2.0", "result": 1},  # response-shaped, no id
            resp(2),
            [],
            {"jsonrpc": "2.0", "id": True, "method": "m"},
        ]
        frame = parse_frame(text(entries))
        assert frame == Batch(
            [
                req(1, "session/new", {"cwd": "/"}),
                MalformedEntry(17),
                MalformedEntry({}),
                notif("n"),
                MalformedEntry({"jsonrpc": "2.0", "result": 1}),
                resp(2),
                MalformedEntry([]),
                MalformedEntry({"jsonrpc": "2.0", "id": True, "method": "m"}),
            ]
        )

    def test_batch_of_only_malformed_entries_is_still_a_batch(self) -> None:
        assert parse_frame("[17, {}]") == Batch([MalformedEntry(17), MalformedEntry({})])

    def test_nested_array_is_a_batch_with_one_malformed_entry(self) -> None:
        assert parse_frame("[[]]") == Batch([MalformedEntry([])])

    def test_serialize_relays_parsed_text_unchanged(self) -> None:
        raw = '{ "jsonrpc" : "2.0", "method" : "m", "params" : { "t" : "café ✓" } }'
        assert serialize_frame(parse_frame(raw)) == raw
        raw_batch = '[ {"jsonrpc":"2.0","id":1,"result":null} , 17 ]'
        assert serialize_frame(parse_frame(raw_batch)) == raw_batch

    def test_serialize_of_built_frames_is_compact_and_keeps_non_ascii(self) -> None:
        single = Single(notif("m", {"t": "café ✓"}))
        assert serialize_frame(single) == '{"jsonrpc":"2.0","method":"m","params":{"t":"café ✓"}}'
        batch = Batch([{"jsonrpc": "2.0", "id": 1, "result": None}, MalformedEntry(17)])
        assert serialize_frame(batch) == '[{"jsonrpc":"2.0","id":1,"result":null},17]'

    def test_raw_text_does_not_take_part_in_equality(self) -> None:
        assert parse_frame('{"jsonrpc":"2.0", "method":"m"}') == Single(notif("m"))

    def test_malformed_is_relayed_as_its_raw_text(self) -> None:
        assert serialize_frame(parse_frame("{not json\n")) == "{not json\n"
        assert serialize_frame(parse_frame(" [ ] ")) == " [ ] "

    def test_frame_value_of_malformed_raises(self) -> None:
        with pytest.raises(TypeError):
            protocol.frame_value(parse_frame("17"))

    def test_frame_from_value_without_raw(self) -> None:
        assert protocol.frame_from_value([]) == Malformed("[]", INVALID_REQUEST_REPLY)
        assert protocol.frame_from_value({"a": "é"}).raw == '{"a":"é"}'  # type: ignore[union-attr]

    def test_frame_messages(self) -> None:
        assert protocol.frame_messages(parse_frame(text(notif("n")))) == [notif("n")]
        assert protocol.frame_messages(parse_frame(text([resp(1), 17, notif("n")]))) == [resp(1), notif("n")]
        assert protocol.frame_messages(parse_frame("17")) == []

    @pytest.mark.parametrize(
        "raw", ["NaN", "Infinity", "-Infinity", '{"jsonrpc":"2.0","method":"m","params":{"x":NaN}}']
    )
    def test_non_json_number_literals_are_parse_errors(self, raw: str) -> None:
        frame = parse_frame(raw)
        assert isinstance(frame, Malformed)
        assert frame.error["error"]["code"] == PARSE_ERROR_CODE

    def test_lone_surrogate_escape_is_a_parse_error(self) -> None:
        raw = '{"jsonrpc":"2.0","method":"m","params":{"t":"\\ud800"}}'
        frame = parse_frame(raw)
        assert isinstance(frame, Malformed)
        assert frame.error["error"]["code"] == PARSE_ERROR_CODE

    @pytest.mark.parametrize("raw", ["[1e400]", '{"x":-1e400}', '"\\udc00"', '["\\ud800x"]', "[1,]", "\ufeff[1]"])
    def test_strict_json_on_the_fast_path(self, raw: str) -> None:
        frame = parse_frame(raw)
        assert isinstance(frame, Malformed)
        assert frame.error["error"]["code"] == PARSE_ERROR_CODE

    @pytest.mark.parametrize(
        "number", [2**64, 2**64 + 1, -(2**63) - 1, 10**30, -(10**40), 2**63, 10**18, 123456789012345678901234567890]
    )
    def test_integers_beyond_64_bits_stay_exact_integers(self, number: int) -> None:
        # orjson would read these as floats: text with a long run of digits takes the stdlib.
        frame = parse_frame(text(notif("m", {"n": number, "list": [number], "f": 1.5})))
        assert isinstance(frame, Single)
        assert frame.message["params"] == {"n": number, "list": [number], "f": 1.5}
        assert type(frame.message["params"]["n"]) is int

    def test_a_long_digit_run_in_a_string_keeps_strictness(self) -> None:
        assert isinstance(parse_frame('{"t":"12345678901234567890","x":NaN}'), Malformed)
        assert isinstance(parse_frame('{"t":"12345678901234567890","x":1e400}'), Malformed)
        assert isinstance(parse_frame('{"t":"12345678901234567890","u":"\\ud800"}'), Malformed)

    def test_decoding_big_text_leaves_the_garbage_collector_as_it_was(self) -> None:
        big = "[" + "[]," * protocol.PAUSE_GC_FROM
        assert isinstance(parse_frame(big + "[]]"), Batch)
        assert gc.isenabled()
        assert isinstance(parse_frame(big + "x]"), Malformed)
        assert gc.isenabled()
        gc.disable()
        try:
            assert isinstance(parse_frame(big + "[]]"), Batch)
            assert not gc.isenabled()
        finally:
            gc.enable()

    def test_short_invalid_input_is_echoed_whole(self) -> None:
        raw = "x" * protocol.MAX_ECHOED_CHARS
        assert protocol.parse_error(raw)["error"]["data"] == {"line": raw}

    def test_long_invalid_input_is_echoed_truncated_with_its_length(self) -> None:
        raw = "{not json " + "y" * (16 * 1024 * 1024)
        frame = parse_frame(raw)
        assert isinstance(frame, Malformed)
        assert frame.raw == raw  # relayed whole to an agent that answers for itself
        line = frame.error["error"]["data"]["line"]
        assert line.startswith(raw[: protocol.MAX_ECHOED_CHARS])
        assert line.endswith(f"[truncated: the input was {len(raw)} characters]")
        assert len(line) < protocol.MAX_ECHOED_CHARS + 100


@settings(max_examples=300, deadline=None)
@given(
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=8),
        lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
        max_leaves=20,
    )
)
def test_property_decode_json_agrees_with_the_standard_library(value: Any) -> None:
    # json.dumps tells 1 from 1.0, so equal texts mean equal values of equal types.
    for raw in (
        json.dumps(value),
        json.dumps(value, ensure_ascii=False),
        orjson.dumps(value).decode() if _fits_orjson(value) else "0",
    ):
        assert json.dumps(protocol.decode_json(raw)) == json.dumps(json.loads(raw))


def _fits_orjson(value: Any) -> bool:
    try:
        orjson.dumps(value)
    except TypeError:
        return False
    return True


# --------------------------------------------------------------------------------------------
# Big batches: slices and the size limit


def calls(count: int) -> list[dict[str, Any]]:
    return [req(index, "session/prompt", {"sessionId": f"s{index % 3}"}) for index in range(count)]


class TestBigBatches:
    async def test_read_frame_classifies_a_big_batch_in_slices(self) -> None:
        raw = text([*calls(5 * SLICE_ENTRIES), 17])
        async with LoopTurns() as turns:
            frame = await read_frame(raw)
        assert turns.count >= 4  # other tasks ran between the slices
        assert frame == parse_frame(raw)
        assert serialize_frame(frame) == raw

    async def test_read_frame_of_small_input_does_not_yield(self) -> None:
        async with LoopTurns() as turns:
            frames = [await read_frame(raw) for raw in (text(calls(1)[0]), text(calls(SLICE_ENTRIES)), "{x")]
        assert turns.count == 0  # the hot path stays one synchronous step
        assert frames == [parse_frame(text(calls(1)[0])), parse_frame(text(calls(SLICE_ENTRIES))), parse_frame("{x")]

    async def test_plan_inbound_in_slices_matches_plan_inbound(self) -> None:
        frame = parse_frame(text([*calls(4 * SLICE_ENTRIES), notif("n"), 17]))
        async with LoopTurns() as turns:
            plan = await plan_inbound_in_slices(frame, None)
        assert turns.count >= 3
        assert plan == plan_inbound(frame, None)
        assert plan.sessions == ["s0", "s1", "s2"]
        assert len(plan.routes) == 4 * SLICE_ENTRIES

    async def test_plan_in_slices_rejects_the_whole_batch_for_a_late_entry(self) -> None:
        frame = parse_frame(text([*calls(3 * SLICE_ENTRIES), req("late", "session/prompt", {"sessionId": "other"})]))
        with pytest.raises(SessionHeaderError, match=MISMATCHED_SESSION):
            await plan_inbound_in_slices(frame, "s0")

    async def test_plan_in_slices_with_header_and_skip_index(self) -> None:
        entries = [req(0, "initialize", {}), *[req(index, "session/prompt") for index in range(1, 3 * SLICE_ENTRIES)]]
        frame = parse_frame(text(entries))
        plan = await plan_inbound_in_slices(frame, "h", skip_index=0)
        assert plan == plan_inbound(frame, "h", skip_index=0)
        assert isinstance(plan.frame, Batch)
        assert plan.frame.entries[0] == req(0, "initialize", {})
        assert plan.frame.entries[1] == req(1, "session/prompt", {"sessionId": "h"})
        assert plan.sessions == ["h"]

    @pytest.mark.parametrize("limit", [1, 10, 1000])
    async def test_a_batch_over_the_limit_is_refused_whole(self, limit: int) -> None:
        with pytest.raises(BatchTooLarge) as refused:
            await read_frame(text(calls(limit + 1)), lambda: limit)
        assert refused.value.reply == {
            "jsonrpc": "2.0",
            "id": None,
            "error": {
                "code": -32600,
                "message": "Invalid Request",
                "data": f"batch of {limit + 1} entries is over the limit of {limit}",
            },
        }

    async def test_the_limit_counts_every_entry_and_only_batches(self) -> None:
        asked: list[int] = []

        def limit(maximum: int | None) -> protocol.BatchLimit:
            def ask() -> int | None:
                asked.append(1)
                return maximum

            return ask

        assert isinstance(await read_frame(text(calls(10)), limit(10)), Batch)
        with pytest.raises(BatchTooLarge):
            await read_frame(text([17] * 11), limit(10))  # malformed entries count too
        assert isinstance(await read_frame(text(calls(5000)), limit(None)), Batch)
        assert len(asked) == 3
        # Anything but a batch never asks for the limit (a settings lookup on the hot path).
        assert isinstance(await read_frame(text(calls(1)[0]), limit(0)), Single)
        assert isinstance(await read_frame("[]", limit(0)), Malformed)
        assert isinstance(await read_frame("[1,", limit(0)), Malformed)
        assert len(asked) == 3


# --------------------------------------------------------------------------------------------
# Content-Type of a POST


@pytest.mark.parametrize(
    "value",
    [
        "application/json",
        "application/json; charset=utf-8",
        "application/json;charset=UTF-8",
        'Application/JSON;charset="UTF-8"',
        "APPLICATION/JSON",
        "application/json ; charset=utf-8 ; foo=bar",
        'application/json; foo="a;charset=latin-1"; charset=utf-8',
        "application/json;",
        "application/json;\tcharset=utf-8",
        " application/json ",
    ],
)
def test_json_content_types(value: str) -> None:
    assert is_json_content_type(value.replace("\\t", "\t"))


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "garbage",
        "application/jsonfoo",
        "application/json-seq",
        "application/jso",
        "text/json",
        "application/*",
        "*/*",
        "application/json;charset=latin-1",
        'application/json; charset="latin-1"',
        "application/json; charset=utf8",
        "application/json; charset=utf-8; charset=latin-1",
        "application/json; charset",
        "application/json; charset=",
        'application/json; charset="utf-8',
        "application/json charset=utf-8",
        "application/json, text/plain",
        "application /json",
    ],
)
def test_other_content_types(value: str | None) -> None:
    assert not is_json_content_type(value)


# --------------------------------------------------------------------------------------------
# §4.1 message_kind, is_response_shaped


class TestClassification:
    @pytest.mark.parametrize(
        ("value", "kind"),
        [
            (req(1, "m"), "request"),
            (req(None, "m"), "request"),
            (req(1, "m", None), "request"),  # null params read as absent
            (req(1, "m", [1, 2]), "request"),
            (req(1, "m", {}), "request"),
            (notif("m"), "notification"),
            (notif("m", {"a": 1}), "notification"),
            (resp(1), "response"),
            ({"jsonrpc": "2.0", "id": 1, "result": None}, "response"),
            ({"jsonrpc": "2.0", "id": None, "result": 0}, "response"),
            (err(1), "response"),
            (err(None), "response"),
            ({"jsonrpc": "2.0", "id": 1, "error": {"code": 1, "message": "x", "data": [1]}}, "response"),
            # invalid
            ({"jsonrpc": "2.0", "id": 1, "method": 5}, None),
            ({"jsonrpc": "2.0", "id": 1, "method": "m", "params": 3}, None),
            ({"jsonrpc": "2.0", "id": 1, "method": "m", "params": "s"}, None),
            ({"jsonrpc": "2.0", "id": 1, "method": "m", "result": 1}, None),
            ({"jsonrpc": "2.0", "id": 1, "method": "m", "error": {"code": 1, "message": "x"}}, None),
            ({"jsonrpc": "2.0", "result": 1}, None),
            ({"jsonrpc": "2.0", "id": 1}, None),
            ({"jsonrpc": "2.0", "id": 1, "result": 1, "error": {"code": 1, "message": "x"}}, None),
            ({"jsonrpc": "2.0", "id": 1, "error": "x"}, None),
            ({"jsonrpc": "2.0", "id": 1, "error": {"code": "1", "message": "x"}}, None),
            ({"jsonrpc": "2.0", "id": 1, "error": {"code": True, "message": "x"}}, None),
            ({"jsonrpc": "2.0", "id": 1, "error": {"code": 1}}, None),
            ({"jsonrpc": "2.0", "id": 1.0, "result": 1}, None),
            ({"jsonrpc": "2.0", "id": False, "method": "m"}, None),
            ({"jsonrpc": "2.0"}, None),
            ([], None),
            (17, None),
            ("x", None),
            (None, None),
        ],
        ids=repr,
    )
    def test_message_kind(self, value: Any, kind: str | None) -> None:
        assert message_kind(value) == kind

    @pytest.mark.parametrize(
        ("value", "shaped"),
        [
            ({"result": 1}, True),
            ({"error": None}, True),
            ({"result": 1, "error": {}}, True),
            ({"jsonrpc": "2.0", "id": True, "result": 1}, True),
            (resp(1), True),
            (err(None), True),
            ({"method": "m", "result": 1}, False),
            ({"id": 1}, False),
            ({}, False),
            (req(1, "m"), False),
            ([{"result": 1}], False),
            (17, False),
            (None, False),
        ],
        ids=repr,
    )
    def test_is_response_shaped(self, value: Any, shaped: bool) -> None:
        assert is_response_shaped(value) is shaped

    def test_error_objects(self) -> None:
        assert protocol.parse_error("x") == {
            "jsonrpc": "2.0",
            "id": None,
            "error": {"code": -32700, "message": "Parse error", "data": {"line": "x"}},
        }
        assert protocol.invalid_request() == INVALID_REQUEST_REPLY
        assert protocol.error_response(7, -32800, "Request cancelled") == {
            "jsonrpc": "2.0",
            "id": 7,
            "error": {"code": -32800, "message": "Request cancelled"},
        }
        assert protocol.is_error_response(err(1))
        assert not protocol.is_error_response(resp(1))
        assert not protocol.is_error_response(notif("m", {"error": 1}))

    def test_id_key_keeps_json_type(self) -> None:
        keys = {protocol.id_key(value) for value in (1, "1", None, "null", 1.5)}
        assert len(keys) == 5


# --------------------------------------------------------------------------------------------
# §4.2 / §4.3 apply_session_header (items 2-6)


class TestSessionHeader:
    def test_item1_header_names(self) -> None:
        assert protocol.CONNECTION_HEADER == "acp-connection-id"
        assert protocol.SESSION_HEADER == "acp-session-id"

    def test_item2_header_is_inserted_into_object_params(self) -> None:
        original = req(1, "session/prompt", {"prompt": []})
        forwarded, route = apply_session_header(original, "session-1")
        assert forwarded == req(1, "session/prompt", {"prompt": [], "sessionId": "session-1"})
        assert route == "session-1"
        assert protocol.message_session_id(forwarded) == "session-1"
        assert original == req(1, "session/prompt", {"prompt": []})  # the input is not mutated

    def test_item3_conflicting_session_is_rejected(self) -> None:
        with pytest.raises(SessionHeaderError) as raised:
            apply_session_header(req(1, "session/prompt", {"sessionId": "session-1"}), "session-2")
        assert str(raised.value) == "Acp-Session-Id header does not match params.sessionId"
        assert MISMATCHED_SESSION == "Acp-Session-Id header does not match params.sessionId"

    def test_matching_session_is_unchanged(self) -> None:
        message = req(1, "session/prompt", {"sessionId": "s1", "prompt": []})
        forwarded, route = apply_session_header(message, "s1")
        assert forwarded is message
        assert route == "s1"

    @pytest.mark.parametrize("bad", [1, None, {}, [], True], ids=repr)
    def test_non_string_session_id_with_header(self, bad: Any) -> None:
        with pytest.raises(SessionHeaderError) as raised:
            apply_session_header(req(1, "session/prompt", {"sessionId": bad}), "s1")
        assert str(raised.value) == "params.sessionId must be a string"
        assert NON_STRING_SESSION == str(raised.value)

    def test_array_params_with_header(self) -> None:
        with pytest.raises(SessionHeaderError) as raised:
            apply_session_header(req(1, "custom/method", ["a"]), "s1")
        assert str(raised.value) == "Acp-Session-Id header requires object params"
        assert ARRAY_PARAMS == str(raised.value)
        with pytest.raises(SessionHeaderError, match=r"^Acp-Session-Id header requires object params$"):
            apply_session_header(notif("custom/note", []), "s1")

    @pytest.mark.parametrize("params", [_ABSENT, None], ids=["absent", "null"])
    def test_absent_params_become_the_session(self, params: Any) -> None:
        forwarded, route = apply_session_header(req(1, "session/prompt", params), "s1")
        assert forwarded == req(1, "session/prompt", {"sessionId": "s1"})
        assert route == "s1"
        forwarded, route = apply_session_header(notif("session/cancel", params), "s1")
        assert forwarded == notif("session/cancel", {"sessionId": "s1"})
        assert route == "s1"

    def test_header_applies_to_unscoped_methods_too(self) -> None:
        forwarded, route = apply_session_header(req(2, "session/new", {"cwd": "/"}), "s1")
        assert forwarded == req(2, "session/new", {"cwd": "/", "sessionId": "s1"})
        assert route == "s1"

    def test_empty_header_is_a_session_key(self) -> None:
        forwarded, route = apply_session_header(req(1, "session/prompt", {}), "")
        assert forwarded == req(1, "session/prompt", {"sessionId": ""})
        assert route == ""

    def test_without_header_params_session_id_routes(self) -> None:
        message = notif("session/cancel", {"sessionId": "s9"})
        forwarded, route = apply_session_header(message, None)
        assert forwarded is message
        assert route == "s9"

    def test_without_header_unscoped_method_routes_to_connection(self) -> None:
        for message in (req(1, "session/new", {"cwd": "/"}), req(2, "initialize", {}), notif("x", [1])):
            forwarded, route = apply_session_header(message, None)
            assert forwarded is message
            assert route is CONNECTION_STREAM

    def test_non_string_session_id_without_header(self) -> None:
        # not a session id: a session-scoped method then lacks one; other methods go to the connection
        with pytest.raises(SessionHeaderError, match=r"^Acp-Session-Id header required$"):
            apply_session_header(req(1, "session/prompt", {"sessionId": 5}), None)
        assert apply_session_header(req(1, "custom", {"sessionId": 5}), None)[1] is CONNECTION_STREAM

    @pytest.mark.parametrize("header", [None, "s1"])
    def test_responses_ignore_the_header(self, header: str | None) -> None:
        for message in (resp(1), err(2), resp(3, {"sessionId": "other"})):
            forwarded, route = apply_session_header(message, header)
            assert forwarded is message
            assert route is CONNECTION_STREAM

    def test_item4_cancel_request_ignores_header(self) -> None:
        message = notif("$/cancel_request", {"requestId": 1})
        forwarded, route = apply_session_header(message, "session-1")
        assert forwarded is message
        assert "sessionId" not in forwarded["params"]
        assert route is CONNECTION_STREAM
        assert protocol.message_session_id(forwarded) is None

    def test_dollar_methods_ignore_header_and_params_session(self) -> None:
        for message in (
            notif("$/cancel_request", {"requestId": 1, "sessionId": "s1"}),
            req(4, "$/custom", ["array", "params"]),
            notif("$/progress"),
        ):
            forwarded, route = apply_session_header(message, "other")
            assert forwarded is message
            assert route is CONNECTION_STREAM
            assert protocol.message_session_id(message) is None

    # The reference's envelope (core schema SuccessorMessage, `#[serde(flatten)] message`): the
    # wrapped message's `method` and `params` are the envelope's params themselves.
    WRAPPED_CANCEL = notif("_proxy/successor", {"method": "$/cancel_request", "params": {"requestId": 1}})
    DOUBLE_WRAPPED_CANCEL = notif(
        "_proxy/successor",
        {"method": "_proxy/successor", "params": {"method": "$/cancel_request", "params": {"requestId": 1}}},
    )

    @pytest.mark.parametrize("message", [WRAPPED_CANCEL, DOUBLE_WRAPPED_CANCEL], ids=["once", "twice"])
    def test_item5_successor_wrapped_cancel_ignores_header(self, message: dict[str, Any]) -> None:
        assert protocol.is_connection_scoped(message)
        forwarded, route = apply_session_header(message, "session-1")
        assert forwarded is message
        assert "sessionId" not in forwarded["params"]
        assert route is CONNECTION_STREAM
        assert protocol.message_session_id(message) is None

    def test_successor_wrapping_other_messages_is_session_processed(self) -> None:
        wrapped_prompt = notif("_proxy/successor", {"method": "session/prompt", "params": {}})
        assert not protocol.is_connection_scoped(wrapped_prompt)
        forwarded, route = apply_session_header(wrapped_prompt, "s1")
        assert forwarded["params"]["sessionId"] == "s1"
        assert route == "s1"
        # only a notification envelope counts as a cancel (the reference checks Notification)
        as_request = req(9, "_proxy/successor", {"method": "$/cancel_request", "params": {"requestId": 1}})
        assert not protocol.is_connection_scoped(as_request)
        # an envelope whose inner method is not a string stops peeling: not a cancel
        broken = notif("_proxy/successor", {"method": 5, "params": {}})
        assert not protocol.is_connection_scoped(broken)

    def test_item6_the_ten_session_scoped_methods_need_a_session(self) -> None:
        ten = {
            "session/cancel",
            "session/close",
            "session/delete",
            "session/fork",
            "session/load",
            "session/prompt",
            "session/resume",
            "session/set_config_option",
            "session/set_mode",
            "session/set_model",
        }
        assert protocol.SESSION_SCOPED_METHODS == ten
        for method in sorted(ten):
            for message in (req(1, method, {"x": 1}), req(1, method), notif(method, {})):
                with pytest.raises(SessionHeaderError) as raised:
                    apply_session_header(message, None)
                assert str(raised.value) == "Acp-Session-Id header required", method
            with pytest.raises(SessionHeaderError, match=r"^Acp-Session-Id header required$"):
                apply_session_header(req(1, method, ["array"]), None)
            assert apply_session_header(req(1, method, {"sessionId": "s"}), None)[1] == "s"
        assert SESSION_REQUIRED == "Acp-Session-Id header required"

    @pytest.mark.parametrize("method", ["session/new", "session/list", "initialize", "authenticate", "x/y"])
    def test_other_methods_do_not_need_a_session(self, method: str) -> None:
        assert apply_session_header(req(1, method, {}), None) == (req(1, method, {}), CONNECTION_STREAM)


# --------------------------------------------------------------------------------------------
# §4.3 plan_inbound


class TestPlanInbound:
    def test_single_request_with_header(self) -> None:
        plan = plan_inbound(Single(req(1, "session/prompt", {"prompt": []})), "s1")
        assert plan.frame == Single(req(1, "session/prompt", {"prompt": [], "sessionId": "s1"}))
        assert plan.routes == [("1", "s1")]
        assert plan.sessions == ["s1"]
        assert plan.session_header == "s1"

    def test_connection_routes_are_recorded_too(self) -> None:
        plan = plan_inbound(Single(req("a", "session/new", {"cwd": "/"})), None)
        assert plan.routes == [('"a"', CONNECTION_STREAM)]
        assert plan.sessions == []

    def test_routes_skip_null_ids_and_keep_duplicates(self) -> None:
        frame = Batch(
            [
                req(1, "session/prompt", {"sessionId": "a"}),
                req(1, "custom"),
                req(None, "session/prompt", {"sessionId": "b"}),
                notif("session/cancel", {"sessionId": "c"}),
                req("1", "session/load", {"sessionId": "a"}),
                resp(9),
                MalformedEntry(17),
            ]
        )
        plan = plan_inbound(frame, None)
        assert plan.frame == frame
        assert plan.routes == [("1", "a"), ("1", CONNECTION_STREAM), ('"1"', "a")]
        assert plan.sessions == ["a", "b", "c"]  # every session route creates its stream

    def test_batch_header_applies_to_every_call_entry(self) -> None:
        frame = Batch(
            [
                req(1, "session/prompt", {"prompt": []}),
                notif("$/cancel_request", {"requestId": 0}),
                resp(0, {"outcome": "x"}),
                MalformedEntry({"method": 1}),
                notif("session/cancel"),
            ]
        )
        plan = plan_inbound(frame, "session-1")
        assert plan.frame == Batch(
            [
                req(1, "session/prompt", {"prompt": [], "sessionId": "session-1"}),
                notif("$/cancel_request", {"requestId": 0}),
                resp(0, {"outcome": "x"}),
                MalformedEntry({"method": 1}),
                notif("session/cancel", {"sessionId": "session-1"}),
            ]
        )
        assert plan.routes == [("1", "session-1")]
        assert plan.sessions == ["session-1"]

    def test_item30_one_failing_entry_rejects_the_whole_batch(self) -> None:
        frame = Batch([req(1, "session/new", {"cwd": "/"}), req(2, "session/delete", {})])
        with pytest.raises(SessionHeaderError, match=r"^Acp-Session-Id header required$"):
            plan_inbound(frame, None)
        with pytest.raises(SessionHeaderError, match=r"^Acp-Session-Id header requires object params$"):
            plan_inbound(Batch([req(1, "session/prompt", {}), notif("x", [1])]), "s1")
        with pytest.raises(SessionHeaderError, match=r"^Acp-Session-Id header does not match"):
            plan_inbound(Batch([notif("x", {"sessionId": "s2"}), req(1, "session/prompt", {})]), "s1")

    def test_malformed_frame_passes_unchanged(self) -> None:
        frame = parse_frame("{not json")
        plan = plan_inbound(frame, "s1")
        assert plan.frame is frame
        assert plan.routes == []
        assert plan.sessions == []
        assert plan.session_header == "s1"

    def test_unchanged_frames_keep_their_raw_text(self) -> None:
        raw = '{"jsonrpc": "2.0", "id": 1, "method": "session/prompt", "params": {"sessionId": "s1"}}'
        frame = parse_frame(raw)
        plan = plan_inbound(frame, "s1")
        assert plan.frame is frame
        assert serialize_frame(plan.frame) == raw
        raw_batch = '[{"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": 1}}]'
        batch = parse_frame(raw_batch)
        assert plan_inbound(batch, "s1").frame is batch

    def test_changed_frames_are_re_encoded(self) -> None:
        plan = plan_inbound(parse_frame('{"jsonrpc": "2.0", "id": 1, "method": "session/prompt"}'), "s1")
        assert serialize_frame(plan.frame) == (
            '{"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{"sessionId":"s1"}}'
        )
        plan = plan_inbound(parse_frame('[{"jsonrpc": "2.0", "method": "session/cancel"}, 17]'), "s1")
        assert serialize_frame(plan.frame) == (
            '[{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"s1"}},17]'
        )

    def test_skip_index_leaves_the_initialize_entry_alone(self) -> None:
        init = req(0, "initialize", {"protocolVersion": 1})
        frame = Batch([resp(5), init, req(1, "custom", {})])
        plan = plan_inbound(frame, "s1", skip_index=1)
        assert isinstance(plan.frame, Batch)
        assert plan.frame.entries[1] is init
        assert plan.frame.entries[2] == req(1, "custom", {"sessionId": "s1"})
        assert plan.routes == [("1", "s1")]

    def test_skip_index_does_not_hide_sibling_errors(self) -> None:
        frame = Batch([req(0, "initialize", {}), req(1, "session/prompt", {})])
        with pytest.raises(SessionHeaderError, match=r"^Acp-Session-Id header required$"):
            plan_inbound(frame, None, skip_index=0)


# --------------------------------------------------------------------------------------------
# §5.1 initialize_entry (items 14, 16, 17)


INIT = req(1, "initialize", {"protocolVersion": 1})


class TestInitializeEntry:
    def test_single(self) -> None:
        assert initialize_entry(Single(INIT)) == 0
        assert initialize_entry(Single(req(None, "initialize"))) == 0
        assert initialize_entry(Single(req("x", "initialize", [1]))) == 0

    def test_not_initial_singles(self) -> None:
        assert initialize_entry(Single(notif("initialize", {}))) is None
        assert initialize_entry(Single(req(1, "session/new", {}))) is None
        assert initialize_entry(Single(req(1, "Initialize", {}))) is None
        assert initialize_entry(Single(resp(1))) is None
        assert initialize_entry(parse_frame("{not json")) is None
        assert initialize_entry(parse_frame('{"jsonrpc":"2.0","method":"initialize","id":true}')) is None

    def test_item14_batch_initialize_first(self) -> None:
        assert initialize_entry(Batch([INIT, req(2, "custom", {})])) == 0

    def test_item16_response_shaped_predecessors_are_skipped(self) -> None:
        frame = parse_frame(
            text(
                [
                    resp(7),
                    err(None),
                    {"jsonrpc": "2.0", "id": 8, "result": 1, "error": {"code": 1, "message": "x"}},
                    {"id": 9, "result": 1},  # no jsonrpc
                    {"jsonrpc": "2.0", "id": True, "error": {}},  # bad id
                    INIT,
                    req(2, "custom", {}),
                ]
            )
        )
        assert initialize_entry(frame) == 5

    @pytest.mark.parametrize(
        "predecessor",
        [
            17,
            {},
            [],
            "x",
            None,
            {"jsonrpc": "2.0", "method": 1},
            notif("n"),
            req(5, "session/new", {}),
            notif("initialize"),
        ],
        ids=repr,
    )
    def test_item17_other_predecessors_mean_not_initial(self, predecessor: Any) -> None:
        assert initialize_entry(parse_frame(text([predecessor, INIT]))) is None

    def test_batches_without_an_initialize_call(self) -> None:
        assert initialize_entry(Batch([resp(1), resp(2)])) is None
        assert initialize_entry(Batch([MalformedEntry({"result": 1})])) is None
        assert initialize_entry(Batch([notif("initialize", {}), INIT])) is None
        assert initialize_entry(Batch([req(2, "session/new", {})])) is None


# --------------------------------------------------------------------------------------------
# §5.2 find_reply


class TestFindReply:
    def test_single_and_batch(self) -> None:
        assert find_reply(Single(resp(1)), 1) == resp(1)
        assert find_reply(Single(err(1)), 1) == err(1)
        assert find_reply(Batch([resp(2), err(1, -32600), MalformedEntry(17)]), 1) == err(1, -32600)

    def test_misses(self) -> None:
        assert find_reply(Single(resp(1)), 2) is None
        assert find_reply(Single(resp("1")), 1) is None  # id type matters
        assert find_reply(Single(resp(1)), "1") is None
        assert find_reply(Single(resp(1)), True) is None
        assert find_reply(Single(req(1, "session/request_permission", {})), 1) is None
        assert find_reply(Single(notif("session/update", {"id": 1})), 1) is None
        assert find_reply(parse_frame('{"jsonrpc":"2.0","id":1,"result":1,"error":{}}'), 1) is None
        assert find_reply(Batch([MalformedEntry(resp(1) | {"jsonrpc": "1"})]), 1) is None


# --------------------------------------------------------------------------------------------
# §6.4 / §7.3 route_outbound (items 36, 39-41)


class TestRouteOutbound:
    def test_single_notification_follows_its_session(self) -> None:
        routes = Routes()
        assert route_outbound(Single(notif("session/update", {"sessionId": "s1"})), routes.pop) == "s1"
        assert route_outbound(Single(notif("session/update", {"update": {}})), routes.pop) is CONNECTION_STREAM
        assert route_outbound(Single(notif("session/update", {"sessionId": 1})), routes.pop) is CONNECTION_STREAM
        assert route_outbound(Single(notif("x", ["s1"])), routes.pop) is CONNECTION_STREAM
        assert routes.popped == []

    def test_single_agent_request_follows_its_session(self) -> None:
        routes = Routes((0, "other"))
        message = req(0, "session/request_permission", {"sessionId": "s1"})
        assert route_outbound(Single(message), routes.pop) == "s1"
        assert routes.popped == []  # requests never consume reply routes

    def test_item39_cancel_request_with_session_goes_to_connection(self) -> None:
        message = notif("$/cancel_request", {"requestId": 1, "sessionId": "s1"})
        assert route_outbound(Single(message), Routes().pop) is CONNECTION_STREAM

    def test_single_response_pops_the_oldest_route(self) -> None:
        routes = Routes((1, "a"), (1, "b"), ("1", "c"))
        assert route_outbound(Single(resp(1)), routes.pop) == "a"
        assert route_outbound(Single(err(1)), routes.pop) == "b"
        assert route_outbound(Single(resp(1)), routes.pop) is CONNECTION_STREAM  # all consumed
        assert route_outbound(Single(resp("1")), routes.pop) == "c"
        assert routes.table == {}

    def test_recorded_connection_route(self) -> None:
        routes = Routes((3, CONNECTION_STREAM))
        assert route_outbound(Single(resp(3)), routes.pop) is CONNECTION_STREAM
        assert routes.table == {}

    def test_unknown_and_null_ids_go_to_connection(self) -> None:
        routes = Routes((1, "a"))
        assert route_outbound(Single(resp(2)), routes.pop) is CONNECTION_STREAM
        assert route_outbound(Single(INVALID_REQUEST_REPLY), routes.pop) is CONNECTION_STREAM
        assert routes.popped == ["2"]  # a null id is never looked up
        assert routes.table == {"1": deque(["a"])}

    def test_item36_malformed_output_goes_to_connection(self) -> None:
        routes = Routes((1, "a"))
        assert route_outbound(parse_frame("{not json"), routes.pop) is CONNECTION_STREAM
        assert route_outbound(parse_frame(text(resp(1) | {"jsonrpc": "1"})), routes.pop) is CONNECTION_STREAM
        assert routes.popped == []

    def test_item18_batch_of_same_route_goes_there(self) -> None:
        routes = Routes((1, "s1"), (2, "s1"))
        assert route_outbound(Batch([resp(1), err(2)]), routes.pop) == "s1"
        assert routes.table == {}

    def test_item41_duplicate_ids_consume_each_route(self) -> None:
        routes = Routes((1, "s1"), (1, "s1"))
        assert route_outbound(Batch([resp(1, {"n": 1}), resp(1, {"n": 2})]), routes.pop) == "s1"
        assert routes.table == {}

    def test_item19_mixed_batch_falls_back_and_still_consumes(self) -> None:
        routes = Routes((1, "s1"), (2, CONNECTION_STREAM), (3, "s2"))
        assert route_outbound(Batch([resp(1), resp(2)]), routes.pop) is CONNECTION_STREAM
        assert route_outbound(Batch([resp(3)]), routes.pop) == "s2"
        assert routes.table == {}

    def test_two_sessions_fall_back_to_connection(self) -> None:
        routes = Routes((1, "s1"), (2, "s2"))
        assert route_outbound(Batch([resp(1), resp(2)]), routes.pop) is CONNECTION_STREAM
        assert routes.table == {}

    @pytest.mark.parametrize(
        "odd_one",
        [INVALID_REQUEST_REPLY, resp(99), MalformedEntry(17), notif("session/update", {"sessionId": "s1"})],
        ids=["null-id", "unknown-id", "malformed", "session-notification"],
    )
    def test_any_non_routed_entry_sends_the_batch_to_connection(self, odd_one: Any) -> None:
        routes = Routes((1, "s1"), (2, "s1"))
        assert route_outbound(Batch([resp(1), odd_one, resp(2)]), routes.pop) is CONNECTION_STREAM
        assert routes.table == {}  # routes consumed even though the batch fell back (§7.3)

    def test_item40_agent_notification_batch_is_one_connection_frame(self) -> None:
        frame = Batch([notif("session/update", {"sessionId": "s1"}), notif("session/update", {"sessionId": "s1"})])
        assert route_outbound(frame, Routes().pop) is CONNECTION_STREAM


# --------------------------------------------------------------------------------------------
# §3.1 header_value, §6.6 sse_event, check_response_session


class TestHeadersAndSse:
    @pytest.mark.parametrize(
        ("values", "expected"),
        [
            (None, None),
            ("abc", "abc"),
            ("", ""),
            (["first", "second"], "first"),
            (("only",), "only"),
            ([], None),
            (iter(["gen", "x"]), "gen"),
            ("a b\tc ~!", "a b\tc ~!"),
            ("café", None),
            ("a\x7f", None),
            ("a\x00b", None),
            ("line\nbreak", None),
            ("\x1f", None),
            (["é", "ok"], None),  # only the first value counts
        ],
        ids=lambda value: "an-iterator" if isinstance(value, Iterator) else repr(value),  # stable for xdist
    )
    def test_header_value(self, values: Any, expected: str | None) -> None:
        assert header_value(values) == expected

    def test_sse_single_line(self) -> None:
        assert sse_event('{"jsonrpc":"2.0","id":1,"result":{}}') == b'data: {"jsonrpc":"2.0","id":1,"result":{}}\n\n'
        assert sse_event("message-1") == b"data: message-1\n\n"
        assert sse_event("") == b"data: \n\n"

    def test_sse_escapes_non_ascii_so_events_are_pure_ascii(self) -> None:
        assert sse_event('{"t":"café"}') == b'data: {"t":"caf\\u00e9"}\n\n'
        assert sse_event('"😀✓"') == b'data: "\\ud83d\\ude00\\u2713"\n\n'
        assert json.loads(sse_event('["😀 é"]')[6:-2]) == ["😀 é"]

    @pytest.mark.parametrize(
        ("payload", "expected"),
        [
            ("a\nb", b"data: a\ndata: b\n\n"),
            ("a\r\nb", b"data: a\ndata: b\n\n"),
            ("a\rb", b"data: a\ndata: b\n\n"),
            ("{not json\n", b"data: {not json\ndata: \n\n"),
            ("\n", b"data: \ndata: \n\n"),
            ("x\r\n\r\ny", b"data: x\ndata: \ndata: y\n\n"),
        ],
        ids=repr,
    )
    def test_sse_raw_text_with_line_breaks(self, payload: str, expected: bytes) -> None:
        assert sse_event(payload) == expected

    def test_keepalive_and_opening_comment(self) -> None:
        assert protocol.SSE_KEEPALIVE == b": \n\n"
        assert protocol.SSE_OPENING == b": \n\n"

    def test_check_response_session(self) -> None:
        check_response_session(None, "s1")
        check_response_session(None, CONNECTION_STREAM)
        check_response_session("s1", False)  # no such agent request seen
        check_response_session("s1", "s1")
        for header, route in (("s1", "s2"), ("s1", CONNECTION_STREAM)):
            with pytest.raises(SessionHeaderError) as raised:
                check_response_session(header, route)
            assert str(raised.value) == RESPONSE_SESSION_MISMATCH


# --------------------------------------------------------------------------------------------
# Properties (hypothesis)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=20,
)

ids = st.none() | st.integers() | st.text(max_size=4) | st.booleans() | st.floats(allow_nan=False)
message_like = st.fixed_dictionaries(
    {},
    optional={
        "jsonrpc": st.sampled_from(["2.0", "1.0", 2]),
        "id": ids,
        "method": st.sampled_from(
            ["initialize", "session/prompt", "session/new", "$/cancel_request", "_proxy/successor", "x"]
        )
        | st.integers(),
        "params": st.none()
        | st.lists(json_values, max_size=2)
        | st.fixed_dictionaries({}, optional={"sessionId": json_values, "requestId": ids, "method": st.text()}),
        "result": json_values,
        "error": st.fixed_dictionaries({"code": st.integers(), "message": st.text(max_size=4)}) | json_values,
    },
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_property_json_values_round_trip(value: Any) -> None:
    raw = json.dumps(value)
    frame = parse_frame(raw)
    if isinstance(frame, Malformed):
        assert serialize_frame(frame) == raw
        assert frame.error["error"]["code"] == -32600
    else:
        assert json.loads(serialize_frame(frame)) == value


@settings(max_examples=300, deadline=None)
@given(st.lists(message_like, max_size=4) | message_like)
def test_property_message_like_values_round_trip_and_never_crash_the_rules(value: Any) -> None:
    raw = json.dumps(value)
    frame = parse_frame(raw)
    if isinstance(frame, Malformed):
        assert serialize_frame(frame) == raw
        return
    assert json.loads(serialize_frame(frame)) == value
    for message in protocol.frame_messages(frame):
        assert message_kind(message) is not None
    initialize_entry(frame)
    for header in (None, "s1"):
        try:
            plan = plan_inbound(frame, header)
        except SessionHeaderError as error:
            assert str(error) in {SESSION_REQUIRED, MISMATCHED_SESSION, NON_STRING_SESSION, ARRAY_PARAMS}
        else:
            assert all(key != "null" for key, _ in plan.routes)
    route = route_outbound(frame, Routes().pop)
    assert route is CONNECTION_STREAM or isinstance(route, str)


@settings(max_examples=500, deadline=None)
@given(st.text())
def test_property_parse_frame_never_raises_on_text(raw: str) -> None:
    frame = parse_frame(raw)
    assert isinstance(frame, Single | Batch | Malformed)
    if isinstance(frame, Malformed):
        assert serialize_frame(frame) == raw
        sse_event(serialize_frame(frame))


class TestRefuseOversized:
    """An agent frame over the connection's budget is replaced, message by message (§6.7)."""

    def test_a_reply_becomes_an_error_with_its_id(self) -> None:
        refused = protocol.refuse_oversized(Single({"jsonrpc": "2.0", "id": 7, "result": {"x": 1}}), 100, 10)
        assert refused.to_agent == []
        assert isinstance(refused.to_client, Single)
        assert refused.to_client.message["id"] == 7
        assert refused.to_client.message["error"]["code"] == protocol.INTERNAL_ERROR
        assert refused.to_client.message["error"]["data"] == {"size": 100, "limit": 10}

    def test_an_agent_request_is_answered_to_the_agent(self) -> None:
        request = {"jsonrpc": "2.0", "id": "w", "method": "fs/write_text_file", "params": {"sessionId": "s"}}
        refused = protocol.refuse_oversized(Single(request), 100, 10)
        assert refused.to_client is None
        assert [reply["id"] for reply in refused.to_agent] == ["w"]
        assert protocol.is_error_response(refused.to_agent[0])

    def test_a_notification_becomes_a_notice_on_the_same_session(self) -> None:
        update = {"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s1", "update": {}}}
        refused = protocol.refuse_oversized(Single(update), 100, 10)
        assert isinstance(refused.to_client, Single)
        notice = refused.to_client.message
        assert notice["method"] == protocol.MESSAGE_TOO_LARGE_METHOD
        assert notice["params"] == {"method": "session/update", "sessionId": "s1", "size": 100, "limit": 10}
        assert protocol.route_outbound(refused.to_client, lambda _: False) == "s1"

    def test_a_batch_is_refused_entry_by_entry(self) -> None:
        batch = Batch(
            [
                {"jsonrpc": "2.0", "id": 1, "result": None},
                {"jsonrpc": "2.0", "id": 2, "method": "session/request_permission", "params": {}},
                {"jsonrpc": "2.0", "method": "session/update", "params": {}},
                protocol.MalformedEntry(5),
            ]
        )
        refused = protocol.refuse_oversized(batch, 100, 10)
        assert isinstance(refused.to_client, Batch)
        client = refused.to_client.entries
        assert [entry.get("id") for entry in client if isinstance(entry, dict)] == [1, None, None]
        assert [entry["id"] for entry in refused.to_agent] == [2]

    def test_malformed_output_becomes_a_notice(self) -> None:
        refused = protocol.refuse_oversized(protocol.parse_frame("{" * 50), 50, 10)
        assert isinstance(refused.to_client, Single)
        assert refused.to_client.message["params"]["method"] is None
