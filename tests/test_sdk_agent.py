"""SdkAgentChannel driven directly with frames: the batch contract (docs/wire-contract.md §7.1, §12), id handling and
`$/cancel_request`, on top of an in-process `acp` SDK agent.

No sleeps: every wait is on an event or a frame, bounded by asyncio.wait_for.
"""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from collections.abc import AsyncIterator
from typing import Any

import pytest
from acp import RequestError
from acp.schema import InitializeResponse

from acp_channels._agents import AgentClosed
from acp_channels._agents.sdk import SdkAgentChannel
from acp_channels._protocol import SLICE_ENTRIES, Batch, Frame, Single, parse_frame
from demo_project.agent import AGENT_NAME, create_agent
from tests.loop_turns import LoopTurns

TIMEOUT = 5.0
INVALID_REQUEST = {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "Invalid Request"}}


def cancelled(request_id: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": -32800, "message": "Request cancelled"}}


def result(request_id: Any, value: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": value}


def call(request_id: Any, method: str, params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


def note(method: str, params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": method, "params": params}


def cancel(request_id: Any) -> dict[str, Any]:
    return note("$/cancel_request", {"requestId": request_id})


def frame(value: Any) -> Frame:
    return parse_frame(json.dumps(value))


class ProbeAgent:
    """A tiny SDK agent; its behaviour is chosen by extension methods (`_echo`, `_block`, ...)."""

    def __init__(self) -> None:
        self.started: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.cancelled: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.finished: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.echoed = asyncio.Event()
        self.notes: list[tuple[str, dict[str, Any]]] = []
        self.note_seen: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)

    async def initialize(self, protocol_version: int, **kwargs: Any) -> InitializeResponse:
        return InitializeResponse(protocol_version=protocol_version)

    async def ext_method(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        if method == "echo":
            self.echoed.set()
            return params
        if method == "after_echo":  # answers only once an `_echo` handler has run
            await self.echoed.wait()
            return params
        if method == "block":  # never answers; records its cancellation
            name = params["name"]
            self.started[name].set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled[name].set()
                raise
            finally:
                self.finished[name].set()
        raise RequestError.method_not_found(f"_{method}")

    async def ext_notification(self, method: str, params: dict[str, Any]) -> None:
        self.notes.append((method, params))
        self.note_seen[params.get("name", "")].set()


@pytest.fixture
def agent() -> ProbeAgent:
    return ProbeAgent()


@pytest.fixture
async def channel(agent: ProbeAgent) -> AsyncIterator[SdkAgentChannel]:
    channel = SdkAgentChannel(agent)
    yield channel
    await channel.close()


async def receive(channel: SdkAgentChannel) -> Frame | None:
    return await asyncio.wait_for(channel.receive(), TIMEOUT)


async def wait(event: asyncio.Event) -> None:
    await asyncio.wait_for(event.wait(), TIMEOUT)


async def expect_quiet(channel: SdkAgentChannel, marker_id: Any = "marker") -> None:
    """Prove nothing was emitted: a later request's reply is the very next frame."""
    await channel.send(frame(call(marker_id, "_echo", {"marker": True})))
    assert await receive(channel) == Single(result(marker_id, {"marker": True}))


# --------------------------------------------------------------------------------------------
# single messages and ids


@pytest.mark.parametrize("request_id", [1, "1", 0, "", None, 2**63 - 1, -(2**63)], ids=repr)
async def test_single_reply_keeps_the_client_id_and_its_type(channel: SdkAgentChannel, request_id: Any) -> None:
    await channel.send(frame(call(request_id, "_echo", {"n": 1})))
    reply = await receive(channel)
    assert reply == Single(result(request_id, {"n": 1}))
    assert isinstance(reply, Single)
    assert type(reply.message["id"]) is type(request_id)


async def test_ids_1_and_string_1_are_different_requests(channel: SdkAgentChannel) -> None:
    await channel.send(frame(call(1, "_echo", {"n": "int"})))
    await channel.send(frame(call("1", "_echo", {"n": "str"})))
    replies = [await receive(channel), await receive(channel)]
    assert sorted((json.dumps(r.message["id"]), r.message["result"]["n"]) for r in replies) == [  # type: ignore[union-attr]
        ('"1"', "str"),
        ("1", "int"),
    ]


async def test_unknown_method_is_method_not_found_from_the_sdk(channel: SdkAgentChannel) -> None:
    await channel.send(frame(call(5, "no/such_method", {})))
    assert await receive(channel) == Single(
        {
            "jsonrpc": "2.0",
            "id": 5,
            "error": {"code": -32601, "message": "Method not found", "data": {"method": "no/such_method"}},
        }
    )
    await channel.send(frame(call("x", "_nope", {})))
    assert await receive(channel) == Single(
        {
            "jsonrpc": "2.0",
            "id": "x",
            "error": {"code": -32601, "message": "Method not found", "data": {"method": "_nope"}},
        }
    )


async def test_initialize_through_the_channel(channel: SdkAgentChannel) -> None:
    await channel.send(frame(call(0, "initialize", {"protocolVersion": 1})))
    reply = await receive(channel)
    assert isinstance(reply, Single)
    assert reply.message["id"] == 0
    assert reply.message["result"]["protocolVersion"] == 1


async def test_notification_gets_no_reply(channel: SdkAgentChannel, agent: ProbeAgent) -> None:
    await channel.send(frame(note("_note", {"name": "solo"})))
    await wait(agent.note_seen["solo"])
    await expect_quiet(channel)
    assert agent.notes == [("note", {"name": "solo"})]


# --------------------------------------------------------------------------------------------
# malformed input (§12)


async def test_invalid_json_is_a_parse_error_with_the_raw_line(channel: SdkAgentChannel) -> None:
    await channel.send(parse_frame("{not json"))
    assert await receive(channel) == Single(
        {
            "jsonrpc": "2.0",
            "id": None,
            "error": {"code": -32700, "message": "Parse error", "data": {"line": "{not json"}},
        }
    )


@pytest.mark.parametrize("raw", ["[]", "17", "{}", '"x"', '{"jsonrpc":"2.0","id":1,"method":7}'])
async def test_invalid_requests_get_a_standalone_invalid_request(channel: SdkAgentChannel, raw: str) -> None:
    await channel.send(parse_frame(raw))
    reply = await receive(channel)
    assert isinstance(reply, Single)  # standalone, never an array (even for `[]`)
    assert reply == Single(INVALID_REQUEST)
    await expect_quiet(channel)


@pytest.mark.parametrize(
    "raw",
    [
        '{"jsonrpc":"2.0","result":1}',
        '{"id":1,"result":1}',
        '{"jsonrpc":"2.0","id":1,"result":1,"error":{"code":1,"message":"x"}}',
        '{"jsonrpc":"2.0","id":true,"error":{"code":1,"message":"x"}}',
    ],
)
async def test_response_shaped_malformed_single_gets_no_reply(channel: SdkAgentChannel, raw: str) -> None:
    await channel.send(parse_frame(raw))
    await expect_quiet(channel)


async def test_response_with_unknown_id_is_dropped(channel: SdkAgentChannel) -> None:
    await channel.send(frame(result(12345, {"ok": True})))
    await expect_quiet(channel)


# --------------------------------------------------------------------------------------------
# batches (§7.1)


async def test_duplicate_ids_in_one_batch_are_both_answered(channel: SdkAgentChannel) -> None:
    await channel.send(frame([call(1, "_echo", {"n": 1}), call(1, "_echo", {"n": 2})]))
    assert await receive(channel) == Batch([result(1, {"n": 1}), result(1, {"n": 2})])


async def test_batch_slots_follow_entry_order(channel: SdkAgentChannel, agent: ProbeAgent) -> None:
    # The first request answers only after the second one did, so completion order differs
    # from entry order; the array must still follow the entries.
    await channel.send(
        frame(
            [
                call("a", "_after_echo", {"n": 1}),
                note("_note", {"name": "in-batch"}),
                call(2, "_echo", {"n": 2}),
                {"jsonrpc": "2.0", "id": 3, "method": 7},  # malformed, call-shaped
                {"jsonrpc": "2.0", "result": 1},  # malformed, response-shaped: ignored
            ]
        )
    )
    assert await receive(channel) == Batch([result("a", {"n": 1}), result(2, {"n": 2}), INVALID_REQUEST])
    await wait(agent.note_seen["in-batch"])
    assert agent.notes == [("note", {"name": "in-batch"})]
    await expect_quiet(channel)


async def test_batch_of_only_malformed_call_entries(channel: SdkAgentChannel) -> None:
    await channel.send(parse_frame('[17, {"foo": 1}, {"jsonrpc":"2.0","result":1}]'))
    assert await receive(channel) == Batch([INVALID_REQUEST, INVALID_REQUEST])


async def test_malformed_entry_first_then_request(channel: SdkAgentChannel) -> None:
    await channel.send(frame([17, call(4, "_echo", {"n": 4})]))
    assert await receive(channel) == Batch([INVALID_REQUEST, result(4, {"n": 4})])


async def test_single_request_batch_is_a_one_element_array(channel: SdkAgentChannel) -> None:
    await channel.send(frame([call(9, "_echo", {})]))
    assert await receive(channel) == Batch([result(9, {})])


async def test_notification_only_batch_gets_no_reply(channel: SdkAgentChannel, agent: ProbeAgent) -> None:
    await channel.send(frame([note("_note", {"name": "n1"}), note("_note", {"name": "n2"})]))
    await wait(agent.note_seen["n1"])
    await wait(agent.note_seen["n2"])
    await expect_quiet(channel, marker_id=7)
    assert sorted(params["name"] for _, params in agent.notes) == ["n1", "n2"]


async def test_response_only_batch_gets_no_reply(channel: SdkAgentChannel) -> None:
    await channel.send(parse_frame('[{"jsonrpc":"2.0","id":777,"result":{}}, {"result": 1}]'))
    await expect_quiet(channel)


async def test_a_big_batch_is_dispatched_in_slices_and_answered_once_whole(
    channel: SdkAgentChannel, agent: ProbeAgent
) -> None:
    # Early entries are answered while later slices are still being dispatched: the grouped
    # reply must still wait for every entry, and come once.
    count = 4 * SLICE_ENTRIES + 1
    entries = [call(index, "_echo", {"n": index}) for index in range(count)]
    async with LoopTurns() as turns:
        await channel.send(frame([*entries, note("_note", {"name": "last"}), 17]))
    assert turns.count >= 4  # other tasks ran between the slices
    assert await receive(channel) == Batch([*(result(index, {"n": index}) for index in range(count)), INVALID_REQUEST])
    await wait(agent.note_seen["last"])
    await expect_quiet(channel)


async def test_a_big_batch_of_malformed_entries_gets_one_reply(channel: SdkAgentChannel) -> None:
    await channel.send(frame([17] * (3 * SLICE_ENTRIES)))
    assert await receive(channel) == Batch([INVALID_REQUEST] * (3 * SLICE_ENTRIES))
    await expect_quiet(channel)


async def test_a_big_batch_of_notifications_gets_no_reply(channel: SdkAgentChannel, agent: ProbeAgent) -> None:
    count = 2 * SLICE_ENTRIES + 1
    async with LoopTurns() as turns:
        await channel.send(frame([note("_note", {"name": str(index)}) for index in range(count)]))
    assert turns.count >= 2
    await wait(agent.note_seen[str(count - 1)])
    await expect_quiet(channel)
    assert len(agent.notes) == count


async def test_close_during_a_big_batch_stops_its_dispatch(channel: SdkAgentChannel, agent: ProbeAgent) -> None:
    entries = [call(index, "_echo", {}) for index in range(40 * SLICE_ENTRIES)]
    sending = asyncio.create_task(channel.send(frame(entries)))
    await wait(agent.echoed)  # the first slice is being answered; most of the batch is not dispatched
    await channel.close()
    with pytest.raises(AgentClosed):
        await asyncio.wait_for(sending, TIMEOUT)
    assert await receive(channel) is None


# --------------------------------------------------------------------------------------------
# $/cancel_request


async def test_cancel_in_flight_request(channel: SdkAgentChannel, agent: ProbeAgent) -> None:
    await channel.send(frame(call(7, "_block", {"name": "b7"})))
    await wait(agent.started["b7"])
    await channel.send(frame(cancel(7)))
    assert await receive(channel) == Single(cancelled(7))
    await wait(agent.cancelled["b7"])  # the handler task itself was cancelled
    assert agent.finished["b7"].is_set()
    await expect_quiet(channel)  # and no second reply follows


async def test_cancel_keeps_the_id_type(channel: SdkAgentChannel, agent: ProbeAgent) -> None:
    await channel.send(frame(call("7", "_block", {"name": "s7"})))
    await wait(agent.started["s7"])
    await channel.send(frame(cancel(7)))  # a different request id (number, not string)
    await expect_quiet(channel)
    assert not agent.cancelled["s7"].is_set()
    await channel.send(frame(cancel("7")))
    assert await receive(channel) == Single(cancelled("7"))
    await wait(agent.cancelled["s7"])


async def test_cancel_after_the_reply_sends_nothing(channel: SdkAgentChannel) -> None:
    await channel.send(frame(call(3, "_echo", {"n": 3})))
    assert await receive(channel) == Single(result(3, {"n": 3}))
    await channel.send(frame(cancel(3)))
    await expect_quiet(channel)


@pytest.mark.parametrize(
    "params",
    [{"requestId": 99}, {}, None, ["x"], {"requestId": None}],
    ids=["unknown", "no-request-id", "no-params", "array", "null-id"],
)
async def test_cancel_without_a_matching_request_sends_nothing(channel: SdkAgentChannel, params: Any) -> None:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": "$/cancel_request"}
    if params is not None:
        message["params"] = params
    await channel.send(frame(message))
    await expect_quiet(channel)


async def test_cancel_fills_the_slot_of_a_batched_request(channel: SdkAgentChannel, agent: ProbeAgent) -> None:
    await channel.send(
        frame([call(1, "_echo", {"n": 1}), call(2, "_block", {"name": "batched"}), call(3, "_echo", {"n": 3})])
    )
    await wait(agent.started["batched"])
    await channel.send(frame(cancel(2)))
    assert await receive(channel) == Batch([result(1, {"n": 1}), cancelled(2), result(3, {"n": 3})])
    await wait(agent.cancelled["batched"])
    await expect_quiet(channel)


async def test_cancel_inside_the_same_batch(channel: SdkAgentChannel, agent: ProbeAgent) -> None:
    # the cancel is dispatched before the handler ever starts: the slot is answered anyway
    await channel.send(frame([call(5, "_block", {"name": "early"}), cancel(5), call(6, "_echo", {"n": 6})]))
    assert await receive(channel) == Batch([cancelled(5), result(6, {"n": 6})])
    await expect_quiet(channel)
    assert not agent.started["early"].is_set()


async def test_cancel_answers_every_request_with_that_id(channel: SdkAgentChannel, agent: ProbeAgent) -> None:
    await channel.send(frame([call(8, "_block", {"name": "d1"}), call(8, "_block", {"name": "d2"})]))
    await wait(agent.started["d1"])
    await wait(agent.started["d2"])
    await channel.send(frame(cancel(8)))
    assert await receive(channel) == Batch([cancelled(8), cancelled(8)])
    await wait(agent.cancelled["d1"])
    await wait(agent.cancelled["d2"])


async def test_other_dollar_notifications_are_swallowed(channel: SdkAgentChannel) -> None:
    await channel.send(frame(note("$/progress", {"token": 1})))
    await expect_quiet(channel)


# --------------------------------------------------------------------------------------------
# close


async def test_close_ends_receive_and_refuses_send(channel: SdkAgentChannel, agent: ProbeAgent) -> None:
    await channel.send(frame(call(1, "_block", {"name": "at-close"})))
    await wait(agent.started["at-close"])
    await channel.close()
    assert await receive(channel) is None
    assert await receive(channel) is None  # stays ended
    await wait(agent.cancelled["at-close"])  # in-flight handlers are cancelled, not answered
    with pytest.raises(AgentClosed):
        await channel.send(frame(call(2, "_echo", {})))
    await channel.close()  # idempotent


async def test_close_while_a_receiver_waits(channel: SdkAgentChannel) -> None:
    await expect_quiet(channel)  # the agent is running
    waiter = asyncio.create_task(channel.receive())
    await channel.close()
    assert await asyncio.wait_for(waiter, TIMEOUT) is None


async def test_close_right_after_creation_ends_receive(agent: ProbeAgent) -> None:
    channel = SdkAgentChannel(agent)
    await channel.close()
    assert await asyncio.wait_for(channel.receive(), 1.0) is None


# --------------------------------------------------------------------------------------------
# the demo agent: agent -> client requests keep the SDK's own ids next to rewritten client ids


async def test_demo_agent_permission_round_trip() -> None:
    channel = SdkAgentChannel(create_agent())
    try:
        await channel.send(frame(call(0, "initialize", {"protocolVersion": 1})))
        init = await receive(channel)
        assert isinstance(init, Single)
        assert init.message["id"] == 0
        assert init.message["result"]["agentInfo"]["name"] == AGENT_NAME

        await channel.send(frame(call(0, "session/new", {"cwd": "/tmp", "mcpServers": []})))
        created = await receive(channel)
        assert isinstance(created, Single)
        assert created.message["id"] == 0
        session_id = created.message["result"]["sessionId"]

        prompt = {"sessionId": session_id, "prompt": [{"type": "text", "text": "permission"}]}
        await channel.send(frame(call("p", "session/prompt", prompt)))
        ask = await receive(channel)
        assert isinstance(ask, Single)
        assert ask.message["method"] == "session/request_permission"
        assert ask.message["params"]["sessionId"] == session_id
        assert isinstance(ask.message["id"], int)  # the SDK's own id, passed through untouched

        answer = result(ask.message["id"], {"outcome": {"outcome": "selected", "optionId": "allow"}})
        await channel.send(frame(answer))
        update = await receive(channel)
        assert isinstance(update, Single)
        assert update.message["method"] == "session/update"
        assert update.message["params"]["update"]["content"]["text"] == "permission: allow"
        assert await receive(channel) == Single(result("p", {"stopReason": "end_turn"}))
    finally:
        await channel.close()
