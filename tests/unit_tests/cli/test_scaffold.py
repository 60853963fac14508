"""nemo_gym.cli.scaffold: ``gym env init NAME`` writes a resources server that loads, with example data its
own checks pass; an existing directory, or a name that cannot be a module, is refused."""

from __future__ import annotations

import ast
import re

import pytest

from nemo_gym.cli.env import check_example_data
from nemo_gym.cli.main import main
from nemo_gym.cli.scaffold import example_rows, scaffold
from nemo_gym.config.paths import search_roots
from nemo_gym.process.discovery import load


def test_env_init_writes_an_app_a_config_example_data_tests_and_a_readme(tmp_path, capsys):
    assert main(["env", "init", "demo_env", "--dir", str(tmp_path)]) == 0
    directory = tmp_path / "resources_servers" / "demo_env"
    for relative in ("app.py", "configs/demo_env.yaml", "data/example.jsonl", "tests/test_app.py", "README.md"):
        assert (directory / relative).is_file(), relative
    assert "class DemoEnvServer(SimpleResourcesServer):" in (directory / "app.py").read_text()
    assert check_example_data(directory) == 0
    instances = load([directory / "configs" / "demo_env.yaml"], check_ports=False, roots=search_roots([tmp_path]))
    assert instances["demo_env"].directory == directory
    assert instances["demo_env"].settings["domain"] == "other"


def test_env_init_refuses_an_existing_directory_and_a_name_that_cannot_be_a_module(tmp_path, capsys):
    (tmp_path / "resources_servers" / "taken").mkdir(parents=True)
    assert main(["env", "init", "taken", "--dir", str(tmp_path)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["env", "init", "Bad-Name", "--dir", str(tmp_path)]) == 2
    assert "'Bad-Name' is not a server name" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["class", "9lives", "_private", "with space", "dash-ed", ""])
def test_a_keyword_or_a_name_that_is_no_lower_case_identifier_is_refused(name, tmp_path):
    with pytest.raises(ValueError, match="is not a server name"):
        scaffold(name, tmp_path)
    assert not (tmp_path / "resources_servers").exists()


def test_the_example_tasks_expect_the_count_their_steps_add_up_to_and_the_app_is_python(tmp_path):
    for row in example_rows():
        text = row["responses_create_params"]["input"][0]["content"]
        amounts = [int(amount) for amount in re.findall(r"[Aa]dd (-?\d+)", text)]
        assert row["expected_count"] == row["initial_count"] + sum(amounts) and amounts
    directory = scaffold("tally", tmp_path)
    for path in directory.rglob("*.py"):
        ast.parse(path.read_text(), str(path))
