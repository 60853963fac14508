"""Configs the config tests load: the session counter alone, with its agent and model, and as upstream writes them."""

from __future__ import annotations

from pathlib import Path


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


COUNTER = """
counter:
  resources_servers:
    example_session_state_mgmt:
      entrypoint: app.py
"""


TRIO = COUNTER + """
counter_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      resources_server: {type: resources_servers, name: counter}
      model_server: {type: responses_api_models, name: policy_model}
policy_model:
  responses_api_models:
    vllm_model:
      entrypoint: app.py
      base_url: http://127.0.0.1:9/v1
      model: first
"""


UPSTREAM_SHAPED = """
policy_base_url: http://127.0.0.1:9/v1
policy_model_name: upstream-model
config_paths: []
default_host: 127.0.0.1
error_on_almost_servers: false
counter:
  resources_servers:
    example_session_state_mgmt:
      entrypoint: app.py
      domain: games
      verified: false
      verified_url: https://example.com/report
      description: Count per session
      value: Teaches keeping state across tool calls
      datasets:
        - name: example
          type: example
          jsonl_fpath: resources_servers/example_session_state_mgmt/data/example.jsonl
        - name: train
          type: train
          jsonl_fpath: data/train.jsonl
          license: Apache 2.0
          num_repeats: 2
          source: {type: huggingface, repo_id: someone/counter}
counter_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      domain: agent
      resources_server: {type: resources_servers, name: counter}
      model_server: {type: responses_api_models, name: policy_model}
policy_model:
  responses_api_models:
    vllm_model:
      entrypoint: app.py
      base_url: ${policy_base_url}
      model: ${policy_model_name}
      return_token_id_information: false
      uses_reasoning_parser: true
      chat_template_kwargs: {enable_thinking: false}
"""


ENV_YAML = "policy_base_url: http://127.0.0.1:7/v1\npolicy_api_key: from-env-yaml\npolicy_model_name: env-model\n"
UPSTREAM_MODEL = """
policy_model:
  responses_api_models:
    vllm_model:
      base_url: ${policy_base_url}
      api_key: ${policy_api_key}
      model: ${policy_model_name}
"""
