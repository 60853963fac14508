"""Upstream vllm_model's config keys: each one this server honours reaches a real loopback backend; each it cannot
honour is refused when the config loads, naming the key and why."""

from __future__ import annotations

import json

import pytest
from fastapi.responses import JSONResponse

from nemo_gym import config as gym_config
from nemo_gym.config import ConfigError
from nemo_gym.process import discovery
from responses_api_models.vllm_model.tests.test_app import ask, backend, completion, model_config, model_server
from tests.unit_tests.in_process_server import serving

REASONING = {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "1 + 1 is 2."}]}
SAID = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "2."}]}
ASKED = {"role": "user", "content": "1 + 1?"}


async def sent(body: dict, **settings) -> list[dict]:
    """What the backend received for ``body`` sent to a vllm_model with ``settings``."""
    app, seen = backend()
    async with serving(app) as url, model_server(f"{url}/v1", **settings) as client:
        reply = await ask(client, body)
    assert reply.status == 200, reply.text
    return seen


@pytest.mark.anyio
async def test_default_headers_reach_the_backend_on_every_request():
    app, seen = backend()
    headers = {"X-Tenant": "team-a", "X-Route": "blue"}
    async with serving(app) as url, model_server(f"{url}/v1", api_key="sk-test", default_headers=headers) as client:
        for _ in range(2):
            assert (await ask(client, {"input": "hi"})).status == 200
    assert [(request["headers"]["x-tenant"], request["headers"]["x-route"]) for request in seen] == [("team-a", "blue")] * 2
    assert {request["authorization"] for request in seen} == {"Bearer sk-test"}


@pytest.mark.anyio
async def test_an_authorization_in_default_headers_replaces_the_one_made_from_api_key():
    [request] = await sent({"input": "hi"}, api_key="sk-test", default_headers={"Authorization": "Token hosted-key"})
    assert request["authorization"] == "Token hosted-key"


@pytest.mark.anyio
async def test_extra_body_is_merged_into_the_request_under_the_requests_own_fields():
    extra_body = {"top_k": 20, "temperature": 0.1, "repetition_penalty": 1.05}
    [given, left_out] = [
        (await sent(body, extra_body=extra_body))[0]["body"] for body in ({"input": "hi", "temperature": 0.7}, {"input": "hi"})
    ]
    assert (given["top_k"], given["repetition_penalty"], given["temperature"]) == (20, 1.05, 0.7)
    assert left_out["temperature"] == 0.1


@pytest.mark.anyio
async def test_sampling_overrides_replace_the_requests_sampling_params_and_extra_body():
    settings = {"extra_body": {"top_p": 0.5}, "sampling_overrides": {"temperature": 1.0, "top_p": 1.0, "max_tokens": 64}}
    [request] = await sent({"input": "hi", "temperature": 0.2, "max_output_tokens": 9}, **settings)
    assert {key: request["body"][key] for key in ("temperature", "top_p", "max_tokens")} == {"temperature": 1.0, "top_p": 1.0, "max_tokens": 64}


@pytest.mark.anyio
async def test_chat_template_kwargs_reach_the_backend_as_vllms_chat_template_kwargs_field():
    [request] = await sent({"input": "hi"}, chat_template_kwargs={"enable_thinking": False})
    assert request["body"]["chat_template_kwargs"] == {"enable_thinking": False}


@pytest.mark.anyio
async def test_a_rows_metadata_chat_template_kwargs_and_extra_body_override_the_configs_for_that_request():
    metadata = {"chat_template_kwargs": json.dumps({"enable_thinking": True}), "extra_body": json.dumps({"top_k": 5})}
    settings = {"chat_template_kwargs": {"enable_thinking": False, "mode": "x"}, "extra_body": {"top_k": 20, "min_p": 0.1}}
    [request] = await sent({"input": "hi", "metadata": metadata}, **settings)
    assert request["body"]["chat_template_kwargs"] == {"enable_thinking": True, "mode": "x"}
    assert (request["body"]["top_k"], request["body"]["min_p"]) == (5, 0.1)


@pytest.mark.anyio
@pytest.mark.parametrize("value", ["{not json", "[1, 2]"])
async def test_metadata_extra_body_that_is_not_a_json_object_is_a_400_naming_it(value):
    app, seen = backend()
    async with serving(app) as url, model_server(f"{url}/v1") as client:
        reply = await ask(client, {"input": "hi", "metadata": {"extra_body": value}})
    assert reply.status == 400
    assert reply.body["detail"].startswith("metadata.extra_body must be a JSON object")
    assert seen == []


@pytest.mark.anyio
async def test_replace_developer_role_with_system_sends_developer_messages_as_system():
    body = {"input": [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "hi"}]}
    [request] = await sent(body, replace_developer_role_with_system=True)
    assert [message["role"] for message in request["body"]["messages"]] == ["system", "user"]


@pytest.mark.anyio
async def test_interleaved_reasoning_sends_past_reasoning_on_the_assistant_message_that_followed_it():
    [request] = await sent({"input": [ASKED, REASONING, SAID, {"role": "user", "content": "And 2 + 2?"}]})
    assistant = request["body"]["messages"][1]
    assert assistant == {"role": "assistant", "content": "2.", "reasoning_content": "1 + 1 is 2.", "reasoning": "1 + 1 is 2."}


@pytest.mark.anyio
async def test_reasoning_followed_by_no_assistant_turn_goes_back_as_an_assistant_message_of_its_own():
    [request] = await sent({"input": [ASKED, REASONING]})
    assert request["body"]["messages"][-1] == {"role": "assistant", "content": "", "reasoning_content": "1 + 1 is 2.", "reasoning": "1 + 1 is 2."}


@pytest.mark.anyio
async def test_without_interleaved_reasoning_past_reasoning_is_left_out():
    [request] = await sent({"input": [ASKED, REASONING, SAID]}, uses_interleaved_reasoning=False)
    assert request["body"]["messages"][1] == {"role": "assistant", "content": "2."}


@pytest.mark.anyio
async def test_without_a_reasoning_parser_past_reasoning_goes_back_inline_in_think_tags():
    [request] = await sent({"input": [ASKED, REASONING, SAID]}, uses_reasoning_parser=False)
    assert request["body"]["messages"][1] == {"role": "assistant", "content": "<think>1 + 1 is 2.</think>2."}


@pytest.mark.anyio
async def test_newer_vllms_reasoning_field_becomes_a_reasoning_item():
    app, _ = backend(JSONResponse(completion({"role": "assistant", "content": "2.", "reasoning": "1 + 1 is 2."})))
    async with serving(app) as url, model_server(f"{url}/v1") as client:
        reply = await ask(client, {"input": "1 + 1?"})
    reasoning, message = reply.body["output"]
    assert (reasoning["type"], reasoning["summary"][0]["text"]) == ("reasoning", "1 + 1 is 2.")
    assert message["content"][0]["text"] == "2."


@pytest.mark.anyio
async def test_without_sequential_reasoning_a_request_ending_in_reasoning_is_incomplete_without_a_backend_call():
    app, seen = backend()
    async with serving(app) as url, model_server(f"{url}/v1", sequential_reasoning_allowed=False) as client:
        stopped = await ask(client, {"input": [ASKED, REASONING]})
        answered = await ask(client, {"input": [ASKED, REASONING, SAID, {"role": "user", "content": "Sure?"}]})
    assert stopped.status == 200, stopped.text
    assert (stopped.body["status"], stopped.body["incomplete_details"], stopped.body["output"]) == ("incomplete", {"reason": "content_filter"}, [])
    assert answered.status == 200
    assert len(seen) == 1


@pytest.mark.anyio
async def test_is_responses_native_sends_the_request_to_the_backends_responses_endpoint_with_the_configs_fields():
    settings = {
        "is_responses_native": True,
        "default_headers": {"X-Tenant": "team-a"},
        "chat_template_kwargs": {"enable_thinking": False},
        "extra_body": {"top_k": 20},
        "sampling_overrides": {"temperature": 1.0},
    }
    app, seen = backend()
    async with serving(app) as url, model_server(f"{url}/v1", **settings) as client:
        reply = await ask(client, {"input": "hi", "instructions": "Be nice.", "temperature": 0.2})
    assert reply.status == 200, reply.text
    assert reply.body["output"][0]["content"][0]["text"] == "Hello."
    [request] = seen
    assert (request["path"], request["headers"]["x-tenant"]) == ("/v1/responses", "team-a")
    body = request["body"]
    assert (body["input"], body["instructions"], body["model"]) == ("hi", "Be nice.", "m")
    assert (body["chat_template_kwargs"], body["top_k"], body["temperature"]) == ({"enable_thinking": False}, 20, 1.0)


@pytest.mark.parametrize(
    ("settings", "key", "why"),
    [
        ({"return_token_id_information": True}, "return_token_id_information", "token ids"),
        ({"use_completions_api": True}, "use_completions_api", "/v1/completions"),
        ({"is_responses_native": True, "replace_developer_role_with_system": True}, "replace_developer_role_with_system", "is_responses_native"),
        ({"is_responses_native": True, "sequential_reasoning_allowed": False}, "sequential_reasoning_allowed", "is_responses_native"),
    ],
)
def test_a_key_this_server_cannot_honour_is_refused_at_load_naming_the_key_and_why(settings, key, why):
    instances = gym_config.parse(model_config(base_url="http://127.0.0.1:9/v1", **settings), {"policy": "policy.yaml"})
    with pytest.raises(ConfigError) as error:
        discovery.check_settings(instances)
    assert str(error.value).startswith(f"policy.yaml: policy.responses_api_models.vllm_model.{key}: ")
    assert why in str(error.value)


def test_upstream_defaults_and_keys_consulted_only_with_a_refused_one_load():
    settings = {
        "return_token_id_information": False,
        "use_completions_api": False,
        "uses_reasoning_parser": True,
        "uses_interleaved_reasoning": True,
        "sequential_reasoning_allowed": True,
        "is_responses_native": False,
        "render_chat_template": True,
        "request_prompt_and_generation_token_ids": True,
    }
    discovery.check_settings(gym_config.parse(model_config(base_url="http://127.0.0.1:9/v1", **settings), {"policy": "policy.yaml"}))
