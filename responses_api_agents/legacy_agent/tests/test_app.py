"""The relay: the caller's body and cookies go to the downstream agent; its body, status and cookies come back."""

import aiohttp
import pytest
from starlette.testclient import TestClient

from nemo_gym import config as gym_config
from nemo_gym.client import ServerReply
from nemo_gym.openai_utils import (
    NeMoGymResponseCreateParamsNonStreaming,
    NeMoGymResponseOutputMessage,
    NeMoGymResponseOutputText,
    new_response,
)
from responses_api_agents.legacy_agent.app import LegacyAgent

ROW = {"responses_create_params": {"input": "Add 1, then add 2."}, "initial_count": 0, "expected_count": 3, "note": None}


class Downstream:
    """Stands in for the relay's ServerClient: records each call, answers with a canned reply."""

    def __init__(self, reply: ServerReply | Exception) -> None:
        self.reply = reply
        self.calls: list[dict] = []

    async def post(self, server_name, path, json=None, cookies=None, timeout=None) -> ServerReply:
        self.calls.append({"server": server_name, "path": path, "json": json, "cookies": cookies})
        if isinstance(self.reply, Exception):
            raise self.reply
        return self.reply

    async def close(self) -> None:
        pass


def relay_client(reply: ServerReply | Exception) -> tuple[TestClient, Downstream]:
    data = {
        "legacy_agent": {"responses_api_agents": {"legacy_agent": {"downstream_agent": {"type": "responses_api_agents", "name": "agent"}}}},
        "agent": {"responses_api_agents": {"legacy_agent": {"downstream_agent": {"type": "responses_api_agents", "name": "legacy_agent"}}}},
    }
    server = LegacyAgent("legacy_agent", gym_config.parse(data))
    server.server_client = downstream = Downstream(reply)
    return TestClient(server.build_app()), downstream


def test_run_is_relayed_with_the_callers_body_and_cookies():
    client, downstream = relay_client(ServerReply(200, {"reward": 1.0}, {}, ""))
    client.cookies.set("counter_session", "from-caller")
    reply = client.post("/run", json=ROW)
    assert reply.status_code == 200 and reply.json() == {"reward": 1.0}
    (call,) = downstream.calls
    assert call["server"] == "agent" and call["path"] == "/run"
    assert call["json"] == ROW
    assert call["cookies"]["counter_session"] == "from-caller"


def test_the_downstream_cookies_come_back_to_the_caller():
    cookies = {"counter_session": "minted-by-counter", "agent_session": "minted-by-agent"}
    client, _ = relay_client(ServerReply(200, {"reward": 1.0}, cookies, ""))
    reply = client.post("/run", json=ROW)
    assert reply.cookies["counter_session"] == "minted-by-counter"
    assert reply.cookies["agent_session"] == "minted-by-agent"


DOWNSTREAM_RESPONSE = new_response(
    NeMoGymResponseCreateParamsNonStreaming(input="hi"),
    model="m",
    output=[NeMoGymResponseOutputMessage(content=[NeMoGymResponseOutputText(text="hello")])],
).model_dump(mode="json", by_alias=True, exclude_none=True)


def test_responses_are_relayed_too():
    client, downstream = relay_client(ServerReply(200, DOWNSTREAM_RESPONSE, {"agent_session": "s"}, ""))
    client.cookies.set("agent_session", "s")
    reply = client.post("/v1/responses", json={"input": "hi"})
    assert reply.json() == DOWNSTREAM_RESPONSE
    assert downstream.calls[0]["path"] == "/v1/responses" and downstream.calls[0]["cookies"]["agent_session"] == "s"
    assert reply.cookies["agent_session"] == "s"


def test_a_streaming_request_goes_down_plain_and_comes_back_as_events():
    client, downstream = relay_client(ServerReply(200, DOWNSTREAM_RESPONSE, {}, ""))
    reply = client.post("/v1/responses", json={"input": "hi", "stream": True})
    assert reply.headers["content-type"].startswith("text/event-stream")
    assert "event: response.completed" in reply.text
    assert downstream.calls[0]["json"] == {"input": "hi"}


def test_a_lost_session_downstream_stays_a_410():
    client, _ = relay_client(ServerReply(410, {"detail": "worker gone"}, {}, '{"detail": "worker gone"}'))
    reply = client.post("/run", json=ROW)
    assert reply.status_code == 410 and "worker gone" in reply.json()["detail"]


def test_an_unreachable_downstream_is_a_502_naming_it():
    client, _ = relay_client(aiohttp.ClientConnectionError("connection refused"))
    reply = client.post("/run", json=ROW)
    assert reply.status_code == 502 and reply.json()["detail"].startswith("agent/run is unreachable")


@pytest.mark.parametrize("body", [{}, {"responses_create_params": {"input": "x", "typo": 1}}])
def test_a_malformed_run_is_refused_before_relaying(body):
    client, downstream = relay_client(ServerReply(200, {}, {}, ""))
    assert client.post("/run", json=body).status_code == 422
    assert downstream.calls == []
