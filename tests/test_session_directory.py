"""What a host records of its sessions from the wire (acp_channels/_host/sessions.py): a prompt
runs until the agent answers it, a permission request waits until the client answers it, the
two sides' request ids never mix, the agent's name comes from its initialize result, and the
least recently active sessions go first past MAX_SESSIONS."""

from __future__ import annotations

from typing import Any

from acp_channels._host import sessions as tracker
from acp_channels._host.sessions import SessionDirectory
from acp_channels._protocol import Batch, Single


def single(message: dict[str, Any]) -> Single:
    return Single(message)


def request(request_id: Any, method: str, session_id: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": {"sessionId": session_id}}


def answer(request_id: Any, result: Any = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": result if result is not None else {}}


def by_id(directory: SessionDirectory) -> dict[str, Any]:
    return {session.session_id: session for session in directory}


def test_a_prompt_runs_until_the_agent_answers_it() -> None:
    directory = SessionDirectory()
    directory.outbound(single(answer(1, {"sessionId": "s1"})))  # session/new's result
    assert by_id(directory)["s1"].turn_running is False
    directory.inbound(single(request(7, "session/prompt", "s1")))
    assert by_id(directory)["s1"].turn_running is True
    directory.outbound(single({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s1"}}))
    assert by_id(directory)["s1"].turn_running is True
    directory.outbound(single(answer(7, {"stopReason": "end_turn"})))
    assert by_id(directory)["s1"].turn_running is False


def test_a_permission_request_waits_for_the_client_and_ids_of_the_two_sides_do_not_mix() -> None:
    directory = SessionDirectory()
    directory.inbound(single(request(5, "session/prompt", "s1")))
    directory.outbound(single(request(5, "session/request_permission", "s1")))  # the agent's id 5
    session = by_id(directory)["s1"]
    assert session.turn_running and len(session.permissions) == 1
    directory.inbound(single(answer(5, {"outcome": {"outcome": "selected", "optionId": "allow"}})))
    assert not session.permissions and session.turn_running  # the client's answer is not the prompt's
    directory.outbound(single(answer(5, {"stopReason": "end_turn"})))
    assert not session.turn_running


def test_a_batch_counts_each_of_its_messages_and_the_agent_name_is_kept() -> None:
    directory = SessionDirectory()
    init = answer(0, {"protocolVersion": 1, "agentInfo": {"name": "demo", "version": "1"}})
    directory.outbound(single(init))
    assert directory.agent == "demo"
    directory.inbound(Batch([request("a", "session/prompt", "s1"), request("b", "session/prompt", "s2")]))
    assert {key: session.turn_running for key, session in by_id(directory).items()} == {"s1": True, "s2": True}
    directory.outbound(Batch([answer("b")]))
    assert {key: session.turn_running for key, session in by_id(directory).items()} == {"s1": True, "s2": False}


def test_the_least_recently_active_sessions_go_first(monkeypatch: Any) -> None:
    monkeypatch.setattr(tracker, "MAX_SESSIONS", 3)
    directory = SessionDirectory()
    for session_id in ("s1", "s2", "s3"):
        directory.inbound(single(request(session_id, "session/prompt", session_id)))
    directory.inbound(single(request("again", "session/cancel", "s1")))  # s1 active again
    directory.inbound(single(request("s4", "session/prompt", "s4")))
    assert [session.session_id for session in directory] == ["s3", "s1", "s4"]
    directory.outbound(single(answer("s2")))  # s2's prompt was forgotten with it: nothing comes back
    assert "s2" not in by_id(directory)


def prompt_with_operation(request_id: Any, session_id: str, operation: str) -> dict[str, Any]:
    message = request(request_id, "session/prompt", session_id)
    message["params"]["_meta"] = {"acp-channels/operationId": operation}
    return message


def test_an_operation_forwarded_is_known_by_its_session_with_the_id_that_carried_it() -> None:
    directory = SessionDirectory()
    first = prompt_with_operation(1, "s1", "op-1")
    assert directory.carried_before(first) == (False, None)
    directory.inbound(single(first))
    assert directory.carried_before(prompt_with_operation(1, "s1", "op-1")) == (True, 1)
    assert directory.carried_before(prompt_with_operation(9, "s1", "op-1")) == (True, 1)
    assert directory.carried_before(prompt_with_operation(2, "s1", "op-2")) == (False, None)
    assert directory.carried_before(prompt_with_operation(3, "s2", "op-1")) == (False, None)  # per session
    directory.outbound(single(answer(1, {"stopReason": "end_turn"})))
    assert directory.carried_before(prompt_with_operation(1, "s1", "op-1")) == (True, 1)  # after its turn too


def test_a_session_remembers_its_latest_operations(monkeypatch: Any) -> None:
    monkeypatch.setattr(tracker, "OPERATIONS_REMEMBERED", 2)
    directory = SessionDirectory()
    for number in range(3):
        directory.inbound(single(prompt_with_operation(number, "s1", f"op-{number}")))
    assert [directory.carried_before(prompt_with_operation(9, "s1", f"op-{n}"))[0] for n in range(3)] == [
        False,
        True,
        True,
    ]
