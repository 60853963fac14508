"""The relay: the caller's body and cookies go to the downstream agent; its body, status and cookies come back."""

import contextlib
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from nemo_gym import config as gym_config
from nemo_gym.config import free_port
from nemo_gym.openai_utils import (
    NeMoGymResponseCreateParamsNonStreaming,
    NeMoGymResponseOutputMessage,
    NeMoGymResponseOutputText,
    new_response,
)
from responses_api_agents.legacy_agent.app import LegacyAgent
from tests.unit_tests.in_process_server import serving

ROW = {"responses_create_params": {"input": "Add 1, then add 2."}, "initial_count": 0, "expected_count": 3, "note": None}


class Downstream:
    """The downstream agent: a real server that records each call and answers with a canned reply."""

    def __init__(self, status: int = 200, body: object = None, cookies: dict[str, str] | None = None) -> None:
        self.status, self.body, self.cookies = status, body, cookies or {}
        self.calls: list[dict] = []

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/{path:path}")
        async def answer(path: str, request: Request) -> JSONResponse:
            self.calls.append({"path": f"/{path}", "json": await request.json(), "cookies": dict(request.cookies)})
            reply = JSONResponse(self.body, self.status)
            for name, value in self.cookies.items():
                reply.set_cookie(name, value)
            return reply

        return app


@contextlib.asynccontextmanager
async def relay(downstream: Downstream | None) -> AsyncIterator[httpx.AsyncClient]:
    """The relay on a real server in front of ``downstream`` (None: nothing listens where it should be)."""
    port = free_port()
    agent = {"host": "127.0.0.1", "port": port, "downstream_agent": {"type": "responses_api_agents", "name": "legacy_agent"}}
    data = {
        "legacy_agent": {"responses_api_agents": {"legacy_agent": {"downstream_agent": {"type": "responses_api_agents", "name": "agent"}}}},
        "agent": {"responses_api_agents": {"legacy_agent": agent}},
    }
    server = LegacyAgent.for_instance("legacy_agent", gym_config.parse(data))
    async with contextlib.AsyncExitStack() as stack:
        if downstream is not None:
            await stack.enter_async_context(serving(downstream.app(), port))
        url = await stack.enter_async_context(serving(server.build_app()))
        yield await stack.enter_async_context(httpx.AsyncClient(base_url=url))


@pytest.mark.anyio
async def test_run_is_relayed_with_the_callers_body_and_cookies():
    downstream = Downstream(body={"reward": 1.0})
    async with relay(downstream) as client:
        client.cookies.set("counter_session", "from-caller")
        reply = await client.post("/run", json=ROW)
    assert reply.status_code == 200 and reply.json() == {"reward": 1.0}
    (call,) = downstream.calls
    assert call["path"] == "/run"
    assert call["json"] == ROW
    assert call["cookies"]["counter_session"] == "from-caller"


@pytest.mark.anyio
async def test_the_downstream_cookies_come_back_to_the_caller():
    cookies = {"counter_session": "minted-by-counter", "agent_session": "minted-by-agent"}
    async with relay(Downstream(body={"reward": 1.0}, cookies=cookies)) as client:
        reply = await client.post("/run", json=ROW)
    assert reply.cookies["counter_session"] == "minted-by-counter"
    assert reply.cookies["agent_session"] == "minted-by-agent"


DOWNSTREAM_RESPONSE = new_response(
    NeMoGymResponseCreateParamsNonStreaming(input="hi"),
    model="m",
    output=[NeMoGymResponseOutputMessage(content=[NeMoGymResponseOutputText(text="hello")])],
).model_dump(mode="json", by_alias=True, exclude_none=True)


@pytest.mark.anyio
async def test_responses_are_relayed_too():
    downstream = Downstream(body=DOWNSTREAM_RESPONSE, cookies={"agent_session": "s"})
    async with relay(downstream) as client:
        client.cookies.set("agent_session", "s")
        reply = await client.post("/v1/responses", json={"input": "hi"})
    assert reply.json() == DOWNSTREAM_RESPONSE
    assert downstream.calls[0]["path"] == "/v1/responses" and downstream.calls[0]["cookies"]["agent_session"] == "s"
    assert reply.cookies["agent_session"] == "s"


@pytest.mark.anyio
async def test_a_streaming_request_goes_down_plain_and_comes_back_as_events():
    downstream = Downstream(body=DOWNSTREAM_RESPONSE)
    async with relay(downstream) as client:
        reply = await client.post("/v1/responses", json={"input": "hi", "stream": True})
    assert reply.headers["content-type"].startswith("text/event-stream")
    assert "event: response.completed" in reply.text
    assert downstream.calls[0]["json"] == {"input": "hi"}


@pytest.mark.anyio
async def test_a_lost_session_downstream_stays_a_410():
    async with relay(Downstream(410, {"detail": "worker gone"})) as client:
        reply = await client.post("/run", json=ROW)
    assert reply.status_code == 410 and "worker gone" in reply.json()["detail"]


@pytest.mark.anyio
async def test_a_failed_downstream_is_a_502_with_its_status_and_body():
    async with relay(Downstream(500, {"detail": "boom"})) as client:
        reply = await client.post("/run", json=ROW)
    assert reply.status_code == 502 and reply.json()["detail"] == 'agent/run answered 500: {"detail":"boom"}'


@pytest.mark.anyio
async def test_an_unreachable_downstream_is_a_502_naming_it():
    async with relay(None) as client:
        reply = await client.post("/run", json=ROW)
    assert reply.status_code == 502 and reply.json()["detail"].startswith("agent/run is unreachable")


@pytest.mark.anyio
@pytest.mark.parametrize("body", [{}, {"responses_create_params": {"input": "x", "typo": 1}}])
async def test_a_malformed_run_is_refused_before_relaying(body):
    downstream = Downstream(body={})
    async with relay(downstream) as client:
        assert (await client.post("/run", json=body)).status_code == 422
    assert downstream.calls == []
