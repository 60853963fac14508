"""nemo_gym.mcp_auto_exposure: upstream's maybe_auto_expose on a server whose setup_webserver already exposes its tools."""

from __future__ import annotations

import subprocess
import sys

from nemo_gym import config as gym_config
from nemo_gym.mcp_auto_exposure import maybe_auto_expose
from resources_servers.example_session_state_mgmt.app import CounterServer


def counter(**settings) -> CounterServer:
    instances = gym_config.parse({"counter": {"resources_servers": {"example_session_state_mgmt": {"entrypoint": "app.py", "domain": "games", **settings}}}})
    return CounterServer.for_instance("counter", instances)


def test_a_server_that_does_not_opt_in_gets_nothing():
    server = counter()
    assert maybe_auto_expose(server, server.setup_webserver()) is None


def test_an_opted_in_server_gets_its_tools_by_name_once_however_often_it_is_called():
    server = counter(expose_tools_over_mcp=True)
    app = server.setup_webserver()
    tools = maybe_auto_expose(server, app)
    assert sorted(tools) == ["get_counter_value", "increment_counter"]
    assert sorted(maybe_auto_expose(server, app)) == sorted(tools)
    assert [route.path for route in app.router.routes].count("/mcp") == 1


def test_importing_it_does_not_import_the_mcp_sdk():
    code = "import sys, nemo_gym.mcp_auto_exposure; print('mcp' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "False", result.stderr
