"""The resolved config of the running Gym, as upstream's accessors hand it to server code."""

from __future__ import annotations

import functools
import json
import os
import random
import socket
from typing import Any

from omegaconf import DictConfig, OmegaConf

from nemo_gym.env import CONFIG_PATH_ENV


# Upstream's key names. Of the row's keys:
TASK_INDEX_KEY_NAME = "_ng_task_index"
ROLLOUT_INDEX_KEY_NAME = "_ng_rollout_index"
# A re-dispatched rollout's attempt number (0 the first time).
ATTEMPT_INDEX_KEY_NAME = "_ng_attempt_index"
ROLLOUT_ID_KEY_NAME = "_ng_rollout_id"
RESPONSES_CREATE_PARAMS_KEY_NAME = "responses_create_params"
RESPONSE_KEY_NAME = "response"
AGENT_REF_KEY_NAME = "agent_ref"
SKILLS_REF_KEY_NAME = "skills_ref"
# Of the config's top-level keys:
CONFIG_PATHS_KEY_NAME = "config_paths"
ENTRYPOINT_KEY_NAME = "entrypoint"
DEFAULT_HOST_KEY_NAME = "default_host"
HEAD_SERVER_KEY_NAME = "head_server"
DISALLOWED_PORTS_KEY_NAME = "disallowed_ports"
HF_TOKEN_KEY_NAME = "hf_token"
PORT_RANGE_LOW_KEY_NAME = "port_range_low"
PORT_RANGE_HIGH_KEY_NAME = "port_range_high"
DRY_RUN_KEY_NAME = "dry_run"
RESULTS_DIR_KEY_NAME = "results_dir"
CACHE_DIR_KEY_NAME = "cache_dir"
INHERIT_FROM_KEY_NAME = "_inherit_from"
COPY_KEY_NAME = "_copy"
DELETE_KEY_KEY_NAME = "_delete_key"
VERBOSE_KEY_NAME = "verbose"
SKIP_VERIFICATION_KEY_NAME = "skip_verification"
SKIP_VERIFICATION_REWARD_KEY_NAME = "skip_verification_reward"
POLICY_BASE_URL_KEY_NAME = "policy_base_url"
POLICY_API_KEY_KEY_NAME = "policy_api_key"
POLICY_MODEL_NAME_KEY_NAME = "policy_model_name"
POLICY_MODEL_KEY_NAME = "policy_model"
HEAD_SERVER_DEPS_KEY_NAME = "head_server_deps"
PYTHON_VERSION_KEY_NAME = "python_version"
PIP_INSTALL_VERBOSE_KEY_NAME = "pip_install_verbose"
USE_ABSOLUTE_IP = "use_absolute_ip"
UV_PIP_SET_PYTHON_KEY_NAME = "uv_pip_set_python"
SKIP_VENV_IF_PRESENT_KEY_NAME = "skip_venv_if_present"
RAY_HEAD_NODE_ADDRESS_KEY_NAME = "ray_head_node_address"
UVICORN_TIMEOUT_WORKER_HEALTHCHECK = "uvicorn_timeout_worker_healthcheck"
MODEL_ENDPOINT_READINESS_TIMEOUT_KEY_NAME = "model_endpoint_readiness_timeout_seconds"
ALLOW_OPENAI_VERSION_SKEW_KEY_NAME = "allow_openai_version_skew"
UV_CACHE_DIR_KEY_NAME = "uv_cache_dir"
UV_VENV_DIR_KEY_NAME = "uv_venv_dir"
NEMO_GYM_LOG_DIR_KEY_NAME = "nemo_gym_log_dir"
JSON_OUTPUT_KEY_NAME = "json"
QUERY_KEY_NAME = "query"
COMPONENT_NAME_KEY_NAME = "component_name"
# Model-call capture for evaluation (agents then call under their rollout's prefix), and where it is written.
OBSERVABILITY_ENABLED_KEY_NAME = "observability_enabled"
MODEL_CALL_CAPTURE_DIR_KEY_NAME = "model_call_capture_dir"
# Training token capture: ``{enabled, all_agents}``; an agent takes part with its own ``token_id_capture``.
TOKEN_ID_CAPTURE_BLOCK = "token_id_capture"


@functools.cache
def get_global_config_dict() -> DictConfig:
    """The config the launcher handed this process (the JSON file named by ``NEMO_GYM_CONFIG_PATH``)."""
    path = os.environ.get(CONFIG_PATH_ENV)
    if not path:
        raise RuntimeError(f"{CONFIG_PATH_ENV} is not set: this process was not started by the Gym launcher")
    with open(path) as file:
        return OmegaConf.create(json.load(file))


def maybe_get_global_config_dict() -> DictConfig | None:
    """The config the launcher handed this process, or None in a process it did not start."""
    return get_global_config_dict() if os.environ.get(CONFIG_PATH_ENV) else None


def get_hf_token() -> str | None:
    """The config's ``hf_token``, if it has one."""
    return get_global_config_dict().get(HF_TOKEN_KEY_NAME)


def get_first_server_config_dict(global_config_dict: Any, instance_name: str) -> Any:
    """An instance's settings: the mapping two levels below its key (``{type: {implementation: settings}}``)."""
    try:
        (implementations,) = global_config_dict[instance_name].values()
        (settings,) = implementations.values()
    except (KeyError, ValueError, AttributeError) as error:
        raise KeyError(f"no server instance named {instance_name!r} in the config") from error
    return settings


def find_open_port(disallowed_ports: list[int] | None = None, max_retries: int = 50) -> int:
    """A TCP port free to bind and not in ``disallowed_ports``: picked at random within the config's
    ``port_range_low``..``port_range_high`` when it has them (as upstream's), else one the system gives.
    RuntimeError after ``max_retries`` tries."""
    disallowed = set(disallowed_ports or [])
    config = maybe_get_global_config_dict()
    low, high = (config.get(PORT_RANGE_LOW_KEY_NAME), config.get(PORT_RANGE_HIGH_KEY_NAME)) if config is not None else (None, None)
    for _ in range(max_retries):
        port = random.randint(low, high) if low is not None and high is not None else 0
        if port in disallowed:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("", port))
            except OSError:
                continue
            port = sock.getsockname()[1]
        if port not in disallowed:
            return port
    raise RuntimeError(f"no open port that is not one of the disallowed ports {sorted(disallowed)} after {max_retries} tries")
