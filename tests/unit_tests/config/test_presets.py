"""The `--resources-server` shortcut: the trio of resources server, simple_agent and model server."""

from __future__ import annotations

from nemo_gym import config as gym_config
from nemo_gym.config.presets import POLICY_MODEL, SCRIPTED_BACKEND, agent_name, environment_trio
from nemo_gym.process import discovery

COUNTER = "example_session_state_mgmt"


def load(data: dict) -> dict[str, gym_config.Instance]:
    instances = gym_config.parse(data, check_ports=False)
    discovery.check_settings(instances)
    return instances


def test_without_a_model_url_the_trio_plays_the_embedded_scripted_backend():
    instances = load(environment_trio(COUNTER, num_workers=3))
    assert sorted(instances) == sorted([COUNTER, agent_name(COUNTER), POLICY_MODEL, SCRIPTED_BACKEND])
    assert instances[COUNTER].num_workers == 3
    assert instances[POLICY_MODEL].settings["backend_server"] == {"type": "responses_api_models", "name": SCRIPTED_BACKEND}
    assert "base_url" not in instances[POLICY_MODEL].settings


def test_with_a_model_url_the_trio_points_the_model_server_at_it_and_starts_no_scripted_backend():
    instances = load(environment_trio(COUNTER, model_url="http://127.0.0.1:8000/v1", model="my-model"))
    assert SCRIPTED_BACKEND not in instances
    settings = instances[POLICY_MODEL].settings
    assert (settings["base_url"], settings["model"]) == ("http://127.0.0.1:8000/v1", "my-model")
    assert "backend_server" not in settings
    assert instances[agent_name(COUNTER)].settings["resources_server"] == {"type": "resources_servers", "name": COUNTER}
