"""Configs built from command-line shortcuts, so a user can start an environment without writing YAML."""

from __future__ import annotations

from typing import Any

POLICY_MODEL = "policy_model"
SCRIPTED_BACKEND = "scripted_backend"


def agent_name(resources_server: str) -> str:
    return f"{resources_server}_simple_agent"


def environment_trio(
    resources_server: str, num_workers: int = 1, model_url: str | None = None, model: str | None = None
) -> dict[str, Any]:
    """The resources server, a simple_agent for it, and a model server.

    Without a model URL the model server plays the embedded scripted backend, which is started too.
    """
    model_settings: dict[str, Any] = {"model": model or "scripted"}
    config: dict[str, Any] = {
        resources_server: {"resources_servers": {resources_server: {"num_workers": num_workers}}},
        agent_name(resources_server): {
            "responses_api_agents": {
                "simple_agent": {
                    "resources_server": {"type": "resources_servers", "name": resources_server},
                    "model_server": {"type": "responses_api_models", "name": POLICY_MODEL},
                }
            }
        },
        POLICY_MODEL: {"responses_api_models": {"vllm_model": model_settings}},
    }
    if model_url:
        model_settings["base_url"] = model_url
    else:
        model_settings["backend_server"] = {"type": "responses_api_models", "name": SCRIPTED_BACKEND}
        config[SCRIPTED_BACKEND] = {"responses_api_models": {"scripted_backend": {}}}
    return config
