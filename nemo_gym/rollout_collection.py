"""Upstream's rollout-collection names: the keys of a failed row, a row's ``ng_trajectory``, the attempt limit.

``_attach_trajectory_record(row, result)`` merges what the agent handed back (its own ``ng_trajectory``,
a harness's ``ng_agent_observations``, the model server's ``ng_model_call_capture``) into one
``TrajectoryRecord`` named by the row. It never raises: a projection that fails is a gap, and what
could not be observed is a gap too.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Optional

from nemo_gym.global_config import ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME
from nemo_gym.rollout_correlation import maybe_rollout_id_from_run_body
from nemo_gym.rollout_observability import (
    AgentInvocation,
    AgentObservationBundle,
    ObservationGap,
    ToolCallObservation,
    TrajectoryModelCall,
    TrajectoryRecord,
    TrajectoryTokenStats,
    TrajectoryToolCall,
)

logger = logging.getLogger(__name__)

# Why a rollout failed, that its row is not written to the results, that it is not to be retried.
NG_FAILURE_CLASS_KEY = "_ng_failure_class"
NG_NO_PERSIST_KEY = "_ng_no_persist"
NG_TERMINAL_KEY = "_ng_failure_terminal"
NG_TRAJECTORY_KEY = "ng_trajectory"
AGENT_OBSERVATIONS_KEY = "ng_agent_observations"
MODEL_CALL_CAPTURE_KEY = "ng_model_call_capture"
# The copies of what a model call sent and answered; the trajectory owns them once projected.
MODEL_CALL_PAYLOAD_KEYS = ("request", "response", "request_raw", "response_raw")

MAX_ROLLOUT_ATTEMPTS_ENV = "NEMO_GYM_MAX_ROLLOUT_ATTEMPTS"
DEFAULT_MAX_ROLLOUT_ATTEMPTS = 3

_RESPONSE_METADATA_KEYS = (
    "response_id",
    "model_ref",
    "model",
    "dialect",
    "status_code",
    "response_status",
    "finish_reason",
    "error_category",
    "latency_ttft_ms",
)
_TOKEN_KEYS = {
    "prompt_tokens": "tokens_in",
    "completion_tokens": "tokens_out",
    "reasoning_tokens": "tokens_reasoning",
    "total_tokens": "tokens_total",
    "cached_tokens": "cached_tokens",
}


def trajectory_identity(row: dict[str, Any]) -> tuple[str, str]:
    """(task id, rollout id): the row's own task id (``task_id``, ``problem_id``, ``instance_id``), else its
    task index; its rollout id, else ``<task index>-<rollout index>``."""
    task_id = next((str(row[key]) for key in ("task_id", "problem_id", "instance_id") if row.get(key) is not None), None)
    if task_id is None:
        task_id = str(row[TASK_INDEX_KEY_NAME])
    rollout_id = maybe_rollout_id_from_run_body(row) or f"{row[TASK_INDEX_KEY_NAME]}-{row[ROLLOUT_INDEX_KEY_NAME]}"
    return task_id, rollout_id


def _count(value: Any) -> Optional[int]:
    return value if type(value) is int and value >= 0 else None


def _first(call: dict[str, Any], *keys: str) -> Any:
    return next((call[key] for key in keys if call.get(key) is not None), None)


def _captured_call(call: dict[str, Any]) -> TrajectoryModelCall:
    metadata = {key: call[key] for key in _RESPONSE_METADATA_KEYS if call.get(key) is not None}
    response = call.get("response")
    if isinstance(response, dict) and isinstance(response.get("status"), str):
        metadata.setdefault("response_status", response["status"])
    return TrajectoryModelCall(
        model_call_id=call.get("model_call_id"),
        started_at=call.get("started_at"),
        completed_at=call.get("completed_at"),
        duration_ms=call.get("latency_total_ms"),
        request=_first(call, "request", "request_raw"),
        response=_first(call, "response", "response_raw"),
        response_metadata=metadata,
        token_stats=TrajectoryTokenStats(**{field: _count(call.get(key)) for field, key in _TOKEN_KEYS.items()}),
    )


def _merge_model_calls(model_calls: list[TrajectoryModelCall], capture: dict[str, Any]) -> None:
    """Each captured call joins the producer's entry of the same id, once, or is added."""
    unmatched = {call.model_call_id: index for index, call in enumerate(model_calls) if call.model_call_id is not None}
    for raw in capture.get("calls") or []:
        if not isinstance(raw, dict):
            continue
        captured = _captured_call(raw)
        index = unmatched.pop(captured.model_call_id, None) if captured.model_call_id is not None else None
        if index is None:
            model_calls.append(captured)
            continue
        merged = model_calls[index].model_dump(mode="json")
        update = captured.model_dump(mode="json", exclude_none=True)
        for nested in ("response_metadata", "token_stats"):
            merged[nested].update(update.pop(nested))
        model_calls[index] = TrajectoryModelCall.model_validate(merged | update)


def _merge_tool_observations(tools: list[TrajectoryToolCall], observed: list[ToolCallObservation], invocations: list[AgentInvocation]) -> None:
    """A harness's tool timings over the producer's entries, with the output the conversation shows."""
    outputs = {
        (invocation.invocation_id, item.call_id): item.output
        for invocation in invocations
        for item in invocation.conversation
        if getattr(item, "type", None) == "function_call_output"
    }
    positions = {(tool.invocation_id, tool.tool_call_id): index for index, tool in enumerate(tools)}
    for observation in observed:
        key = (observation.invocation_id, observation.tool_call_id)
        index = positions.get(key)
        merged = tools[index].model_dump(mode="json") if index is not None else {}
        update = observation.model_dump(mode="json", exclude_none=True)
        if index is not None and observation.status == "unknown":
            update.pop("status")  # an unknown status says nothing over a known one
        merged.update(update)
        if key in outputs:
            merged["output"] = outputs[key]
        tool = TrajectoryToolCall.model_validate(merged)
        if index is None:
            positions[key] = len(tools)
            tools.append(tool)
        else:
            tools[index] = tool


def _project(row: dict[str, Any], result: dict[str, Any]) -> TrajectoryRecord:
    task_id, rollout_id = trajectory_identity(row)
    producer = TrajectoryRecord(task_id=task_id, rollout_id=rollout_id)
    gaps: list[ObservationGap] = []

    raw = result.get(NG_TRAJECTORY_KEY)
    if isinstance(raw, dict):
        try:
            given = TrajectoryRecord.model_validate(raw)
        except Exception as error:
            gaps.append(ObservationGap(code="producer_trajectory_invalid", detail=type(error).__name__))
        else:
            mismatched = [name for name, value in (("task_id", given.task_id), ("rollout_id", given.rollout_id)) if value != getattr(producer, name)]
            if mismatched:
                gaps.append(ObservationGap(code="producer_trajectory_identity_mismatch", detail=",".join(mismatched)))
            turns = [turn.model_copy(update={"task_id": task_id, "rollout_id": rollout_id}) for turn in given.turns]
            producer = given.model_copy(update={"task_id": task_id, "rollout_id": rollout_id, "turns": turns, "gaps": []})
            gaps.extend(given.gaps)
    invocations, tools, model_calls = list(producer.invocations), list(producer.tool_calls), list(producer.model_calls)

    if result.get(AGENT_OBSERVATIONS_KEY) is not None:
        try:
            bundle = AgentObservationBundle.model_validate(result[AGENT_OBSERVATIONS_KEY])
            gaps.extend(bundle.gaps)
            known = {invocation.invocation_id for invocation in invocations}
            invocations += [r for r in bundle.records if isinstance(r, AgentInvocation) and r.invocation_id not in known]
            _merge_tool_observations(tools, [r for r in bundle.records if isinstance(r, ToolCallObservation)], invocations)
        except Exception as error:
            gaps.append(ObservationGap(code="agent_observations_invalid", detail=type(error).__name__))

    capture = result.get(MODEL_CALL_CAPTURE_KEY)
    capture = capture if isinstance(capture, dict) else {}
    _merge_model_calls(model_calls, capture)
    for raw_gap in capture.get("gaps") or []:
        if isinstance(raw_gap, dict):
            try:
                gaps.append(ObservationGap.model_validate(raw_gap))
            except Exception:
                gaps.append(ObservationGap(code="model_call_capture_gap_invalid"))

    turns = sorted(producer.turns, key=lambda turn: (turn.timestamp, turn.invocation_id, turn.turn_no))
    for missing, code in ((model_calls, "model_calls_unavailable"), (turns, "turns_unavailable")):
        if not missing:
            gaps.append(ObservationGap(code=code))
    if not any(invocation.conversation for invocation in invocations):
        gaps.append(ObservationGap(code="conversation_unavailable"))
    unique_gaps = list({(gap.code, gap.invocation_id, gap.detail): gap for gap in gaps}.values())
    return TrajectoryRecord(
        task_id=task_id,
        rollout_id=rollout_id,
        invocations=invocations,
        turns=turns,
        model_calls=model_calls,
        tool_calls=tools,
        gaps=unique_gaps,
    )


def _strip_capture_payloads(result: dict[str, Any]) -> None:
    capture = result.get(MODEL_CALL_CAPTURE_KEY)
    calls = capture.get("calls") if isinstance(capture, dict) else None
    for call in calls if isinstance(calls, list) else []:
        if isinstance(call, dict):
            for key in MODEL_CALL_PAYLOAD_KEYS:
                call.pop(key, None)


def _keep_failure_gap(row: dict[str, Any], result: dict[str, Any], gap: ObservationGap) -> None:
    """The failure's gap goes in the capture's gaps, else the bundle's, else a trajectory of that gap alone."""
    target = next((result[key] for key in (MODEL_CALL_CAPTURE_KEY, AGENT_OBSERVATIONS_KEY) if isinstance(result.get(key), dict)), None)
    gaps = target.setdefault("gaps", []) if target is not None else None
    if isinstance(gaps, list):
        gaps.append(gap.model_dump(mode="json", exclude_none=True))
        return
    try:
        task_id, rollout_id = trajectory_identity(row)
        result[NG_TRAJECTORY_KEY] = TrajectoryRecord(task_id=task_id, rollout_id=rollout_id, gaps=[gap]).model_dump(mode="json")
    except Exception:
        logger.warning("The trajectory projection's failure could not be kept either.", exc_info=True)


def _attach_trajectory_record(row: dict[str, Any], result: dict[str, Any]) -> None:
    """Set ``result["ng_trajectory"]`` to the rollout's merged trajectory (see the module docstring).

    On success the capture's payload copies are dropped (the trajectory holds them); on failure there
    is no ``ng_trajectory``, the payloads stay, and a ``trajectory_projection_failed`` gap says why.
    """
    try:
        result[NG_TRAJECTORY_KEY] = _project(row, result).model_dump(mode="json")
    except Exception as error:
        result.pop(NG_TRAJECTORY_KEY, None)
        logger.warning("Could not project the rollout's trajectory.", exc_info=True)
        _keep_failure_gap(row, result, ObservationGap(code="trajectory_projection_failed", detail=type(error).__name__))
    else:
        _strip_capture_payloads(result)


def _get_max_rollout_attempts() -> int:
    """Attempts a failed rollout gets: ``NEMO_GYM_MAX_ROLLOUT_ATTEMPTS`` (a positive int), else 3."""
    raw = os.environ.get(MAX_ROLLOUT_ATTEMPTS_ENV)
    if not raw:
        return DEFAULT_MAX_ROLLOUT_ATTEMPTS
    try:
        attempts = int(raw)
    except ValueError:
        attempts = 0
    if attempts < 1:
        logger.warning("%s=%r is not a positive integer; using %d.", MAX_ROLLOUT_ATTEMPTS_ENV, raw, DEFAULT_MAX_ROLLOUT_ATTEMPTS)
        return DEFAULT_MAX_ROLLOUT_ATTEMPTS
    return attempts
