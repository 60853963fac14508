"""NeMoGymAsyncOpenAI: upstream's client of an OpenAI-compatible endpoint, against a real server."""

from __future__ import annotations

import aiohttp
import pytest
from fastapi import FastAPI, Request, Response

from nemo_gym.openai_utils import RATE_LIMIT_ERROR_CODES, RETRY_ERROR_CODES, NeMoGymAsyncOpenAI
from tests.unit_tests.in_process_server import serving


def endpoint_app(statuses: list[int], seen: list[dict]) -> FastAPI:
    """Answers each call with the next status of ``statuses`` (200 when they run out) and notes what it got."""
    app = FastAPI()

    @app.api_route("/{path:path}", methods=["GET", "POST"])
    async def answer(path: str, request: Request, response: Response) -> dict:
        body = await request.json() if request.method == "POST" else None
        seen.append({"path": f"/{path}", "authorization": request.headers.get("authorization"), "x-team": request.headers.get("x-team"), "body": body})
        response.status_code = statuses.pop(0) if statuses else 200
        return {"path": f"/{path}", "body": body}

    return app


@pytest.fixture
async def endpoint():
    statuses: list[int] = []
    seen: list[dict] = []
    async with serving(endpoint_app(statuses, seen)) as url:
        yield url, statuses, seen


@pytest.mark.anyio
async def test_each_create_call_posts_its_keywords_to_its_path_with_the_bearer_key_and_default_headers(endpoint):
    url, _, seen = endpoint
    client = NeMoGymAsyncOpenAI(base_url=f"{url}/v1", api_key="sk-test", default_headers={"x-team": "gym"})
    assert await client.create_chat_completion(model="m", messages=[]) == {"path": "/v1/chat/completions", "body": {"model": "m", "messages": []}}
    assert (await client.create_response(input="hi"))["path"] == "/v1/responses"
    assert (await client.create_completion(prompt="hi"))["path"] == "/v1/completions"
    assert (await client.create_models())["path"] == "/v1/models"
    assert (await client.create_tokenize(prompt="hi"))["path"] == "/tokenize"
    assert {(call["authorization"], call["x-team"]) for call in seen} == {("Bearer sk-test", "gym")}


@pytest.mark.anyio
async def test_rate_limits_are_retried_without_using_up_the_tries(endpoint):
    url, statuses, seen = endpoint
    statuses.extend([429, 503, 502, 429, 500, 520])
    reply = await NeMoGymAsyncOpenAI(base_url=f"{url}/v1", api_key="k").create_response(input="hi")
    assert reply["path"] == "/v1/responses" and len(seen) == 7


@pytest.mark.anyio
async def test_server_errors_are_tried_three_times_then_raised(endpoint):
    url, statuses, seen = endpoint
    statuses.extend([500, 500, 500, 500])
    with pytest.raises(aiohttp.ClientResponseError) as raised:
        await NeMoGymAsyncOpenAI(base_url=f"{url}/v1", api_key="k").create_response(input="hi")
    assert raised.value.status == 500 and len(seen) == 3


@pytest.mark.anyio
async def test_a_client_error_is_raised_at_once(endpoint):
    url, statuses, seen = endpoint
    statuses.append(400)
    with pytest.raises(aiohttp.ClientResponseError, match="400"):
        await NeMoGymAsyncOpenAI(base_url=f"{url}/v1", api_key="k").create_chat_completion(messages=[])
    assert len(seen) == 1


def test_the_retried_statuses_are_upstreams():
    assert (RATE_LIMIT_ERROR_CODES, RETRY_ERROR_CODES) == ([429, 502, 503, 504, 520], [429, 502, 503, 504, 520, 500])
