"""Every upstream NeMo Gym name this project added, importable from upstream's own module path."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from tests.unit_tests.import_alone import imports_alone

ROOT = Path(__file__).resolve().parents[2]

UPSTREAM_NAMES = {
    "nemo_gym": ["ROOT_DIR", "PARENT_DIR", "WORKING_DIR", "CACHE_DIR", "RESULTS_DIR", "NeMoGymAsyncOpenAI", "NeMoGymChatCompletion", "NeMoGymResponse"],
    "nemo_gym.judge": ["JudgeError", "call_judge", "reraise_judge_errors", "judge_failsafe"],
    "nemo_gym.profiling": ["Profiler"],
    "nemo_gym.openai_utils": [
        "NeMoGymAsyncOpenAI",
        "RATE_LIMIT_ERROR_CODES",
        "RETRY_ERROR_CODES",
        "REQUIRED_TOKEN_METADATA_FIELDS",
        "TOKEN_METADATA_FIELDS",
        "TokenIDLogProbMixin",
        "NeMoGymSummary",
        "NeMoGymMessage",
        "NeMoGymResponseUsage",
        "NeMoGymResponseInputTokensDetails",
        "NeMoGymResponseOutputTokensDetails",
        "NeMoGymResponseOutputRefusal",
        "NeMoGymResponseInputText",
        "NeMoGymFunctionToolParam",
        "NeMoGymEasyInputMessageForTraining",
        "NeMoGymMessageForTraining",
        "NeMoGymResponseOutputMessageForTraining",
        "NeMoGymResponseFunctionToolCallForTraining",
        "NeMoGymResponseReasoningItemForTraining",
        "NeMoGymChatCompletionMessageForTraining",
        "NeMoGymChatCompletionMessageParam",
        "NeMoGymChatCompletionUserMessageParam",
        "NeMoGymChatCompletionSystemMessageParam",
        "NeMoGymChatCompletionDeveloperMessageParam",
        "NeMoGymChatCompletionToolMessageParam",
        "NeMoGymChatCompletionAssistantMessageParam",
        "NeMoGymChatCompletionAssistantMessageForTrainingParam",
        "NeMoGymChatCompletionContentPartTextParam",
        "NeMoGymChatCompletionMessageToolCallParam",
        "NeMoGymChatCompletionMessageToolCallFunctionParam",
        "NeMoGymChatCompletionMessageToolCall",
        "NeMoGymFunction",
    ],
    "nemo_gym.prompt": ["PromptConfig", "load_prompt_config", "fill_prompt", "validate_prompt_compatibility", "apply_prompt_to_row", "materialize_prompts"],
    "nemo_gym.rollout_correlation": ["RolloutContextMiddleware", "ROLLOUT_ID_PATTERN", "current_rollout_id", "rollout_context", "maybe_rollout_id_from_run_body"],
    "nemo_gym.global_config": [
        "ATTEMPT_INDEX_KEY_NAME",
        "ROLLOUT_ID_KEY_NAME",
        "SKILLS_REF_KEY_NAME",
        "RESPONSES_CREATE_PARAMS_KEY_NAME",
        "RESPONSE_KEY_NAME",
        "HF_TOKEN_KEY_NAME",
        "DISALLOWED_PORTS_KEY_NAME",
        "CACHE_DIR_KEY_NAME",
        "RESULTS_DIR_KEY_NAME",
        "POLICY_BASE_URL_KEY_NAME",
        "POLICY_API_KEY_KEY_NAME",
        "POLICY_MODEL_NAME_KEY_NAME",
        "get_hf_token",
        "maybe_get_global_config_dict",
        "OBSERVABILITY_ENABLED_KEY_NAME",
        "MODEL_CALL_CAPTURE_DIR_KEY_NAME",
        "TOKEN_ID_CAPTURE_BLOCK",
        "COMPONENT_NAME_KEY_NAME",
        "NEMO_GYM_LOG_DIR_KEY_NAME",
        "HEAD_SERVER_DEPS_KEY_NAME",
        "UV_VENV_DIR_KEY_NAME",
        "MODEL_ENDPOINT_READINESS_TIMEOUT_KEY_NAME",
    ],
    "nemo_gym.rollout_observability": [
        "AgentEpisode",
        "AgentInvocation",
        "AgentObservationBundle",
        "AgentObservationRecord",
        "ContextCompactionObservation",
        "ModelCallRef",
        "ObservationGap",
        "SandboxObservation",
        "ToolCallObservation",
        "TrajectoryModelCall",
        "TrajectoryRecord",
        "TrajectoryResponseMetadata",
        "TrajectoryTokenStats",
        "TrajectoryToolCall",
        "TrajectoryTurn",
    ],
    "nemo_gym.rollout_collection": [
        "NG_FAILURE_CLASS_KEY",
        "NG_NO_PERSIST_KEY",
        "NG_TERMINAL_KEY",
        "NG_TRAJECTORY_KEY",
        "_attach_trajectory_record",
        "_get_max_rollout_attempts",
    ],
    "nemo_gym.responses_converter": [
        "ResponsesConverter",
        "ResponsesConverterState",
        "VLLMConverter",
        "VLLMConverterResponsesToChatCompletionsState",
        "split_responses_input_output_items",
        "_usage_detail",
    ],
    "nemo_gym.skills": ["SkillMetadata", "SkillsConfig", "SkillsRef", "hash_skill_dir", "load_skill_directory", "parse_skill_md", "stage_skills"],
    "nemo_gym.path_utils": ["failures_path_for"],
    "nemo_gym.mcp_auto_exposure": ["maybe_auto_expose"],
    "nemo_gym.server_utils": ["rollout_path_prefix", "apply_rollout_prefix", "ServerStatus"],
    "nemo_gym.reward_profile": ["add_avg_sample_std_dev"],
    "nemo_gym.base_resources_server": ["NEMO_GYM_MCP_METADATA_KEY", "NEMO_GYM_MCP_SESSION_TOKEN_HEADER"],
    "nemo_gym.sandbox": [
        "AsyncSandbox",
        "ExecResult",
        "SandboxCreateError",
        "SandboxCreateVerificationError",
        "SandboxExecResult",
        "SandboxHandle",
        "SandboxProvider",
        "SandboxResources",
        "SandboxSpec",
        "SandboxStatus",
        "create_provider",
        "get_provider_class",
        "list_providers",
        "register_provider",
        "resolve_provider_config",
        "resolve_provider_metadata",
    ],
    "nemo_gym.sandbox.config": ["resolve_provider_config", "resolve_provider_metadata", "SANDBOX_BLOCK_DEFAULT_METADATA_KEY"],
    "nemo_gym.sandbox.providers.apptainer": ["ApptainerCreateConfig", "ApptainerCreateError", "ApptainerCreateVerificationError", "ApptainerExecConfig", "ApptainerProbeConfig", "ApptainerProvider"],
    "nemo_gym.sandbox.providers.docker": ["DockerCreateConfig", "DockerCreateError", "DockerCreateVerificationError", "DockerExecConfig", "DockerProbeConfig", "DockerProvider"],
    "nemo_gym.sandbox.providers.enroot": ["EnrootCreateConfig", "EnrootCreateError", "EnrootCreateVerificationError", "EnrootExecConfig", "EnrootProbeConfig", "EnrootProvider"],
    "nemo_gym.sandbox.providers.daytona": ["DaytonaBatchConfig", "DaytonaConnectionConfig", "DaytonaCreateConfig", "DaytonaCreateError", "DaytonaCreateTimeoutError", "DaytonaOperationConfig", "DaytonaProbeConfig", "DaytonaProvider", "DaytonaProviderOptions"],
    "nemo_gym.sandbox.providers.ecs_fargate": ["EcsFargateConfig", "EcsFargateProvider", "SshSidecarConfig", "engine_config_from_mapping"],
    "nemo_gym.sandbox.providers.opensandbox": ["OpenSandboxAttributionConfig", "OpenSandboxConnectionConfig", "OpenSandboxCreateConfig", "OpenSandboxCreateError", "OpenSandboxCreateTimeoutError", "OpenSandboxCreateVerificationError", "OpenSandboxOperationConfig", "OpenSandboxProbeConfig", "OpenSandboxProvider"],
    "nemo_gym.sandbox.providers.openshell": ["OpenShellConnectionConfig", "OpenShellCreateConfig", "OpenShellCreateError", "OpenShellCreateVerificationError", "OpenShellExecConfig", "OpenShellOperationsConfig", "OpenShellProbeConfig", "OpenShellProvider", "OpenShellProviderOptions"],
    "nemo_gym.sandbox.providers.apptainer.provider": ["_require_apptainer"],
}


@pytest.mark.parametrize("module, names", UPSTREAM_NAMES.items(), ids=list(UPSTREAM_NAMES))
def test_each_upstream_name_imports_from_upstreams_module_path(module, names):
    imported = importlib.import_module(module)
    assert [name for name in names if not hasattr(imported, name)] == []


def entry(module: str) -> str:
    return f"{module}:{','.join(UPSTREAM_NAMES[module])}"


@pytest.fixture(scope="module")
def alone() -> dict[str, str]:
    """Each module's ``from MODULE import NAMES`` that failed, each run alone (tests/unit_tests/import_alone.py), all at once."""
    return imports_alone(ROOT, "nemo_gym", [entry(module) for module in UPSTREAM_NAMES])


@pytest.mark.parametrize("module", UPSTREAM_NAMES)
def test_each_upstream_module_and_its_names_import_alone(module, alone):
    assert alone.get(entry(module)) is None
