"""Every upstream NeMo Gym module path and name listed in the compatibility reference (shared/UPSTREAM_API.md) imports.

The list is written out here, section by section of that reference: the names upstream's server files
import (its section 1), the core classes, functions and constants (section 2), the package's lazy
exports (2.7), the CLI's entry points (9) and the names its surveyed servers import (11). Names another
part of the work adds (issue 24) are expected to fail until it lands, and to pass after.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from tests.unit_tests.import_alone import imports_alone

ROOT = Path(__file__).resolve().parents[2]

UPSTREAM = {
    "nemo_gym": """BaseResourcesServerConfig SimpleResourcesServer BaseRunRequest BaseVerifyRequest BaseVerifyResponse
        BaseMultiRewardVerifyResponse BaseSeedSessionRequest BaseSeedSessionResponse ReverifyMode BaseResponsesAPIAgentConfig
        SimpleResponsesAPIAgent BaseResponsesAPIModelConfig SimpleResponsesAPIModel ServerClient raise_for_status
        get_response_json SESSION_ID_KEY BaseServerConfig BaseRunServerInstanceConfig Domain AggregateMetrics
        AggregateMetricsRequest ModelServerRef NeMoGymAsyncOpenAI NeMoGymResponse NeMoGymResponseCreateParamsNonStreaming
        NeMoGymChatCompletion NeMoGymChatCompletionCreateParamsNonStreaming ROOT_DIR PARENT_DIR WORKING_DIR CACHE_DIR
        RESULTS_DIR __version__""",
    "nemo_gym.base_resources_server": """BaseVerifyResponse BaseVerifyRequest BaseRunRequest BaseResourcesServerConfig
        SimpleResourcesServer BaseSeedSessionRequest BaseSeedSessionResponse AggregateMetrics AggregateMetricsRequest
        ReverifyMode BaseMultiRewardVerifyResponse BaseResourcesServer""",
    "nemo_gym.openai_utils": """NeMoGymResponse NeMoGymResponseCreateParamsNonStreaming NeMoGymEasyInputMessage
        NeMoGymResponseFunctionToolCall NeMoGymFunctionCallOutput NeMoGymResponseOutputMessage NeMoGymResponseOutputText
        NeMoGymChatCompletion NeMoGymMessage NeMoGymResponseReasoningItem NeMoGymSummary TokenIDLogProbMixin NeMoGymChoice
        NeMoGymChatCompletionMessage NeMoGymChatCompletionCreateParamsNonStreaming NeMoGymAsyncOpenAI
        NeMoGymChatCompletionMessageForTraining REQUIRED_TOKEN_METADATA_FIELDS TOKEN_METADATA_FIELDS
        accumulate_response_usage""",
    "nemo_gym.config_types": """BaseServerConfig BaseRunServerConfig BaseRunServerInstanceConfig ModelServerRef
        ResourcesServerRef AgentServerRef Domain DatasetConfig BenchmarkDatasetConfig ROLLOUT_PATH_PREFIX
        TOKEN_CAPTURE_PATH_SEGMENT""",
    "nemo_gym.server_utils": """raise_for_status get_response_json ServerClient SESSION_ID_KEY request
        get_first_server_config_dict is_nemo_gym_fastapi_entrypoint get_server_url BaseServer SimpleServer HeadServer
        setup_server_client initialize_ray MAX_NUM_TRIES DEFAULT_HEAD_SERVER_PORT""",
    "nemo_gym.base_responses_api_agent": """BaseResponsesAPIAgentConfig SimpleResponsesAPIAgent Body BaseResponsesAPIAgent
        rollout_id_from_run url_path_for_run url_path_for_request _model_call_capture_enabled base_url_for_run
        resolve_model_base_url""",
    "nemo_gym.base_responses_api_model": "Body BaseResponsesAPIModelConfig SimpleResponsesAPIModel BaseResponsesAPIModel",
    "nemo_gym.reward_profile": """compute_pass_majority_metrics highest_k_metrics compute_subset_metrics
        AggregateMetricsMixin compute_aggregate_metrics""",
    "nemo_gym.judge": "call_judge JudgeError",
    "nemo_gym.global_config": "get_global_config_dict get_first_server_config_dict TASK_INDEX_KEY_NAME ROLLOUT_INDEX_KEY_NAME",
    "nemo_gym.rollout_observability": "AgentInvocation ModelCallRef ObservationGap TrajectoryRecord TrajectoryToolCall TrajectoryTurn",
    "nemo_gym.responses_converter": "VLLMConverter VLLMConverterResponsesToChatCompletionsState split_responses_input_output_items",
    "nemo_gym.cli.main": "main",
    "nemo_gym.cli.legacy": "main",
}

# Listed in the reference but not here yet: issue 24 (the upstream modules part) adds them.
ISSUE_24 = {
    "nemo_gym": {"__version__"},
    "nemo_gym.base_resources_server": {"BaseResourcesServer"},
    "nemo_gym.config_types": {"BenchmarkDatasetConfig"},
    "nemo_gym.server_utils": {"BaseServer", "SimpleServer", "HeadServer", "setup_server_client"},
    "nemo_gym.base_responses_api_agent": {
        "BaseResponsesAPIAgent",
        "rollout_id_from_run",
        "url_path_for_run",
        "url_path_for_request",
        "_model_call_capture_enabled",
        "base_url_for_run",
        "resolve_model_base_url",
    },
    "nemo_gym.base_responses_api_model": {"BaseResponsesAPIModel"},
    "nemo_gym.cli.legacy": {"main"},
}
MODULES_OF_ISSUE_24 = {module for module, names in ISSUE_24.items() if names == set(UPSTREAM[module].split())}
LATER = pytest.mark.xfail(strict=True, reason="issue 24 adds it")


def each_name():
    for module, names in UPSTREAM.items():
        for name in names.split():
            yield pytest.param(module, name, id=f"{module}:{name}", marks=[LATER] if name in ISSUE_24.get(module, ()) else [])


@pytest.mark.parametrize("module, name", each_name())
def test_each_upstream_name_imports_from_its_upstream_path(module, name):
    assert hasattr(importlib.import_module(module), name)


def test_each_upstream_module_imports_alone():
    """With no other module of nemo_gym loaded before it (tests/unit_tests/import_alone.py)."""
    assert imports_alone(ROOT, "nemo_gym", sorted(set(UPSTREAM) - MODULES_OF_ISSUE_24)) == {}
