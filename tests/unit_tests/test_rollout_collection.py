"""nemo_gym.rollout_collection: upstream's row keys, the ng_trajectory a collected row gets, the attempt limit."""

from __future__ import annotations

import pytest

from nemo_gym.rollout_collection import (
    MAX_ROLLOUT_ATTEMPTS_ENV,
    NG_FAILURE_CLASS_KEY,
    NG_NO_PERSIST_KEY,
    NG_TERMINAL_KEY,
    NG_TRAJECTORY_KEY,
    _attach_trajectory_record,
    _get_max_rollout_attempts,
)
from nemo_gym.rollout_observability import TrajectoryRecord

ROW = {"_ng_task_index": 4, "_ng_rollout_index": 1, "responses_create_params": {"input": "q"}}


def producer_trajectory(task_id: str = "4", rollout_id: str = "4-1", **fields) -> dict:
    turns = [
        {"invocation_id": "root", "task_id": task_id, "rollout_id": rollout_id, "turn_no": n, "timestamp": t, "step_count": 0}
        for n, t in ((2, 20.0), (1, 10.0))
    ]
    invocation = {"invocation_id": "root", "conversation": [{"role": "user", "content": "q"}]}
    return {"task_id": task_id, "rollout_id": rollout_id, "turns": turns, "invocations": [invocation], **fields}


def attached(row: dict, result: dict) -> TrajectoryRecord:
    _attach_trajectory_record(row, result)
    return TrajectoryRecord.model_validate(result[NG_TRAJECTORY_KEY])


def codes(record: TrajectoryRecord) -> set[str]:
    return {gap.code for gap in record.gaps}


def test_the_row_keys_have_upstreams_names():
    assert (NG_FAILURE_CLASS_KEY, NG_NO_PERSIST_KEY, NG_TERMINAL_KEY, NG_TRAJECTORY_KEY) == (
        "_ng_failure_class",
        "_ng_no_persist",
        "_ng_failure_terminal",
        "ng_trajectory",
    )


def test_the_trajectory_is_named_by_the_rows_own_task_id_else_its_task_index_and_by_its_rollout_id():
    assert attached(ROW, {NG_TRAJECTORY_KEY: producer_trajectory()}).rollout_id == "4-1"
    record = attached({**ROW, "instance_id": 0, "_ng_rollout_id": "run.7"}, {NG_TRAJECTORY_KEY: producer_trajectory("0", "run.7")})
    assert (record.task_id, record.rollout_id) == ("0", "run.7")
    assert "producer_trajectory_identity_mismatch" not in codes(record)


def test_a_producer_trajectory_of_another_identity_is_relabelled_and_the_mismatch_is_a_gap():
    record = attached(ROW, {NG_TRAJECTORY_KEY: producer_trajectory("unknown", "unscoped")})
    assert {(turn.task_id, turn.rollout_id) for turn in record.turns} == {("4", "4-1")}
    [gap] = [gap for gap in record.gaps if gap.code == "producer_trajectory_identity_mismatch"]
    assert gap.detail == "task_id,rollout_id"


def test_turns_are_ordered_by_time():
    assert [turn.turn_no for turn in attached(ROW, {NG_TRAJECTORY_KEY: producer_trajectory()}).turns] == [1, 2]


def test_a_producer_trajectory_that_does_not_validate_is_a_gap_not_an_error():
    record = attached(ROW, {NG_TRAJECTORY_KEY: {"task_id": "4"}})
    assert {"producer_trajectory_invalid", "turns_unavailable", "model_calls_unavailable", "conversation_unavailable"} <= codes(record)


def test_captured_model_calls_become_the_trajectorys_model_calls_and_their_payload_copies_are_dropped():
    capture = {
        "calls": [
            {
                "model_call_id": "mc-1",
                "response_id": "resp-1",
                "request_raw": {"input": "raw"},
                "response": {"status": "completed", "output": []},
                "latency_total_ms": 12.5,
                "tokens_in": 7,
                "tokens_out": -1,
            }
        ],
        "gaps": [{"code": "capture_partial"}, {"bogus": True}],
    }
    result = {NG_TRAJECTORY_KEY: producer_trajectory(), "ng_model_call_capture": capture}
    record = attached(ROW, result)
    [call] = record.model_calls
    assert (call.model_call_id, call.duration_ms, call.request) == ("mc-1", 12.5, {"input": "raw"})
    assert (call.response_metadata.response_id, call.response_metadata.response_status) == ("resp-1", "completed")
    # A negative or missing count is no count.
    assert (call.token_stats.prompt_tokens, call.token_stats.completion_tokens) == (7, None)
    assert {"capture_partial", "model_call_capture_gap_invalid"} <= codes(record)
    assert "model_calls_unavailable" not in codes(record)
    assert result["ng_model_call_capture"]["calls"] == [
        {"model_call_id": "mc-1", "response_id": "resp-1", "latency_total_ms": 12.5, "tokens_in": 7, "tokens_out": -1}
    ]


def test_a_captured_call_the_producer_already_named_is_merged_into_its_entry():
    trajectory = producer_trajectory(model_calls=[{"model_call_id": "mc-1", "started_at": 1.0, "response_metadata": {"model": "m"}}])
    record = attached(ROW, {NG_TRAJECTORY_KEY: trajectory, "ng_model_call_capture": {"calls": [{"model_call_id": "mc-1", "response_id": "r"}]}})
    [call] = record.model_calls
    assert (call.started_at, call.response_metadata.model, call.response_metadata.response_id) == (1.0, "m", "r")


def test_a_harness_bundle_adds_its_invocations_and_tool_timings_with_the_output_from_the_conversation():
    conversation = [{"role": "user", "content": "q"}, {"type": "function_call_output", "call_id": "c1", "output": "42"}]
    trajectory = producer_trajectory(tool_calls=[{"invocation_id": "root", "tool_call_id": "c1", "status": "completed"}])
    bundle = {
        "source": "harness",
        "records": [
            {"kind": "agent_invocation", "invocation_id": "root"},
            {"kind": "agent_invocation", "invocation_id": "sub", "parent_invocation_id": "root", "conversation": conversation},
            {"kind": "tool_call", "invocation_id": "root", "tool_call_id": "c1", "duration_ms": 3.0},
            {"kind": "tool_call", "invocation_id": "sub", "tool_call_id": "c1", "status": "failed"},
        ],
        "gaps": [{"code": "harness_gap"}],
    }
    record = attached(ROW, {NG_TRAJECTORY_KEY: trajectory, "ng_agent_observations": bundle})
    assert [invocation.invocation_id for invocation in record.invocations] == ["root", "sub"]
    assert len(record.invocations[0].conversation) == 1  # the producer's own root wins over the bundle's
    root_call, sub_call = record.tool_calls
    assert (root_call.status, root_call.duration_ms, root_call.output) == ("completed", 3.0, None)
    assert (sub_call.invocation_id, sub_call.status, sub_call.output) == ("sub", "failed", "42")
    assert "harness_gap" in codes(record)


def test_an_invalid_bundle_is_a_gap():
    record = attached(ROW, {NG_TRAJECTORY_KEY: producer_trajectory(), "ng_agent_observations": {"records": "no"}})
    assert "agent_observations_invalid" in codes(record)


def test_a_repeated_gap_is_kept_once():
    trajectory = producer_trajectory(gaps=[{"code": "g", "detail": "d"}])
    record = attached(ROW, {NG_TRAJECTORY_KEY: trajectory, "ng_model_call_capture": {"calls": [], "gaps": [{"code": "g", "detail": "d"}]}})
    assert [gap.code for gap in record.gaps].count("g") == 1


def test_a_projection_that_fails_leaves_no_trajectory_and_says_so_in_the_capture_keeping_its_payloads():
    capture = {"calls": [{"model_call_id": "mc-1", "request": {"input": "kept"}}]}
    result = {"ng_model_call_capture": capture}
    _attach_trajectory_record({"responses_create_params": {}}, result)  # no task index: no identity
    assert NG_TRAJECTORY_KEY not in result
    assert capture["gaps"] == [{"code": "trajectory_projection_failed", "detail": "KeyError"}]
    assert capture["calls"][0]["request"] == {"input": "kept"}


def test_a_projection_that_fails_without_a_capture_or_bundle_keeps_its_gap_in_a_bare_trajectory(monkeypatch):
    from nemo_gym import rollout_collection

    monkeypatch.setattr(rollout_collection, "_project", lambda row, result: 1 / 0)
    record = attached(ROW, {NG_TRAJECTORY_KEY: producer_trajectory()})
    assert (record.task_id, record.rollout_id, codes(record)) == ("4", "4-1", {"trajectory_projection_failed"})


@pytest.mark.parametrize(("value", "expected"), [(None, 3), ("", 3), ("5", 5), ("0", 3), ("many", 3)])
def test_max_rollout_attempts_is_a_positive_int_from_the_environment_else_three(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv(MAX_ROLLOUT_ATTEMPTS_ENV, raising=False)
    else:
        monkeypatch.setenv(MAX_ROLLOUT_ATTEMPTS_ENV, value)
    assert MAX_ROLLOUT_ATTEMPTS_ENV == "NEMO_GYM_MAX_ROLLOUT_ATTEMPTS"
    assert _get_max_rollout_attempts() == expected
