"""What an agent observed of one rollout, as upstream's records: turns, model and tool calls, invocations, gaps.

An agent hands back either a ``TrajectoryRecord`` (turns, tool calls, model calls of one rollout) or an
``AgentObservationBundle`` (loose typed records a harness saw); rollout collection merges both into the
row's ``ng_trajectory``. Every record refuses keys it does not know and re-checks values assigned later.
What an agent could not observe is an ``ObservationGap`` with a code, never a guess.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, Optional

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from nemo_gym.config_types import ModelServerRef
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseInputItem



def _as_json(value: Any) -> Any:
    """Free-form evidence as plain JSON data: models dumped (without None fields), lists and dicts walked.

    Kept as instances, SDK items whose classes are not built yet (the SDK builds them on first use)
    could not be serialised from inside a record.
    """
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True, exclude_none=True)
    if isinstance(value, (list, tuple)):
        return [_as_json(item) for item in value]
    if isinstance(value, dict):
        return {key: _as_json(item) for key, item in value.items()}
    return value


Evidence = Annotated[Optional[Any], BeforeValidator(_as_json)]
NonNegative = Annotated[Optional[float], Field(default=None, ge=0)]
Count = Annotated[Optional[int], Field(default=None, ge=0)]


class ObservationModel(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelCallRef(ObservationModel):
    """How an agent names one model call: a capture's call id, or the model server and its response id."""

    model_call_id: Optional[str] = None
    model_ref: Optional[ModelServerRef] = None
    response_id: Optional[str] = None

    @model_validator(mode="after")
    def _joinable(self) -> ModelCallRef:
        if not self.model_call_id and (self.model_ref is None or not self.response_id):
            raise ValueError("model_call_id or both model_ref and response_id are required")
        return self


class TrajectoryTokenStats(ObservationModel):
    prompt_tokens: Count
    completion_tokens: Count
    reasoning_tokens: Count
    total_tokens: Count
    cached_tokens: Count


class TrajectoryResponseMetadata(ObservationModel):
    response_id: Optional[str] = None
    model_ref: Optional[ModelServerRef] = None
    model: Optional[str] = None
    dialect: Optional[str] = None
    status_code: Optional[int] = None
    response_status: Optional[str] = None
    finish_reason: Optional[str] = None
    error_category: Optional[str] = None
    latency_ttft_ms: NonNegative


class TrajectoryModelCall(ObservationModel):
    """One model call as captured by the model server, with what it was sent and what it answered."""

    model_call_id: Optional[str] = None
    started_at: Optional[float] = None
    completed_at: Optional[float] = None
    duration_ms: NonNegative
    request: Evidence = None
    response: Evidence = None
    response_metadata: TrajectoryResponseMetadata = Field(default_factory=TrajectoryResponseMetadata)
    token_stats: TrajectoryTokenStats = Field(default_factory=TrajectoryTokenStats)


class TrajectoryTurn(ObservationModel):
    """One model turn of an invocation: what the model was asked, what it answered, how many tool steps so far."""

    invocation_id: str
    task_id: str
    rollout_id: str
    turn_no: int = Field(ge=1)
    timestamp: float
    question: Evidence = None
    answer: Evidence = None
    reasoning_content: Evidence = None
    resolved: Optional[bool] = None
    # Tool steps of this invocation up to and including this turn, as the agent counts them.
    step_count: int = Field(ge=0)
    model_calls: list[ModelCallRef] = Field(default_factory=list)


class AgentInvocation(ObservationModel):
    """One agent or subagent conversation: its outcome, the model calls it made, its items."""

    kind: Literal["agent_invocation"] = "agent_invocation"
    invocation_id: str
    parent_invocation_id: Optional[str] = None
    spawned_by_tool_call_id: Optional[str] = None
    # "unknown" unless the harness said how it ended.
    status: Literal["completed", "failed", "incomplete", "unknown"] = "unknown"
    duration_ms: NonNegative
    error_type: Optional[str] = None
    model_calls: list[ModelCallRef] = Field(default_factory=list)
    conversation: list[NeMoGymResponseInputItem] = Field(default_factory=list)


class ToolCallObservation(ObservationModel):
    """When one tool call ran and how it ended, as seen where the agent ran it."""

    kind: Literal["tool_call"] = "tool_call"
    invocation_id: str
    tool_call_id: str
    # The sandbox the call ran in (shared by concurrent calls; not a per-call resource account).
    sandbox_id: Optional[str] = None
    tool_name: Optional[str] = None
    started_at: Optional[float] = None
    completed_at: Optional[float] = None
    duration_ms: NonNegative
    timing_source: Optional[Literal["executor", "artifact", "harness"]] = None
    status: Literal["completed", "failed", "timeout", "cancelled", "incomplete", "unknown"] = "unknown"
    error_type: Optional[str] = None

    @model_validator(mode="after")
    def _in_order(self) -> ToolCallObservation:
        if self.started_at is not None and self.completed_at is not None and self.completed_at < self.started_at:
            raise ValueError("completed_at must not precede started_at")
        return self


class TrajectoryToolCall(ToolCallObservation):
    """A tool call in a trajectory, with the output the model was shown."""

    output: Evidence = None


class SandboxObservation(ObservationModel):
    """How a sandbox ended and what it used over its life (measured, never its configured limits)."""

    kind: Literal["sandbox"] = "sandbox"
    role: Literal["agent", "verifier", "environment"]
    provider: Optional[str] = None
    sandbox_id: Optional[str] = None
    outcome: Literal["completed", "failed", "timeout", "oom", "sandbox_error", "cancelled", "unknown"] = "unknown"
    exit_code: Optional[int] = None
    wall_time_s: NonNegative
    cpu_time_s: NonNegative
    peak_memory_mib: NonNegative
    resource_usage_source: Optional[str] = None
    error_type: Optional[str] = None


class ContextCompactionObservation(ObservationModel):
    """A context compaction the harness reported, with the model calls around and inside it."""

    kind: Literal["context_compaction"] = "context_compaction"
    invocation_id: str
    observed_at: Optional[float] = None
    trigger: Optional[str] = None
    # As the producer counts them; before and after may be counted differently.
    tokens_before: Count
    tokens_after: Count
    outcome: Literal["completed", "failed", "aborted", "unknown"] = "unknown"
    summary: Optional[str] = None
    first_kept_item_id: Optional[str] = None
    before_model_call: Optional[ModelCallRef] = None
    model_calls: list[ModelCallRef] = Field(default_factory=list)
    after_model_call: Optional[ModelCallRef] = None


class ObservationGap(ObservationModel):
    """Something the agent could not observe, or not join exactly: a code, and where."""

    code: str
    invocation_id: Optional[str] = None
    detail: Optional[str] = None


AgentObservationRecord = Annotated[
    AgentInvocation | ToolCallObservation | ContextCompactionObservation | SandboxObservation,
    Field(discriminator="kind"),
]


def _repeated(values: list[Any]) -> bool:
    return len(values) != len(set(values))


class AgentObservationBundle(ObservationModel):
    """The records one agent server observed of one rollout, in no particular order."""

    source: str
    records: list[AgentObservationRecord] = Field(default_factory=list)
    gaps: list[ObservationGap] = Field(default_factory=list)

    @model_validator(mode="after")
    def _a_forest(self) -> AgentObservationBundle:
        invocations = [record for record in self.records if isinstance(record, AgentInvocation)]
        if _repeated([record.invocation_id for record in invocations]):
            raise ValueError("invocation_id must be unique within an observation bundle")
        # A parent never observed is allowed: a harness may see only part of the tree.
        parent_of = {record.invocation_id: record.parent_invocation_id for record in invocations}
        for start in parent_of:
            seen, current = set(), start
            while current in parent_of:
                if current in seen:
                    raise ValueError("parent_invocation_id must not form a cycle")
                seen.add(current)
                current = parent_of[current]
        return self


class TrajectoryRecord(ObservationModel):
    """Everything observed of one rollout, schema 1.0: the row's ``ng_trajectory``."""

    schema_version: Literal["1.0"] = "1.0"
    task_id: str
    rollout_id: str
    invocations: list[AgentInvocation] = Field(default_factory=list)
    turns: list[TrajectoryTurn] = Field(default_factory=list)
    model_calls: list[TrajectoryModelCall] = Field(default_factory=list)
    tool_calls: list[TrajectoryToolCall] = Field(default_factory=list)
    gaps: list[ObservationGap] = Field(default_factory=list)

    @model_validator(mode="after")
    def _identities(self) -> TrajectoryRecord:
        if _repeated([invocation.invocation_id for invocation in self.invocations]):
            raise ValueError("invocation_id must be unique within a trajectory")
        if _repeated([call.model_call_id for call in self.model_calls if call.model_call_id]):
            raise ValueError("model_call_id must be unique within a trajectory")
        if any((turn.task_id, turn.rollout_id) != (self.task_id, self.rollout_id) for turn in self.turns):
            raise ValueError("turn identity must match the trajectory")
        if _repeated([(turn.invocation_id, turn.turn_no) for turn in self.turns]):
            raise ValueError("turn number must be unique within an invocation")
        return self


@dataclass(frozen=True, slots=True)
class AgentEpisode:
    """An agent's response with the observations it had where it ran."""

    response: NeMoGymResponse
    observations: AgentObservationBundle
