"""nemo_gym.config.catalog: what the search roots offer, by kind, read from the config files alone: one entry per
config flavour, with the first domain and description of its servers; a benchmark with its agent and repeats; a
name found in two roots is the first root's; a file that is no YAML mapping is left out."""

from __future__ import annotations

from pathlib import Path

import yaml

from nemo_gym.config.catalog import catalog, entries_in

COUNTER = {"counter": {"resources_servers": {"counter": {"domain": "games", "description": "counts"}}}}


def write(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def test_a_server_lists_one_entry_per_config_flavour_with_its_domain_and_description(tmp_path):
    write(tmp_path / "resources_servers" / "counter" / "configs" / "counter.yaml", COUNTER)
    write(tmp_path / "resources_servers" / "counter" / "configs" / "fast.yaml", {"fast": {"resources_servers": {"counter": {}}}})
    write(tmp_path / "resources_servers" / "counter" / "configs" / "agent_only.yaml", {"a": {"responses_api_agents": {"simple_agent": {}}}})
    found = catalog("resources-servers", [tmp_path])
    assert sorted(found) == ["counter", "counter/fast"]
    assert found["counter"].to_dict() == {"name": "counter", "domain": "games", "description": "counts"}
    assert found["counter/fast"].to_dict() == {"name": "counter/fast", "domain": None, "description": None}


def test_a_benchmark_names_its_agent_and_repeats_and_an_environment_is_a_config_without_one(tmp_path):
    bench = {"bench_agent": {"responses_api_agents": {"simple_agent": {"datasets": [{"name": "b", "type": "benchmark", "num_repeats": 4}]}}}}
    write(tmp_path / "benchmarks" / "aime" / "config.yaml", bench)
    write(tmp_path / "benchmarks" / "notes.yaml", {"just": "variables"})
    write(tmp_path / "environments" / "math" / "config.yaml", COUNTER)
    write(tmp_path / "environments" / "bench_too.yaml", bench)
    (entry,) = entries_in(tmp_path / "benchmarks", "benchmarks")
    assert entry.to_dict() == {"name": "aime", "domain": None, "description": None, "agent_name": "bench_agent", "num_repeats": 4}
    assert [entry.name for entry in entries_in(tmp_path / "environments", "environments")] == ["math"]


def test_a_name_in_two_roots_is_the_first_roots_and_a_file_that_is_no_mapping_is_left_out(tmp_path):
    user, install = tmp_path / "user", tmp_path / "install"
    write(user / "resources_servers" / "counter" / "configs" / "counter.yaml", COUNTER)
    write(install / "resources_servers" / "counter" / "configs" / "counter.yaml", {"counter": {"resources_servers": {"counter": {"domain": "math"}}}})
    write(install / "resources_servers" / "broken" / "configs" / "broken.yaml", "counter: [unclosed\n")
    write(install / "resources_servers" / "listed" / "configs" / "listed.yaml", "- a list\n")
    found = catalog("resources-servers", [user, install])
    assert list(found) == ["counter"] and found["counter"].domain == "games"
    assert found["counter"].config == user / "resources_servers" / "counter" / "configs" / "counter.yaml"


def test_a_root_without_the_kinds_folder_offers_nothing(tmp_path):
    assert catalog("models", [tmp_path]) == {}
