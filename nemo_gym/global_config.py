"""The resolved config of the running Gym, as upstream's accessors hand it to server code."""

from __future__ import annotations

import functools
import json
import os
from typing import Any

from omegaconf import DictConfig, OmegaConf

CONFIG_PATH_ENV = "NEMO_GYM_CONFIG_PATH"
INSTANCE_ENV = "NEMO_GYM_INSTANCE"
# Where each worker of a multi-worker server writes its output, to a file of its own (the launcher's logs).
WORKER_LOG_DIR_ENV = "NEMO_GYM_WORKER_LOG_DIR"
TASK_INDEX_KEY_NAME = "_ng_task_index"
ROLLOUT_INDEX_KEY_NAME = "_ng_rollout_index"
AGENT_REF_KEY_NAME = "agent_ref"


@functools.cache
def get_global_config_dict() -> DictConfig:
    """The config the launcher handed this process (the JSON file named by ``NEMO_GYM_CONFIG_PATH``)."""
    path = os.environ.get(CONFIG_PATH_ENV)
    if not path:
        raise RuntimeError(f"{CONFIG_PATH_ENV} is not set: this process was not started by the Gym launcher")
    with open(path) as file:
        return OmegaConf.create(json.load(file))


def get_first_server_config_dict(global_config_dict: Any, instance_name: str) -> Any:
    """An instance's settings: the mapping two levels below its key (``{type: {implementation: settings}}``)."""
    try:
        (implementations,) = global_config_dict[instance_name].values()
        (settings,) = implementations.values()
    except (KeyError, ValueError, AttributeError) as error:
        raise KeyError(f"no server instance named {instance_name!r} in the config") from error
    return settings
