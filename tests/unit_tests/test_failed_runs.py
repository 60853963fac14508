"""tests/failed_runs.py: the logs of a failed test's servers are kept, and only then."""

from __future__ import annotations

from types import SimpleNamespace

from tests import failed_runs


def copy_log(folder):
    (folder / "counter.log").write_text("served")


def test_nothing_is_kept_when_no_test_failed_since_the_count(monkeypatch, tmp_path):
    monkeypatch.setattr(failed_runs, "FAILED_RUNS_DIR", tmp_path / "kept")
    failed_runs.keep_if_failed(SimpleNamespace(testsfailed=2), 2, "nemo_gym_run_x", copy_log)
    assert not (tmp_path / "kept").exists()


def test_a_failure_since_the_count_keeps_the_logs_in_a_new_folder_and_prints_it(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(failed_runs, "FAILED_RUNS_DIR", tmp_path / "kept")
    for _ in range(2):
        failed_runs.keep_if_failed(SimpleNamespace(testsfailed=3), 2, "nemo_gym_run_x", copy_log)
    folders = sorted((tmp_path / "kept").iterdir())
    assert len(folders) == 2 and all(folder.name.startswith("nemo_gym_run_x_") and (folder / "counter.log").read_text() == "served" for folder in folders)
    assert capsys.readouterr().out.count("logs of the servers of a failed test kept in") == 2
