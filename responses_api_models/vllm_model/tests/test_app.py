"""vllm_model: its config, and a clear 502/504 for a backend that fails."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response as RawResponse

from nemo_gym import config as gym_config
from nemo_gym.client.reading import ReadingClient
from nemo_gym.config import ConfigError, Instance, free_port
from nemo_gym.openai_utils import NeMoGymResponseOutputMessage, NeMoGymResponseOutputText, new_response
from nemo_gym.process import discovery
from responses_api_models.vllm_model.app import VLLMModel
from tests.unit_tests.in_process_server import serving

MODEL = "policy"
TOOL = {
    "type": "function",
    "name": "increment_counter",
    "description": "Add `count` to the counter.",
    "parameters": {"type": "object", "properties": {"count": {"type": "integer"}}, "required": ["count"]},
    "strict": True,
}


def completion(message: dict, finish_reason: str = "stop", usage: dict | None = None) -> dict:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "served-model",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": usage or {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }


def model_config(**settings) -> dict:
    return {MODEL: {"responses_api_models": {"vllm_model": settings}}}


def test_a_config_with_neither_base_url_nor_backend_server_is_refused_naming_the_key():
    instances = gym_config.parse(model_config(model="m"), {MODEL: "policy.yaml"})
    with pytest.raises(ConfigError, match="^policy.yaml: policy.responses_api_models.vllm_model.backend_server: .*base_url"):
        discovery.check_settings(instances)


def test_a_later_config_file_can_swap_backend_server_for_base_url(tmp_path):
    example = gym_config.REPO_ROOT / "resources_servers" / "example_session_state_mgmt" / "configs" / "example_session_state_mgmt.yaml"
    overlay = tmp_path / "real_model.yaml"
    overlay.write_text("policy_model:\n  responses_api_models:\n    vllm_model:\n      base_url: http://127.0.0.1:8000/v1\n      backend_server: null\n")
    settings = discovery.load([example, overlay])["policy_model"].settings
    assert (settings["base_url"], settings["backend_server"]) == ("http://127.0.0.1:8000/v1", None)


def test_a_config_with_both_base_url_and_backend_server_is_refused_naming_the_key():
    data = model_config(base_url="http://127.0.0.1:9/v1", backend_server={"type": "responses_api_models", "name": "other"})
    data["other"] = {"responses_api_models": {"scripted_backend": {}}}
    instances = gym_config.parse(data, {MODEL: "policy.yaml"})
    with pytest.raises(ConfigError, match="^policy.yaml: policy.responses_api_models.vllm_model.backend_server: "):
        discovery.check_settings(instances)


@contextlib.asynccontextmanager
async def model_server(base_url: str, **settings) -> AsyncIterator[ReadingClient]:
    """The vllm_model server on a free port in front of ``base_url``; yields a client that reaches it."""
    port = free_port()
    config = {"host": "127.0.0.1", "port": port, "base_url": base_url, "model": "m", "timeout_seconds": 30, **settings}
    instances = {MODEL: Instance(MODEL, "responses_api_models", "vllm_model", {"entrypoint": "app.py", "num_workers": 1, **config})}
    client = ReadingClient(instances)
    try:
        async with serving(VLLMModel.for_instance(MODEL, instances).build_app(), port):
            yield client
    finally:
        await client.close()


def backend(reply: RawResponse | None = None) -> tuple[FastAPI, list[dict]]:
    """A chat completions (and Responses API) backend that records each request; answers ``reply`` or a plain answer."""
    app = FastAPI()
    seen: list[dict] = []

    async def record(request: Request) -> None:
        headers = dict(request.headers)
        seen.append({"path": request.url.path, "body": await request.json(), "headers": headers, "authorization": headers.get("authorization")})

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> RawResponse:
        await record(request)
        return reply or JSONResponse(completion({"role": "assistant", "content": "Hello."}))

    @app.post("/v1/responses")
    async def responses(request: Request) -> RawResponse:
        await record(request)
        return reply or JSONResponse(new_response(output=[NeMoGymResponseOutputMessage(content=[NeMoGymResponseOutputText(text="Hello.")])]).model_dump(mode="json"))

    return app, seen


async def ask(client: ReadingClient, body: dict | None = None):
    return await client.post(MODEL, "/v1/responses", json=body or {"input": "hi", "tools": [TOOL]})


@pytest.mark.anyio
async def test_a_request_reaches_the_backend_translated_and_the_answer_comes_back():
    app, seen = backend()
    async with serving(app) as url, model_server(f"{url}/v1/", api_key="sk-test") as client:
        reply = await ask(client, {"input": "hi", "instructions": "Be nice.", "tools": [TOOL]})
    assert reply.status == 200, reply.text
    assert reply.body["output"][0]["content"][0]["text"] == "Hello."
    [request] = seen
    assert request["authorization"] == "Bearer sk-test"
    assert request["body"]["model"] == "m"
    assert request["body"]["messages"] == [{"role": "system", "content": "Be nice."}, {"role": "user", "content": "hi"}]
    assert request["body"]["tools"][0]["function"]["name"] == "increment_counter"


@pytest.mark.anyio
async def test_a_backend_that_is_down_gives_502_saying_it_is_unreachable():
    url = f"http://127.0.0.1:{free_port()}/v1"
    async with model_server(url) as client:
        reply = await ask(client)
    assert reply.status == 502
    assert reply.body["detail"].startswith(f"model backend {url}/chat/completions is unreachable")


@pytest.mark.anyio
async def test_a_backend_that_answers_text_that_is_not_json_gives_502():
    app, _ = backend(RawResponse("<html>Bad gateway</html>", media_type="text/html"))
    async with serving(app) as url, model_server(f"{url}/v1") as client:
        reply = await ask(client)
    assert reply.status == 502
    assert "answered garbage" in reply.body["detail"]


@pytest.mark.anyio
async def test_a_backend_that_answers_bytes_that_are_not_text_gives_502():
    app, _ = backend(RawResponse(b"\xff\xfe\x00garbage\x80", media_type="application/json"))
    async with serving(app) as url, model_server(f"{url}/v1") as client:
        reply = await ask(client)
    assert reply.status == 502
    assert "answered garbage" in reply.body["detail"]


@pytest.mark.anyio
async def test_a_backend_that_answers_json_without_choices_gives_502():
    app, _ = backend(JSONResponse({"object": "error", "message": "model not loaded"}))
    async with serving(app) as url, model_server(f"{url}/v1") as client:
        reply = await ask(client)
    assert reply.status == 502
    assert "not a chat completion" in reply.body["detail"]
    assert "model not loaded" in reply.body["detail"]


@pytest.mark.anyio
async def test_a_backend_that_answers_an_error_status_gives_502_with_its_status_and_text():
    app, _ = backend(JSONResponse({"message": "out of memory"}, status_code=500))
    async with serving(app) as url, model_server(f"{url}/v1") as client:
        reply = await ask(client)
    assert reply.status == 502
    assert "answered 500" in reply.body["detail"] and "out of memory" in reply.body["detail"]


@pytest.mark.anyio
async def test_a_backend_that_never_answers_gives_504_after_timeout_seconds():
    connections: list[asyncio.StreamWriter] = []

    async def accept_and_stay_silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        await reader.read()  # until the model server gives up and closes

    silent = await asyncio.start_server(accept_and_stay_silent, "127.0.0.1", 0)
    port = silent.sockets[0].getsockname()[1]
    try:
        async with model_server(f"http://127.0.0.1:{port}/v1", timeout_seconds=0.5) as client:
            reply = await ask(client)
    finally:
        for writer in connections:
            writer.close()
        silent.close()
        await silent.wait_closed()
    assert connections, "the model server never reached the backend"
    assert reply.status == 504
    assert reply.body["detail"] == f"model backend http://127.0.0.1:{port}/v1/chat/completions did not answer within 0.5 s"
