"""nemo_gym.rollout_observability: upstream's trajectory and observation records, and what each refuses."""

from __future__ import annotations

import dataclasses

import pytest
from pydantic import ValidationError

from nemo_gym.config_types import ModelServerRef
from nemo_gym.openai_utils import NeMoGymResponse
from nemo_gym.rollout_observability import (
    AgentEpisode,
    AgentInvocation,
    AgentObservationBundle,
    ContextCompactionObservation,
    ModelCallRef,
    ObservationGap,
    SandboxObservation,
    ToolCallObservation,
    TrajectoryModelCall,
    TrajectoryRecord,
    TrajectoryToolCall,
    TrajectoryTurn,
)

MODEL = ModelServerRef(type="responses_api_models", name="policy")


def turn(turn_no: int = 1, *, task_id: str = "t", rollout_id: str = "0-0", invocation_id: str = "root") -> TrajectoryTurn:
    return TrajectoryTurn(invocation_id=invocation_id, task_id=task_id, rollout_id=rollout_id, turn_no=turn_no, timestamp=1.0, step_count=0)


def test_a_model_call_ref_needs_a_call_id_or_both_a_model_ref_and_a_response_id():
    assert ModelCallRef(model_call_id="mc-1").model_call_id == "mc-1"
    assert ModelCallRef(model_ref=MODEL, response_id="resp-1").response_id == "resp-1"
    for partial in ({}, {"response_id": "resp-1"}, {"model_ref": MODEL}):
        with pytest.raises(ValidationError, match="model_call_id or both model_ref and response_id"):
            ModelCallRef(**partial)


def test_observation_records_refuse_unknown_keys_and_check_assignments():
    with pytest.raises(ValidationError):
        ObservationGap(code="x", unexpected=1)
    record = turn()
    with pytest.raises(ValidationError):
        record.step_count = -1
    record.step_count = 2
    assert record.step_count == 2


def test_a_turn_counts_from_one_and_steps_from_zero():
    with pytest.raises(ValidationError):
        turn(0)
    with pytest.raises(ValidationError):
        TrajectoryTurn(invocation_id="root", task_id="t", rollout_id="0-0", turn_no=1, timestamp=1.0, step_count=-1)


def test_a_tool_call_may_not_complete_before_it_started():
    assert ToolCallObservation(invocation_id="root", tool_call_id="c", started_at=2.0, completed_at=2.0).status == "unknown"
    with pytest.raises(ValidationError, match="completed_at must not precede started_at"):
        TrajectoryToolCall(invocation_id="root", tool_call_id="c", started_at=2.0, completed_at=1.0)


def test_a_trajectory_tool_call_carries_the_output_the_model_saw():
    assert TrajectoryToolCall(invocation_id="root", tool_call_id="c", output="42").kind == "tool_call"


def test_an_invocation_defaults_to_status_unknown_and_parses_its_conversation_as_response_input_items():
    invocation = AgentInvocation(
        invocation_id="root",
        conversation=[{"role": "user", "content": "hi"}, {"type": "function_call_output", "call_id": "c", "output": "1"}],
    )
    assert invocation.status == "unknown"
    assert [item.type for item in invocation.conversation] == ["message", "function_call_output"]
    with pytest.raises(ValidationError):
        AgentInvocation(invocation_id="root", status="done")


def test_a_bundle_reads_each_record_by_its_kind():
    bundle = AgentObservationBundle.model_validate(
        {
            "source": "harness",
            "records": [
                {"kind": "agent_invocation", "invocation_id": "root"},
                {"kind": "tool_call", "invocation_id": "root", "tool_call_id": "c"},
                {"kind": "context_compaction", "invocation_id": "root", "tokens_before": 10, "tokens_after": 3},
                {"kind": "sandbox", "role": "agent", "outcome": "oom"},
            ],
        }
    )
    assert [type(record) for record in bundle.records] == [AgentInvocation, ToolCallObservation, ContextCompactionObservation, SandboxObservation]
    with pytest.raises(ValidationError):
        AgentObservationBundle.model_validate({"source": "harness", "records": [{"kind": "unheard_of"}]})


def test_a_bundle_refuses_a_repeated_invocation_id_and_a_parent_cycle_but_allows_an_unseen_parent():
    def bundle(*pairs: tuple[str, str | None]) -> AgentObservationBundle:
        return AgentObservationBundle(source="h", records=[AgentInvocation(invocation_id=i, parent_invocation_id=p) for i, p in pairs])

    assert len(bundle(("child", "never-observed"), ("root", None)).records) == 2
    with pytest.raises(ValidationError, match="invocation_id must be unique"):
        bundle(("a", None), ("a", None))
    with pytest.raises(ValidationError, match="cycle"):
        bundle(("a", "b"), ("b", "c"), ("c", "a"))


def test_a_trajectory_is_schema_1_0_and_its_turns_carry_its_own_task_and_rollout():
    record = TrajectoryRecord(task_id="t", rollout_id="0-0", turns=[turn(1), turn(2)])
    assert record.schema_version == "1.0"
    with pytest.raises(ValidationError, match="turn identity must match"):
        TrajectoryRecord(task_id="t", rollout_id="0-0", turns=[turn(rollout_id="0-1")])


def test_a_trajectory_refuses_repeated_invocations_model_calls_and_turn_numbers():
    with pytest.raises(ValidationError, match="invocation_id must be unique"):
        TrajectoryRecord(task_id="t", rollout_id="0-0", invocations=[AgentInvocation(invocation_id="a"), AgentInvocation(invocation_id="a")])
    with pytest.raises(ValidationError, match="model_call_id must be unique"):
        TrajectoryRecord(task_id="t", rollout_id="0-0", model_calls=[TrajectoryModelCall(model_call_id="m"), TrajectoryModelCall(model_call_id="m")])
    with pytest.raises(ValidationError, match="turn number must be unique"):
        TrajectoryRecord(task_id="t", rollout_id="0-0", turns=[turn(1), turn(1)])
    # Calls without an id and the same turn number in two invocations are fine.
    TrajectoryRecord(
        task_id="t", rollout_id="0-0", model_calls=[TrajectoryModelCall(), TrajectoryModelCall()], turns=[turn(1), turn(1, invocation_id="sub")]
    )


def test_a_trajectory_round_trips_through_json():
    record = TrajectoryRecord(
        task_id="t",
        rollout_id="0-0",
        invocations=[AgentInvocation(invocation_id="root", status="completed", model_calls=[ModelCallRef(model_ref=MODEL, response_id="r")])],
        turns=[turn(1)],
        tool_calls=[TrajectoryToolCall(invocation_id="root", tool_call_id="c", timing_source="executor", status="failed", error_type="http_422")],
        gaps=[ObservationGap(code="resolution_unavailable", invocation_id="root")],
    )
    assert TrajectoryRecord.model_validate(record.model_dump(mode="json")) == record


def test_an_agent_episode_is_an_immutable_pair_of_response_and_observations():
    response = NeMoGymResponse.model_validate(
        {"id": "r", "created_at": 1.0, "model": "m", "object": "response", "output": [], "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}
    )
    episode = AgentEpisode(response=response, observations=AgentObservationBundle(source="h"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        episode.response = response


FRESH_INTERPRETER_TURN = """
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.rollout_observability import TrajectoryToolCall, TrajectoryTurn
response = NeMoGymResponse.model_validate({"id": "r", "created_at": 1.0, "model": "m", "object": "response",
    "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
    "output": [{"id": "fc", "call_id": "c", "name": "f", "arguments": "{}", "type": "function_call", "status": "completed"}]})
body = NeMoGymResponseCreateParamsNonStreaming.model_validate({"input": [{"role": "user", "content": "q"}]})
turn = TrajectoryTurn(invocation_id="root", task_id="t", rollout_id="r", turn_no=1, timestamp=1.0, step_count=0,
    question=body.input + response.output, answer=response.output)
tool = TrajectoryToolCall(invocation_id="root", tool_call_id="c", output=response.output[0])
print([item["type"] for item in turn.model_dump(mode="json")["question"]], turn.question[0], tool.output["name"])
"""


def test_sdk_items_given_as_free_form_evidence_are_kept_as_their_json_even_before_their_classes_are_built():
    # The SDK builds its classes on first use; one only nested in a validated response is not built yet,
    # and a record that kept the instance under an Any field could not be serialised.
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", FRESH_INTERPRETER_TURN], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['message', 'function_call'] {'content': 'q', 'role': 'user', 'type': 'message'} f"
