"""Upstream's config directives: ``_inherit_from``, ``_copy``, ``_delete_key`` and the ``${inherit_from:...}``/``${copy:...}`` forms."""

from __future__ import annotations

from pathlib import Path

import pytest

from nemo_gym import config as gym_config
from nemo_gym.config import ConfigError
from nemo_gym.process import discovery

IMPL = "example_session_state_mgmt"
SETTINGS = f"counter.resources_servers.{IMPL}"
COUNTER = f"""
counter:
  resources_servers:
    {IMPL}:
      entrypoint: app.py
      num_workers: 2
      domain: games
      description: the generic counter
"""


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def load(tmp_path: Path, text: str, overrides: list[str] = ()) -> dict[str, gym_config.Instance]:
    return discovery.load([write(tmp_path / "bench.yaml", text)], overrides=overrides, roots=[gym_config.REPO_ROOT])


def resolve(tmp_path: Path, text: str) -> dict:
    return gym_config.resolve([write(tmp_path / "vars.yaml", text)], roots=[tmp_path])[0]


def config_error(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as error:
        load(tmp_path, text)
    return str(error.value)


def test_inherit_from_moves_the_source_block_and_local_keys_win(tmp_path):
    instances = load(tmp_path, COUNTER + f"bench:\n  _inherit_from: counter\n  resources_servers:\n    {IMPL}:\n      num_workers: 3\n")
    assert set(instances) == {"bench"}
    settings = instances["bench"].settings
    assert (settings["num_workers"], settings["domain"], settings["description"]) == (3, "games", "the generic counter")
    assert "_inherit_from" not in settings


def test_a_block_that_only_inherits_is_the_source_instance_under_the_new_name(tmp_path):
    instances = load(tmp_path, COUNTER + "bench:\n  _inherit_from: counter\n")
    assert set(instances) == {"bench"}
    assert instances["bench"].num_workers == 2


def test_copy_keeps_the_source_block(tmp_path):
    instances = load(tmp_path, COUNTER + f"bench:\n  _copy: counter\n  resources_servers:\n    {IMPL}:\n      num_workers: 3\n")
    assert set(instances) == {"counter", "bench"}
    assert (instances["counter"].num_workers, instances["bench"].num_workers) == (2, 3)
    assert instances["bench"].settings["domain"] == "games"


def test_delete_key_removes_the_listed_keys_inherited_and_local(tmp_path):
    text = COUNTER + f"bench:\n  _inherit_from: counter\n  resources_servers:\n    {IMPL}:\n      _delete_key: 'description, value'\n      value: local\n"
    settings = load(tmp_path, text)["bench"].settings
    assert "description" not in settings and "value" not in settings and "_delete_key" not in settings
    assert settings["domain"] == "games"


def test_the_inherit_from_interpolation_form_moves_the_block(tmp_path):
    instances = load(tmp_path, COUNTER + "bench: ${inherit_from:counter}\n")
    assert set(instances) == {"bench"}
    assert instances["bench"].settings["description"] == "the generic counter"


def test_the_copy_interpolation_form_keeps_the_source(tmp_path):
    instances = load(tmp_path, COUNTER + "bench: ${copy:counter}\n")
    assert set(instances) == {"counter", "bench"}


def test_a_directive_in_a_nested_block_takes_a_dotted_path(tmp_path):
    data = resolve(
        tmp_path,
        """
defaults: {judge: {model: big, temperature: 1.0, seed: 7}}
bench:
  judge_settings:
    _copy: defaults.judge
    _delete_key: seed
    temperature: 0.5
  rows:
    - {name: first, judge: '${copy:defaults.judge}'}
""",
    )
    assert data["bench"]["judge_settings"] == {"model": "big", "temperature": 0.5}
    assert data["bench"]["rows"][0]["judge"] == {"model": "big", "temperature": 1.0, "seed": 7}
    assert data["defaults"] == {"judge": {"model": "big", "temperature": 1.0, "seed": 7}}


def test_a_block_may_inherit_a_block_that_inherits(tmp_path):
    data = resolve(tmp_path, "c: {x: c, y: c, z: c}\nb: {_inherit_from: c, y: b, z: b}\na: {_inherit_from: b, z: a}\n")
    assert data == {"a": {"x": "c", "y": "b", "z": "a"}}


def test_an_inherited_key_keeps_the_file_that_set_it_in_errors(tmp_path):
    base = write(tmp_path / "base.yaml", COUNTER.replace("num_workers: 2", "num_workers: 0"))
    top = write(tmp_path / "top.yaml", f"config_paths: [{base}]\nbench:\n  _inherit_from: counter\n")
    with pytest.raises(ConfigError) as error:
        discovery.load([top], roots=[gym_config.REPO_ROOT])
    assert str(error.value).startswith(f"{base}: bench.resources_servers.{IMPL}.num_workers:")


def test_a_source_path_that_does_not_exist_is_an_error_naming_the_file_the_key_and_the_nearest_name(tmp_path):
    message = config_error(tmp_path, COUNTER + "bench:\n  _inherit_from: countr\n")
    assert message.startswith(f"{tmp_path / 'bench.yaml'}: bench._inherit_from: no key 'countr' in the config")
    assert "did you mean 'counter'" in message


def test_a_source_path_that_does_not_exist_in_the_interpolation_form_is_an_error_naming_the_file_and_the_key(tmp_path):
    message = config_error(tmp_path, COUNTER + f"bench: ${{copy:counter.resources_servers.no_such}}\n")
    assert message.startswith(f"{tmp_path / 'bench.yaml'}: bench: no key 'counter.resources_servers.no_such' in the config")


def test_a_cycle_is_an_error_naming_the_file_the_key_and_the_chain(tmp_path):
    message = config_error(tmp_path, "a:\n  _inherit_from: b\n  x: 1\nb:\n  _inherit_from: a\n  y: 2\n")
    assert message.startswith(f"{tmp_path / 'bench.yaml'}: a._inherit_from: ")
    assert "a -> b -> a" in message


def test_a_block_that_inherits_from_its_own_parent_is_an_error(tmp_path):
    message = config_error(tmp_path, "a:\n  b:\n    _copy: a\n")
    assert message.startswith(f"{tmp_path / 'bench.yaml'}: a.b._copy: ")
    assert "itself" in message


def test_a_typod_directive_is_an_error_naming_the_file_and_the_key_and_suggesting_the_directive(tmp_path):
    message = config_error(tmp_path, COUNTER + "bench:\n  _inherit_form: counter\n")
    assert message == f"{tmp_path / 'bench.yaml'}: bench._inherit_form: unknown directive; did you mean '_inherit_from'?"


def test_a_typod_interpolation_directive_is_an_error_naming_the_file_and_the_key(tmp_path):
    message = config_error(tmp_path, COUNTER + "bench: ${inherit_form:counter}\n")
    assert message.startswith(f"{tmp_path / 'bench.yaml'}: bench: ")
    assert "inherit_form" in message


def test_delete_key_naming_a_key_the_block_lacks_is_an_error_naming_the_file_and_the_key(tmp_path):
    message = config_error(tmp_path, COUNTER + f"bench:\n  _inherit_from: counter\n  resources_servers:\n    {IMPL}:\n      _delete_key: descripton\n")
    assert message.startswith(f"{tmp_path / 'bench.yaml'}: bench.resources_servers.{IMPL}._delete_key: ")
    assert "'descripton'" in message


@pytest.mark.parametrize(
    "block, complaint",
    [
        ("{_inherit_from: [counter]}", "a dotted key path"),
        ("{_inherit_from: counter, _copy: counter}", "only one of"),
        ("{_copy: counter, _delete_key: 3}", "comma-separated"),
    ],
)
def test_a_malformed_directive_is_an_error_naming_the_file_and_the_block(tmp_path, block, complaint):
    message = config_error(tmp_path, COUNTER + f"bench: {block}\n")
    assert message.startswith(f"{tmp_path / 'bench.yaml'}: bench.")
    assert complaint in message


def test_a_directive_at_the_top_level_is_an_error(tmp_path):
    message = config_error(tmp_path, COUNTER + "_inherit_from: counter\n")
    assert message.startswith(f"{tmp_path / 'bench.yaml'}: _inherit_from: ")
    assert "inside a block" in message


def test_a_command_line_override_of_the_source_reaches_the_block_that_inherits_it(tmp_path):
    text = COUNTER + f"bench:\n  _inherit_from: counter\n  resources_servers:\n    {IMPL}:\n      description: bench\n"
    overrides = [f"{SETTINGS}.num_workers=4", f"{SETTINGS}.description=from-the-command-line"]
    settings = load(tmp_path, text, overrides)["bench"].settings
    assert (settings["num_workers"], settings["description"]) == (4, "bench")


def test_a_command_line_override_may_add_an_inherit_from(tmp_path):
    instances = load(tmp_path, COUNTER, ["++bench._inherit_from=counter", f"++bench.resources_servers.{IMPL}.num_workers=3"])
    assert set(instances) == {"bench"}
    assert instances["bench"].num_workers == 3


def test_interpolations_resolve_after_the_directives_and_a_deleted_required_value_is_not_reported(tmp_path):
    data = resolve(
        tmp_path,
        "name: resolved\nbase: {label: '${name}', token: '???', here: '${.label}'}\nbench: {_inherit_from: base, _delete_key: token}\n",
    )
    assert data == {"name": "resolved", "bench": {"label": "resolved", "here": "resolved"}}


def test_an_interpolation_into_a_moved_block_is_an_error_naming_the_file_and_the_key(tmp_path):
    with pytest.raises(ConfigError) as error:
        resolve(tmp_path, "base: {label: x}\nbench: {_inherit_from: base}\nother: '${base.label}'\n")
    assert str(error.value).startswith(f"{tmp_path / 'vars.yaml'}: other: ")
