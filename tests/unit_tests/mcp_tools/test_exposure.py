"""MCP exposure (nemo_gym.mcp_tools.exposure): a server whose config sets ``expose_tools_over_mcp`` has
``/mcp``, one without it has none and never loads the ``mcp`` SDK; every name of the package still imports."""

from __future__ import annotations

import importlib

import pytest

import nemo_gym.mcp_tools
from nemo_gym.sessions.token import TOKEN_HEADER
from tests.unit_tests.fresh_worker import holds, worker_imports
from tests.unit_tests.mcp_tools.mcp_servers import NAME, http_client, make_server, serving

COUNTER = ("counter", "resources_servers", "example_session_state_mgmt")


@pytest.mark.parametrize("num_workers", [1, 4])
def test_a_server_that_exposes_no_tools_never_imports_mcp(num_workers):
    built = worker_imports(*COUNTER, {"num_workers": num_workers})

    assert "/verify" in built["paths"] and "/mcp" not in built["paths"]
    assert not holds(built["modules"], "mcp")


def test_a_server_that_exposes_tools_imports_mcp_and_mounts_its_endpoint():
    built = worker_imports(*COUNTER, {"num_workers": 4, "expose_tools_over_mcp": True})

    assert "/mcp" in built["paths"]
    assert holds(built["modules"], "mcp")


@pytest.mark.parametrize("name", nemo_gym.mcp_tools.__all__)
def test_every_name_of_the_package_imports_from_it_and_is_its_modules_own(name):
    value = getattr(importlib.import_module("nemo_gym.mcp_tools"), name)

    home = getattr(value, "__module__", None)
    if home is not None and home.startswith("nemo_gym.mcp_tools."):
        assert getattr(importlib.import_module(home), name) is value
    assert name in dir(nemo_gym.mcp_tools)


def test_a_name_the_package_does_not_have_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'McpNothing'"):
        nemo_gym.mcp_tools.McpNothing


@pytest.mark.anyio
async def test_a_server_without_the_setting_has_no_mcp_endpoint_and_plain_seed_replies():
    server = make_server(expose_tools_over_mcp=False)
    async with serving(server), http_client(server) as client:
        reply = await client.post(NAME, "/seed_session", json={})
        mcp = await client.post(NAME, "/mcp", json={})

    assert reply.status == 200 and "mcp" not in reply.body
    assert mcp.status == 404



def test_upstreams_mcp_names_are_the_seed_session_key_and_the_token_header():
    from nemo_gym.base_resources_server import NEMO_GYM_MCP_METADATA_KEY, NEMO_GYM_MCP_SESSION_TOKEN_HEADER

    assert (NEMO_GYM_MCP_METADATA_KEY, NEMO_GYM_MCP_SESSION_TOKEN_HEADER) == ("mcp", TOKEN_HEADER)
