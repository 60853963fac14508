"""nemo_gym.evaluation.benchmarks: the one benchmark dataset of each agent, its prepare script imported from the
working directory or the first search root that has it, and the file it writes checked against the config."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from nemo_gym.config.files import ConfigError
from nemo_gym.evaluation.benchmarks import benchmarks_of, prepare, prepare_function

SCRIPT = """from pathlib import Path


def prepare(**arguments):
    Path({written!r}).write_text(repr(sorted(arguments.items())))
    return {written!r}
"""


def benchmark_config(*datasets: dict) -> dict:
    return {"bench_agent": {"responses_api_agents": {"simple_agent": {"datasets": list(datasets)}}}}


def dataset(name: str = "tiny", script: str | None = "benchmarks/tiny/prepare.py") -> dict:
    return {"name": name, "type": "benchmark", "jsonl_fpath": "benchmarks/tiny/data.jsonl", "prepare_script": script}


def write_script(root: Path, written: str) -> None:
    (root / "benchmarks" / "tiny").mkdir(parents=True)
    (root / "benchmarks" / "tiny" / "prepare.py").write_text(SCRIPT.format(written=written))


def test_each_agents_benchmark_is_found_under_the_first_root_that_has_its_script(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    write_script(second, "unused")
    (found,) = benchmarks_of({**benchmark_config(dataset(), {"name": "ex", "type": "example", "jsonl_fpath": "e.jsonl"}), "policy_base_url": "x"}, [first, second])
    assert (found.agent, found.dataset.name, found.root) == ("bench_agent", "tiny", second.resolve())
    assert found.jsonl_path == second.resolve() / "benchmarks" / "tiny" / "data.jsonl"


def test_more_than_one_benchmark_on_an_agent_or_one_without_a_prepare_script_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="defines one benchmark dataset; found \\['a', 'b'\\]"):
        benchmarks_of(benchmark_config(dataset("a"), dataset("b")), [tmp_path])
    with pytest.raises(ConfigError, match="benchmark dataset 'tiny' has no prepare_script"):
        benchmarks_of(benchmark_config(dataset(script=None)), [tmp_path])


def test_prepare_runs_the_script_with_the_arguments_and_returns_the_datasets_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    written = tmp_path / "benchmarks" / "tiny" / "data.jsonl"
    write_script(tmp_path, str(written))
    (found,) = benchmarks_of(benchmark_config(dataset()), [])
    assert prepare(found, {"split": "test"}) == written
    assert written.read_text() == "[('split', 'test')]"


def test_a_script_that_writes_elsewhere_or_has_no_prepare_or_is_missing_is_an_error_naming_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    write_script(tmp_path, str(tmp_path / "elsewhere.jsonl"))
    (found,) = benchmarks_of(benchmark_config(dataset()), [])
    with pytest.raises(ConfigError, match="the prepare script wrote .*elsewhere.jsonl, which does not match the jsonl_fpath"):
        prepare(found, {})
    found.prepare_script.write_text("x = 1\n")
    with pytest.raises(ConfigError, match="has no prepare function"):
        prepare_function(found)
    found.prepare_script.unlink()
    with pytest.raises(ConfigError, match="no prepare script"):
        prepare_function(found)
