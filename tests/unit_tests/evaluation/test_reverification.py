"""Which resources server re-verifies a rollout (upstream's mapping from the agents' resources_server refs), and the
payload it is sent: the materialized input row with the rollout's response."""

from __future__ import annotations

import json

import pytest

from nemo_gym.config import Instance
from nemo_gym.evaluation.reverification import routes_of, verify_payloads


def instance(name: str, server_type: str, **settings) -> Instance:
    return Instance(name, server_type, "impl", {"entrypoint": "app.py", **settings})


def agent(name: str, server: str) -> Instance:
    return instance(name, "responses_api_agents", resources_server={"type": "resources_servers", "name": server})


def row(agent_name: str | None) -> dict:
    return {"_ng_task_index": 0, "_ng_rollout_index": 0, **({"agent_ref": {"name": agent_name}} if agent_name else {})}


def test_each_rollout_goes_to_the_resources_server_its_agent_names():
    routes = routes_of({"a": agent("a", "math"), "b": agent("b", "code"), "math": instance("math", "resources_servers"), "code": instance("code", "resources_servers")})
    assert (routes.server_for(row("a")), routes.server_for(row("b"))) == ("math", "code")
    with pytest.raises(ValueError, match=r"names agent 'c'; the config's agents are \['a', 'b'\]"):
        routes.server_for(row("c"))
    with pytest.raises(ValueError, match="names agent None"):
        routes.server_for(row(None))


def test_rows_naming_no_agent_go_to_the_one_resources_server_all_agents_share():
    routes = routes_of({"a": agent("a", "math"), "b": agent("b", "math")})
    assert routes.server_for(row(None)) == "math"


def test_a_config_without_agents_sends_every_rollout_to_its_one_resources_server_as_upstreams_does():
    routes = routes_of({"math": instance("math", "resources_servers")})
    assert {routes.server_for(row("whoever")), routes.server_for(row(None))} == {"math"}
    with pytest.raises(ValueError, match="no agent names its resources server, and the config has 2 resources servers"):
        routes_of({"math": instance("math", "resources_servers"), "code": instance("code", "resources_servers")})


def test_the_payload_is_the_materialized_input_with_the_rollouts_response(tmp_path):
    (tmp_path / "in.jsonl").write_text(json.dumps({**row("a"), "question": "q", "response": "stale"}) + "\n")
    (tmp_path / "out.jsonl").write_text(json.dumps({**row("a"), "question": "changed", "response": {"id": "r"}, "reward": 0.0}) + "\n")
    assert verify_payloads(tmp_path / "in.jsonl", tmp_path / "out.jsonl") == [{**row("a"), "question": "q", "response": {"id": "r"}}]


def test_a_row_without_its_indices_is_an_error_naming_its_line(tmp_path):
    (tmp_path / "in.jsonl").write_text(json.dumps(row("a")) + "\n" + json.dumps({"question": "q"}) + "\n")
    (tmp_path / "out.jsonl").write_text("")
    with pytest.raises(ValueError, match=r"in.jsonl:2: a row needs _ng_task_index and _ng_rollout_index"):
        verify_payloads(tmp_path / "in.jsonl", tmp_path / "out.jsonl")
