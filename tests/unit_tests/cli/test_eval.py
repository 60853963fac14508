"""`gym eval prepare|aggregate|reverify`: upstream's benchmark preparation, shard aggregation and re-verification,
on files in temporary directories and real servers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nemo_gym.cli.main import main
from nemo_gym.config import free_port
from nemo_gym.process.discovery import load
from nemo_gym.process.launcher import Launcher
from nemo_gym.config.paths import search_roots
from tests.unit_tests.cli.answer_stack import AGENT, rollout_row, task_row, write_root


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def gym(*arguments: str) -> subprocess.CompletedProcess:
    """The command line in a fresh interpreter (``python -m nemo_gym.cli.main``, as the `gym` entry point runs it)."""
    return subprocess.run([sys.executable, "-m", "nemo_gym.cli.main", *arguments], capture_output=True, text=True, timeout=240)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    """The answer stack started once, as `gym env start` would run it: (config path, head URL)."""
    root = tmp_path_factory.mktemp("answer_root")
    config = write_root(root)
    with Launcher(load([config], roots=search_roots([root])), free_port()) as launcher:
        yield config, launcher.head_url


SHARDS = {
    "rollouts-chunk1.jsonl": [rollout_row(1, 0, "4", "4", 1.0), rollout_row(0, 1, "2", "3", 0.0)],
    "rollouts-chunk0.jsonl": [rollout_row(0, 0, "2", "2", 1.0), rollout_row(1, 1, "4", "4", 1.0)],
}


def write_shards(directory: Path) -> None:
    for name, rows in SHARDS.items():
        write_jsonl(directory / name, rows)


def test_gym_eval_aggregate_writes_the_per_task_averages_upstreams_does_for_rollout_shards(running, tmp_path, capsys):
    _, head_url = running
    write_shards(tmp_path)
    output = tmp_path / "merged" / "rollouts.jsonl"
    assert main(["eval", "aggregate", "--input-glob", str(tmp_path / "rollouts-chunk*.jsonl"), "--output", str(output), "--head-url", head_url]) == 0
    [entry] = json.loads((tmp_path / "merged" / "rollouts_aggregate_metrics.json").read_text())
    assert entry["agent_ref"] == {"name": AGENT}
    assert [(task["_ng_task_index"], task["mean/reward"]) for task in entry["group_level_metrics"]] == [(0, 0.5), (1, 1.0)]
    assert entry["agent_metrics"]["mean/reward"] == 0.75
    assert entry["key_metrics"]["mean/reward"] == 0.75
    assert "Aggregate metrics:" in capsys.readouterr().out


def test_gym_eval_aggregate_merges_the_shards_into_the_output_ordered_by_task_then_rollout(running, tmp_path):
    _, head_url = running
    write_shards(tmp_path)
    output = tmp_path / "rollouts.jsonl"
    assert main(["eval", "aggregate", "--input-glob", f"{tmp_path}/rollouts-chunk0.jsonl, {tmp_path}/rollouts-chunk*.jsonl", "--output", str(output), "--head-url", head_url]) == 0
    assert [(row["_ng_task_index"], row["_ng_rollout_index"]) for row in read_jsonl(output)] == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_gym_eval_aggregate_with_no_merge_shards_writes_only_the_metrics(running, tmp_path):
    _, head_url = running
    write_shards(tmp_path)
    output = tmp_path / "rollouts.jsonl"
    assert main(["eval", "aggregate", "--input-glob", str(tmp_path / "rollouts-chunk*.jsonl"), "--output", str(output), "--head-url", head_url, "--no-merge-shards"]) == 0
    assert not output.exists() and (tmp_path / "rollouts_aggregate_metrics.json").exists()


def test_gym_eval_aggregate_of_rollouts_naming_an_agent_the_servers_lack_is_an_error_naming_it(running, tmp_path, capsys):
    _, head_url = running
    row = {**rollout_row(0, 0, "2", "2", 1.0), "agent_ref": {"name": "gone_agent"}}
    write_jsonl(tmp_path / "shard.jsonl", [row])
    assert main(["eval", "aggregate", "--input-glob", str(tmp_path / "shard.jsonl"), "--output", str(tmp_path / "out.jsonl"), "--head-url", head_url]) == 2
    assert f"the rollouts name agents ['gone_agent'] that the servers do not have; their agents: ['{AGENT}']" in capsys.readouterr().err


def test_gym_eval_aggregate_counts_rows_naming_no_agent_under_the_configs_only_agent(running, tmp_path):
    _, head_url = running
    rows = [{key: value for key, value in rollout_row(0, n, "2", "2", float(n)).items() if key != "agent_ref"} for n in range(2)]
    write_jsonl(tmp_path / "shard.jsonl", rows)
    assert main(["eval", "aggregate", "--input-glob", str(tmp_path / "shard.jsonl"), "--output", str(tmp_path / "out.jsonl"), "--head-url", head_url]) == 0
    [entry] = json.loads((tmp_path / "out_aggregate_metrics.json").read_text())
    assert (entry["agent_ref"], entry["agent_metrics"]["mean/reward"]) == ({"name": AGENT}, 0.5)


def test_gym_eval_aggregate_with_a_config_starts_its_servers_and_stops_them(tmp_path):
    root = tmp_path / "root"
    config = write_root(root)
    write_shards(tmp_path)
    output = tmp_path / "rollouts.jsonl"
    done = gym("eval", "aggregate", "--config", str(config), "--search-dir", str(root), "--input-glob", str(tmp_path / "rollouts-chunk*.jsonl"), "--output", str(output))
    assert done.returncode == 0, done.stderr
    [entry] = json.loads((tmp_path / "rollouts_aggregate_metrics.json").read_text())
    assert entry["agent_metrics"]["mean/reward"] == 0.75


def test_gym_eval_aggregate_with_no_file_matching_the_glob_is_a_clear_error(tmp_path, capsys):
    assert main(["eval", "aggregate", "--input-glob", str(tmp_path / "none*.jsonl"), "--output", str(tmp_path / "out.jsonl")]) == 2
    assert f"no shards matched input_glob={str(tmp_path / 'none*.jsonl')!r}" in capsys.readouterr().err


def test_gym_eval_aggregate_names_the_file_and_line_of_a_malformed_shard(tmp_path, capsys):
    (tmp_path / "bad.jsonl").write_text('{"reward": 1}\n{not json\n')
    assert main(["eval", "aggregate", "--input-glob", str(tmp_path / "bad.jsonl"), "--output", str(tmp_path / "out.jsonl")]) == 2
    assert f"{tmp_path / 'bad.jsonl'}:2: not valid JSON" in capsys.readouterr().err


def reverify_files(directory: Path) -> tuple[Path, Path]:
    """Materialized inputs and rollouts whose stored rewards are stale (all 0.0); the responses say 2, 5, 4."""
    inputs = [task_row(0, 0, "2"), task_row(0, 1, "2"), task_row(1, 0, "4")]
    rollouts = [rollout_row(0, 0, "2", "2", 0.0), rollout_row(0, 1, "2", "5", 0.0), rollout_row(1, 0, "4", "4", 0.0)]
    return write_jsonl(directory / "inputs.jsonl", inputs), write_jsonl(directory / "rollouts.jsonl", rollouts)


def test_gym_eval_reverify_recomputes_each_rollouts_reward_with_the_resources_servers_verify(running, tmp_path):
    _, head_url = running
    inputs, rollouts = reverify_files(tmp_path)
    output = tmp_path / "reverified.jsonl"
    assert main(["eval", "reverify", "--inputs", str(inputs), "--rollouts", str(rollouts), "--output", str(output), "--head-url", head_url]) == 0
    rows = sorted(read_jsonl(output), key=lambda row: (row["_ng_task_index"], row["_ng_rollout_index"]))
    assert [(row["_ng_task_index"], row["_ng_rollout_index"], row["reward"]) for row in rows] == [(0, 0, 1.0), (0, 1, 0.0), (1, 0, 1.0)]
    assert all(row["agent_ref"]["name"] == AGENT for row in rows)
    [entry] = json.loads((tmp_path / "reverified_aggregate_metrics.json").read_text())
    assert entry["agent_metrics"]["mean/reward"] == pytest.approx(2 / 3)


def test_gym_eval_reverify_limit_and_disable_aggregation(running, tmp_path):
    _, head_url = running
    inputs, rollouts = reverify_files(tmp_path)
    output = tmp_path / "reverified.jsonl"
    arguments = ["--inputs", str(inputs), "--rollouts", str(rollouts), "--output", str(output), "--head-url", head_url]
    assert main(["eval", "reverify", *arguments, "--limit", "2", "--disable-aggregation"]) == 0
    assert len(read_jsonl(output)) == 2
    assert not (tmp_path / "reverified_aggregate_metrics.json").exists()


def test_gym_eval_reverify_refuses_an_existing_output_unless_overwrite(running, tmp_path, capsys):
    _, head_url = running
    inputs, rollouts = reverify_files(tmp_path)
    output = tmp_path / "reverified.jsonl"
    output.write_text("keep me\n")
    arguments = ["eval", "reverify", "--inputs", str(inputs), "--rollouts", str(rollouts), "--output", str(output), "--head-url", head_url]
    assert main(arguments) == 2
    assert f"output file already exists: '{output}'" in capsys.readouterr().err
    assert output.read_text() == "keep me\n"
    assert main([*arguments, "--overwrite"]) == 0
    assert len(read_jsonl(output)) == 3


def test_gym_eval_reverify_resume_re_verifies_only_the_rollouts_the_output_lacks(running, tmp_path, capsys):
    _, head_url = running
    inputs, rollouts = reverify_files(tmp_path)
    output = tmp_path / "reverified.jsonl"
    arguments = ["eval", "reverify", "--inputs", str(inputs), "--rollouts", str(rollouts), "--output", str(output), "--head-url", head_url]
    assert main([*arguments, "--limit", "2"]) == 0
    capsys.readouterr()
    assert main([*arguments, "--resume"]) == 0
    assert "Resuming: 2 rollout(s) already in" in capsys.readouterr().out
    assert sorted((row["_ng_task_index"], row["_ng_rollout_index"]) for row in read_jsonl(output)) == [(0, 0), (0, 1), (1, 0)]
    [entry] = json.loads((tmp_path / "reverified_aggregate_metrics.json").read_text())
    assert entry["agent_metrics"]["mean/reward"] == pytest.approx(2 / 3)


def test_gym_eval_reverify_names_a_rollout_without_its_materialized_input(tmp_path, capsys):
    inputs, rollouts = reverify_files(tmp_path)
    write_jsonl(inputs, [task_row(0, 0, "2")])
    assert main(["eval", "reverify", "--inputs", str(inputs), "--rollouts", str(rollouts), "--output", str(tmp_path / "o.jsonl")]) == 2
    assert "no materialized input row for the rollout of task 0, rollout 1" in capsys.readouterr().err


def test_gym_eval_reverify_refuses_a_server_that_is_not_stateless_unless_forced_then_writes_unsafe_files(tmp_path):
    root = tmp_path / "root"
    config = write_root(root, mode="UNKNOWN")
    inputs, rollouts = reverify_files(tmp_path)
    output = tmp_path / "reverified.jsonl"
    arguments = ["eval", "reverify", "--config", str(config), "--search-dir", str(root), "--inputs", str(inputs), "--rollouts", str(rollouts), "--output", str(output)]
    refused = gym(*arguments)
    assert refused.returncode == 2
    assert "resources server(s) ['answer_match'] have reverify_mode unknown or unsupported" in refused.stderr
    assert not output.exists()
    forced = gym(*arguments, "--force")
    assert forced.returncode == 0, forced.stderr
    assert len(read_jsonl(tmp_path / "unsafe_reverified.jsonl")) == 3
    assert (tmp_path / "unsafe_reverified_aggregate_metrics.json").exists()


def write_benchmark(root: Path, returns: str = "DATA") -> Path:
    """``root/benchmarks/toy``: a config whose agent declares a benchmark dataset, and a prepare.py that writes it."""
    directory = root / "benchmarks" / "toy"
    directory.mkdir(parents=True)
    (directory / "prepare.py").write_text(
        "from pathlib import Path\n"
        "DATA = Path(__file__).parent / 'data' / 'toy_benchmark.jsonl'\n"
        "def prepare(rows=2):\n"
        "    DATA.parent.mkdir(exist_ok=True)\n"
        "    DATA.write_text(''.join('{\"responses_create_params\": {\"input\": \"q%d\"}}\\n' % n for n in range(rows)))\n"
        f"    return {returns}\n"
    )
    dataset = {"name": "toy", "type": "benchmark", "jsonl_fpath": "benchmarks/toy/data/toy_benchmark.jsonl", "prepare_script": "benchmarks/toy/prepare.py", "num_repeats": 4}
    config = {"toy_agent": {"responses_api_agents": {"simple_agent": {"entrypoint": "app.py", "datasets": [dataset]}}}}
    (directory / "config.yaml").write_text(yaml.safe_dump(config))
    return directory


def test_gym_eval_prepare_runs_each_benchmarks_prepare_script_and_says_where_the_data_is(tmp_path, monkeypatch, capsys):
    directory = write_benchmark(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(["eval", "prepare", "--benchmark", "toy"]) == 0
    assert len(read_jsonl(directory / "data" / "toy_benchmark.jsonl")) == 2
    assert f"Benchmark data prepared at: {directory / 'data' / 'toy_benchmark.jsonl'}" in capsys.readouterr().out


def test_gym_eval_prepare_takes_a_config_file_and_the_search_dir_from_elsewhere(tmp_path, capsys):
    directory = write_benchmark(tmp_path / "root")
    assert main(["eval", "prepare", "--config", str(directory / "config.yaml"), "--search-dir", str(tmp_path / "root"), "+prepare_script_args.rows=3"]) == 0
    assert len(read_jsonl(directory / "data" / "toy_benchmark.jsonl")) == 3


def test_gym_eval_prepare_with_use_cached_skips_a_benchmark_already_prepared(tmp_path, monkeypatch, capsys):
    directory = write_benchmark(tmp_path)
    (directory / "data").mkdir()
    (directory / "data" / "toy_benchmark.jsonl").write_text("kept\n")
    monkeypatch.chdir(tmp_path)
    assert main(["eval", "prepare", "--benchmark", "toy", "--use-cached"]) == 0
    assert (directory / "data" / "toy_benchmark.jsonl").read_text() == "kept\n"
    assert "already been prepared" in capsys.readouterr().out


def test_gym_eval_prepare_refuses_a_prepare_script_that_writes_elsewhere(tmp_path, monkeypatch, capsys):
    write_benchmark(tmp_path, returns="DATA.with_name('other.jsonl')")
    monkeypatch.chdir(tmp_path)
    assert main(["eval", "prepare", "--benchmark", "toy"]) == 2
    assert "does not match the jsonl_fpath of the config" in capsys.readouterr().err


def test_gym_eval_prepare_without_a_benchmark_dataset_or_with_an_unknown_benchmark_is_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plain.yaml").write_text(yaml.safe_dump({"a": {"responses_api_agents": {"simple_agent": {"entrypoint": "app.py"}}}}))
    assert main(["eval", "prepare", "--config", "plain.yaml"]) == 2
    assert "no benchmark config found" in capsys.readouterr().err
    assert main(["eval", "prepare", "--benchmark", "nope"]) == 2
    assert "--benchmark nope: no benchmarks/nope/config.yaml" in capsys.readouterr().err


def test_upstreams_ng_aggregate_rollouts_and_ng_prepare_benchmark_invocations_run_unchanged(running, tmp_path, monkeypatch):
    from nemo_gym.cli import aliases

    _, head_url = running
    write_shards(tmp_path)
    monkeypatch.setattr(sys, "argv", ["ng_aggregate_rollouts", f"+input_glob={tmp_path}/rollouts-chunk*.jsonl", f"+output_jsonl_fpath={tmp_path}/all.jsonl", "+merge_shards=false", "--head-url", head_url])
    assert aliases.main() == 0
    assert not (tmp_path / "all.jsonl").exists()
    [entry] = json.loads((tmp_path / "all_aggregate_metrics.json").read_text())
    assert entry["agent_metrics"]["mean/reward"] == 0.75
    directory = write_benchmark(tmp_path / "root")
    monkeypatch.chdir(tmp_path / "root")
    monkeypatch.setattr(sys, "argv", ["ng_prepare_benchmark", "+config_paths=[benchmarks/toy/config.yaml]", "+prepare_script_args.rows=5"])
    assert aliases.main() == 0
    assert len(read_jsonl(directory / "data" / "toy_benchmark.jsonl")) == 5


def profile_files(directory: Path) -> tuple[Path, Path]:
    """Two tasks of two rollouts each; task 1's second rollout never finished."""
    inputs = [task_row(0, 0, "2"), task_row(0, 1, "2"), task_row(1, 0, "4"), task_row(1, 1, "4")]
    rollouts = [rollout_row(0, 1, "2", "3", 0.0), rollout_row(0, 0, "2", "2", 1.0), rollout_row(1, 0, "4", "4", 1.0)]
    return write_jsonl(directory / "inputs.jsonl", inputs), write_jsonl(directory / "rollouts.jsonl", rollouts)


def test_gym_eval_profile_writes_per_task_and_per_agent_reward_statistics_beside_the_rollouts(tmp_path, capsys):
    inputs, rollouts = profile_files(tmp_path)
    assert main(["eval", "profile", "--inputs", str(inputs), "--rollouts", str(rollouts), "--allow-partial-rollouts"]) == 0
    tasks = read_jsonl(tmp_path / "rollouts_reward_profiling.jsonl")
    assert [(t["_ng_task_index"], t["mean/reward"], t["num_rollouts"], t["expected_num_rollouts"], t["missing_num_rollouts"]) for t in tasks] == [(0, 0.5, 2, 2, 0), (1, 1.0, 1, 2, 1)]
    assert tasks[0]["sample"]["expected_answer"] == "2" and "_ng_task_index" not in tasks[0]["sample"]
    assert [info["rollout_id"] for info in tasks[0]["rollout_infos"]] == ["0:0", "0:1"]
    assert tasks[0]["rollout_infos"][0]["reward"] == 1.0 and tasks[0]["rollout_infos"][0]["output_tokens"] == 1
    [agent] = json.loads((tmp_path / "rollouts_agent_metrics.json").read_text())
    assert agent["agent_ref"] == {"name": AGENT} and agent["mean/reward"] == pytest.approx(2 / 3)
    out = capsys.readouterr().out
    assert "Reward profile completion: 3/4 rollout rows (75.00%)" in out
    assert "Input rows: 2 total; 1 complete; 1 partial; 0 without rollouts dropped from output." in out


def test_gym_eval_profile_of_a_partial_collection_needs_allow_partial_rollouts(tmp_path, capsys):
    inputs, rollouts = profile_files(tmp_path)
    assert main(["eval", "profile", "--inputs", str(inputs), "--rollouts", str(rollouts)]) == 2
    assert "1 materialized input rows have no rollout; their (task, rollout) keys: [(1, 1)]" in capsys.readouterr().err
    assert main(["eval", "profile", "--inputs", str(tmp_path / "none.jsonl"), "--rollouts", str(rollouts)]) == 2
    assert f"input file not found: '{tmp_path / 'none.jsonl'}' (--inputs)" in capsys.readouterr().err


def test_upstreams_ng_reward_profile_invocation_runs_unchanged(tmp_path, monkeypatch):
    from nemo_gym.cli import aliases

    inputs, rollouts = profile_files(tmp_path)
    monkeypatch.setattr(sys, "argv", ["ng_reward_profile", f"+materialized_inputs_jsonl_fpath={inputs}", f"+rollouts_jsonl_fpath={rollouts}", "++allow_partial_rollouts=True"])
    assert aliases.main() == 0
    assert len(read_jsonl(tmp_path / "rollouts_reward_profiling.jsonl")) == 2
