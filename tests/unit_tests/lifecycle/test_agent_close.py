"""An agent's /close_session closes its own session and the session of each resources server whose cookie came with it."""

from __future__ import annotations

from typing import ClassVar

import aiohttp
import pytest
from fastapi import FastAPI

from nemo_gym.base_responses_api_agent import SimpleResponsesAPIAgent
from nemo_gym.config import Instance, free_port
from nemo_gym.lifecycle.registry import EndReason
from tests.unit_tests.in_process_server import serving
from tests.unit_tests.lifecycle.test_lifecycle import HookedServer

pytestmark = pytest.mark.anyio

SECRET = "agent-close-" + "x" * 32


class HookedAgent(SimpleResponsesAPIAgent):
    """Records its hook's calls; ``/ping`` is a request of its session."""

    ends: ClassVar[list[tuple[str, str]]] = []

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/ping")(self.ping)
        return app

    async def ping(self) -> dict[str, str]:
        return {"status": "ok"}

    async def on_session_end(self, session_id: str, reason: EndReason) -> None:
        HookedAgent.ends.append((session_id, str(reason)))


def instances() -> dict[str, Instance]:
    common = {"entrypoint": "app.py", "host": "127.0.0.1", "num_workers": 1, "session_secret": SECRET}
    return {
        "env": Instance("env", "resources_servers", "example_session_state_mgmt", {**common, "port": free_port()}),
        "agent": Instance("agent", "responses_api_agents", "simple_agent", {**common, "port": free_port()}),
    }


async def test_an_agents_close_ends_its_session_and_the_environments_each_once():
    HookedServer.ends.clear()
    HookedAgent.ends.clear()
    config = instances()
    env, agent = HookedServer.for_instance("env", config), HookedAgent.for_instance("agent", config)
    async with (
        serving(env.build_app(), config["env"].settings["port"]) as env_url,
        serving(agent.build_app(), config["agent"].settings["port"]) as agent_url,
        aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http,
    ):
        async with http.post(f"{env_url}/increment") as reply:
            jar = {key: morsel.value for key, morsel in reply.cookies.items()}
        async with http.post(f"{agent_url}/ping") as reply:
            jar.update({key: morsel.value for key, morsel in reply.cookies.items()})
        async with http.post(f"{agent_url}/close_session", cookies=jar) as reply:
            first = await reply.json()
        async with http.post(f"{agent_url}/close_session", cookies=jar) as reply:
            second = await reply.json()
        assert (first["status"], first["resources_servers"]) == ("closed", {"env": "closed"})
        assert (second["status"], second["resources_servers"]) == ("already closed", {"env": "already closed"})
        assert [reason for _, reason, _ in HookedServer.ends] == ["close"] and [reason for _, reason in HookedAgent.ends] == ["close"]
        async with http.post(f"{env_url}/increment", cookies=jar) as reply:
            assert reply.status == 410
        async with http.post(f"{agent_url}/close_session") as reply:
            assert reply.status == 400
