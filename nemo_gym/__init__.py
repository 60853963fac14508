"""NeMo Gym shaped framework for RL environment servers that keep their sessions across uvicorn workers.

The names upstream NeMo Gym exports from the package are here too, imported on first use.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

SESSION_ID_KEY = "session_id"

# Upstream's directories: the package, the checkout holding it, and where caches and results go (under
# the checkout when it is one, an editable install; under the current directory for an installed wheel).
ROOT_DIR = Path(__file__).absolute().parent
PARENT_DIR = ROOT_DIR.parent
WORKING_DIR = PARENT_DIR if (PARENT_DIR / "pyproject.toml").exists() else Path.cwd()
CACHE_DIR = WORKING_DIR / "cache"
RESULTS_DIR = WORKING_DIR / "results"

_EXPORTS = {
    "nemo_gym.base_resources_server": [
        "AggregateMetrics",
        "AggregateMetricsRequest",
        "BaseMultiRewardVerifyResponse",
        "BaseResourcesServerConfig",
        "BaseRunRequest",
        "BaseSeedSessionRequest",
        "BaseSeedSessionResponse",
        "BaseVerifyRequest",
        "BaseVerifyResponse",
        "ReverifyMode",
        "SimpleResourcesServer",
    ],
    "nemo_gym.base_responses_api_agent": ["BaseResponsesAPIAgentConfig", "SimpleResponsesAPIAgent"],
    "nemo_gym.base_responses_api_model": ["BaseResponsesAPIModelConfig", "SimpleResponsesAPIModel"],
    "nemo_gym.config_types": ["BaseRunServerInstanceConfig", "BaseServerConfig", "Domain", "ModelServerRef"],
    "nemo_gym.openai_utils": [
        "NeMoGymAsyncOpenAI",
        "NeMoGymChatCompletion",
        "NeMoGymChatCompletionCreateParamsNonStreaming",
        "NeMoGymResponse",
        "NeMoGymResponseCreateParamsNonStreaming",
    ],
    "nemo_gym.server_utils": ["ServerClient", "get_response_json", "raise_for_status"],
}
_HOMES = {name: module for module, names in _EXPORTS.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _HOMES.get(name)
    if module is None:
        raise AttributeError(f"module 'nemo_gym' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])
