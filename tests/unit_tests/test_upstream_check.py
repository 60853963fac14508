"""scripts/upstream_check.py: its parsing of pytest's summary, its causes, its placeholder filling, and a
run on a tiny fake upstream checkout made here (never the real snapshot)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from nemo_gym.config import REPO_ROOT
from scripts import upstream_check as check


def test_the_closing_line_of_pytest_gives_passed_failed_and_errors():
    output = "....F.E\n=== short test summary info ===\nFAILED t.py::x - x\n3 passed, 1 failed, 2 errors, 1 skipped in 0.52s\n"
    assert check.parse_pytest_summary(output) == {"passed": 3, "failed": 1, "errors": 2, "skipped": 1}
    assert check.parse_pytest_summary("1 error in 0.10s") == {"errors": 1}
    assert check.parse_pytest_summary("no tests ran in 0.01s") == {}


def test_a_missing_module_or_name_is_one_cause_whatever_the_message_around_it():
    assert check.classify("ModuleNotFoundError: No module named 'nemo_gym.skills'") == "missing module nemo_gym.skills"
    assert check.classify("cannot load ...: ModuleNotFoundError(\"No module named 'ray'\")") == "missing module ray"
    message = "ImportError: cannot import name 'CaptureStore' from 'nemo_gym.base_responses_api_model' (/x/y.py)"
    assert check.classify(message) == "missing name nemo_gym.base_responses_api_model.CaptureStore"
    assert check.classify("ValueError: bad\n   value at 0x7f00ab") == "ValueError: bad value at 0x…"


def test_failure_messages_come_from_the_short_summary_and_collection_errors():
    output = textwrap.dedent("""\
        E   ModuleNotFoundError: No module named 'psutil'
        FAILED tests/test_app.py::test_one - AssertionError: assert 1 == 2
        ERROR tests/test_other.py - ImportError: cannot import name 'X' from 'nemo_gym.y'
        """)
    assert [check.classify(message) for message in check.failure_messages(output)] == [
        "missing module psutil", "AssertionError: assert 1 == 2", "missing name nemo_gym.y.X"]


def test_pytests_shortened_copies_of_a_cause_are_that_cause():
    result = check.Result("resources_servers/x")
    for cause in ("ConnectionErr...", "ConnectionError: Couldn't reach the Hub", "Conne...", "...", "other"):
        result.add_cause(cause)
    assert result.causes == ["ConnectionError: Couldn't reach the Hub", "other"]


def test_placeholders_are_filled_as_a_users_env_yaml_would():
    error = textwrap.dedent("""\
        gym: error: 3 config values cannot be resolved:
        a.yaml: m.responses_api_models.openai_model.openai_base_url: Interpolation key 'judge_base_url' not found
        a.yaml: m.responses_api_models.openai_model.openai_api_key: Interpolation key 'judge_api_key' not found
        a.yaml: a.responses_api_agents.simple_agent.resources_server.name: required value (???) is not set; set it ...
        """)
    overrides, instances, environment = check.fill_placeholders(error)
    assert overrides == [f"++judge_base_url={check.STAND_IN_URL}", "++judge_api_key=stand-in",
                         f"++a.responses_api_agents.simple_agent.resources_server.name={check.STAND_IN_SERVER}"]
    assert instances == environment == {}
    refs = "gym: error: a.yaml: x.resources_servers.y.judge_model_server: refers to instance 'judge', which the config does not define"
    assert check.fill_placeholders(refs)[1] == {"judge": check.MODEL_STAND_IN}
    refs = "gym: error: a.yaml: x.responses_api_agents.y.resources_server: refers to instance 'r', which the config does not define"
    assert check.fill_placeholders(refs)[1] == {"r": check.RESOURCES_STAND_IN}
    missing = "gym: error: a.yaml: g.resources_servers.google_search.google_api_key: Field required"
    assert check.fill_placeholders(missing)[0] == ["++g.resources_servers.google_search.google_api_key=stand-in"]
    refs = textwrap.dedent("""\
        gym: error: 2 config values cannot be resolved:
        a.yaml: g.responses_api_agents.gymnasium_agent.resources_server: Field required
        a.yaml: g.responses_api_agents.gymnasium_agent.judge_model_server: Field required
        """)
    assert check.fill_placeholders(refs)[0] == [
        "++g.responses_api_agents.gymnasium_agent.resources_server.type=resources_servers",
        f"++g.responses_api_agents.gymnasium_agent.resources_server.name={check.STAND_IN_SERVER}",
        "++g.responses_api_agents.gymnasium_agent.judge_model_server.type=responses_api_models",
        "++g.responses_api_agents.gymnasium_agent.judge_model_server.name=policy_model"]
    copied = "gym: error: a.yaml: simulator_model._copy: no key 'policy_model' in the config; did you mean 'policy_model_name'?"
    assert check.fill_placeholders(copied)[1] == {"policy_model": check.MODEL_STAND_IN}
    unset = """KeyError raised while resolving interpolation: "Environment variable 'BBQ_JUDGE_BASE_URL' not found\""""
    assert check.fill_placeholders(unset)[2] == {"BBQ_JUDGE_BASE_URL": check.STAND_IN_URL}


def test_variables_a_config_leaves_to_env_yaml_are_its_null_top_level_keys_and_null_selects(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("a:\n  resources_servers:\n    x:\n      key: ${oc.select:artificial_api_key, null}\njudge_base_url: null\nkept: 1\n")
    assert check.variables_left_to_env_yaml(config) == ["artificial_api_key", "judge_base_url"]


def test_a_config_error_is_told_by_its_message_and_the_key_below_the_instance():
    error = "gym: error: r/c.yaml: critpt_server.resources_servers.critpt.api_key.str: Input should be a valid string"
    assert check.config_error(error) == "api_key.str: Input should be a valid string"
    assert check.config_error("gym: error: 2 config values cannot be resolved:\na.yaml: m.k.i.url: Interpolation key 'x' not found\n") == "url: Interpolation key 'x' not found"


def test_declared_requirements_leave_out_upstreams_own_package(tmp_path):
    (tmp_path / "requirements.txt").write_text("-e nemo-gym[dev] @ ../../\n# a comment\nmath-verify==0.8.0  # pinned\n\ndatasets\n")
    assert check.declared_requirements(tmp_path) == ["math-verify==0.8.0", "datasets"]
    assert check.declares_upstream_package(tmp_path)
    (tmp_path / "requirements.txt").unlink()
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\ndependencies = ["nemo-gym[dev]", "human-eval-infilling"]\n')
    assert check.declared_requirements(tmp_path) == ["human-eval-infilling"] and check.declares_upstream_package(tmp_path)



def test_upstreams_own_dependencies_are_installed_where_the_directory_imports_them_and_they_are_missing_here(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\ndependencies = ["ray[default]>=2.5", "pydantic", "GitPython>=3", "psutil"]\n')
    directory = tmp_path / "resources_servers" / "x"
    directory.mkdir(parents=True)
    (directory / "requirements.txt").write_text("-e nemo-gym[dev] @ ../../\n")
    (directory / "app.py").write_text("import ray\nfrom git import Repo\nimport pydantic\n")
    assert check.declares_upstream_package(directory)
    wanted = check.upstream_dependencies_used(tmp_path, directory)
    assert "pydantic" not in wanted and "psutil" not in wanted
    assert ("ray[default]>=2.5" in wanted) == (not check.installed("ray"))
    assert ("GitPython>=3" in wanted) == (not check.installed("GitPython"))


def test_upstream_dependencies_reached_through_another_servers_code_or_a_config_naming_it_are_installed(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[project]\ndependencies = ["upstream-check-fake-one", "upstream-check-fake-two>=2", "upstream-check-fake-unused"]\n'
        '[project.optional-dependencies]\ndev = ["pytest-asyncio", "upstream-check-fake-dev"]\nsandbox = ["upstream-check-fake-box"]\n'
        'other = ["upstream-check-fake-other"]\n')
    agent, helper, named = (tmp_path / "responses_api_agents" / "agent", tmp_path / "resources_servers" / "helper",
                            tmp_path / "responses_api_models" / "named")
    for directory in (agent / "configs", helper, named):
        directory.mkdir(parents=True)
    (agent / "requirements.txt").write_text("-e nemo-gym[dev,sandbox] @ ../../\n")
    (agent / "app.py").write_text("from resources_servers.helper.prepare import rows\nimport upstream_check_fake_dev\n"
                                  "import upstream_check_fake_box, upstream_check_fake_other\n")
    (agent / "configs" / "agent.yaml").write_text("a:\n  responses_api_agents:\n    agent: {entrypoint: app.py}\n"
                                                  "m:\n  responses_api_models:\n    named: {entrypoint: app.py, x: '${y}'}\n")
    (helper / "prepare.py").write_text("import upstream_check_fake_one\n")
    (named / "app.py").write_text("from upstream_check_fake_two import thing\n")
    assert check.upstream_dependencies_used(tmp_path, agent) == [
        "upstream-check-fake-one", "upstream-check-fake-two>=2", "upstream-check-fake-dev", "upstream-check-fake-box"]


def test_a_kept_virtualenv_gets_what_the_directory_needs_now_and_did_not_get_before(tmp_path):
    marker = tmp_path / "venv" / check.INSTALL_MARKER
    assert check.saved_install(marker, tmp_path, ["pytest-asyncio"]) == ("skipped", None, [])
    marker.parent.mkdir()
    check.save_install(marker, "ok", None, ["pytest-asyncio", "ray"])
    assert check.saved_install(marker, tmp_path, ["pytest-asyncio"]) == ("ok", None, ["pytest-asyncio", "ray"])
    (tmp_path / "requirements.txt").write_text("-e nemo-gym[dev] @ ../../\nmath-verify\n")
    marker.write_text('["failed: no network", "install failed: math-verify"]')
    assert check.saved_install(marker, tmp_path, ["pytest-asyncio"]) == ("failed: no network", "install failed: math-verify", ["pytest-asyncio", "math-verify"])


GOOD_APP = check.STAND_IN_APP.replace("class StandInConfig(BaseResourcesServerConfig):\n    pass",
                                      "class StandInConfig(BaseResourcesServerConfig):\n    judge_url: str\n    judge_key: str\n    region: str")
GOOD_TESTS = '''
import util


def test_a_sibling_module_imports_bare():
    assert util.ANSWER == 42


def test_that_fails():
    assert util.ANSWER == 41
'''
GOOD_CONFIG = '''
good:
  resources_servers:
    good:
      entrypoint: app.py
      judge_model_server: {type: responses_api_models, name: policy_model}
      judge_url: ${judge_base_url}
      judge_key: ${oc.env:UPSTREAM_CHECK_FAKE_KEY,null}
      region: ${region}
region: null
good_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      resources_server:
        type: resources_servers
        name: ???
      model_server: {type: responses_api_models, name: policy_model}
'''

MODEL_APP = '''
from nemo_gym.base_responses_api_model import BaseResponsesAPIModelConfig, SimpleResponsesAPIModel


class OpenAIModelConfig(BaseResponsesAPIModelConfig):
    openai_base_url: str
    openai_api_key: str
    openai_model: str


class OpenAIModel(SimpleResponsesAPIModel):
    config: OpenAIModelConfig

    async def responses(self, request, body):
        raise NotImplementedError
'''


def make_upstream(root: Path) -> Path:
    good = root / "resources_servers" / "good"
    (good / "tests").mkdir(parents=True)
    (good / "configs").mkdir()
    (good / "app.py").write_text(GOOD_APP)
    (good / "util.py").write_text("ANSWER = 42\n")
    (good / "tests" / "test_app.py").write_text(GOOD_TESTS)
    (good / "configs" / "good.yaml").write_text(GOOD_CONFIG)
    broken = root / "resources_servers" / "broken"
    (broken / "tests").mkdir(parents=True)
    (broken / "app.py").write_text("from nemo_gym.no_such_module import thing\n")
    (broken / "tests" / "test_app.py").write_text("from resources_servers.broken.app import thing\n\ndef test_x():\n    pass\n")
    model = root / "responses_api_models" / "openai_model"
    model.mkdir(parents=True)
    (model / "app.py").write_text(MODEL_APP)
    return root


def test_a_fake_checkout_is_checked_in_a_scratch_copy_and_left_as_it_was(tmp_path):
    upstream = make_upstream(tmp_path / "upstream")
    before = sorted(path.relative_to(upstream) for path in upstream.rglob("*"))
    out = tmp_path / "out.json"
    command = [sys.executable, str(REPO_ROOT / "scripts" / "upstream_check.py"), str(upstream), "--no-install",
               "--only", "good", "--only", "broken", "--json", str(out), "--scratch", str(tmp_path / "scratch")]
    finished = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert sorted(path.relative_to(upstream) for path in upstream.rglob("*")) == before
    results = {row["directory"]: row for row in json.loads(out.read_text())["directories"]}
    good, broken = results["resources_servers/good"], results["resources_servers/broken"]
    assert good["import_ok"] is True and good["configs_loaded"] == good["configs_total"] == 1, good
    assert good["tests"] == {"passed": 1, "failed": 1} and good["tests_pass"] is False
    assert broken["import_ok"] is False and broken["causes"][0] == "missing module nemo_gym.no_such_module"
    assert "apps importing: 1 of 2" in finished.stdout
    assert "missing module nemo_gym.no_such_module" in finished.stdout


def test_the_upstream_directories_servers_read_outside_their_own_are_in_the_scratch_copy(tmp_path):
    upstream = make_upstream(tmp_path / "upstream")
    shared = {"benchmarks/critpt/prompts/turn2.yaml": "user: '{q}'\n", "environments/prime_agent_math/config.yaml": "a: 1\n",
              "fern/versions/latest/pages/page.mdx": "# page\n"}
    for relative, text in shared.items():
        (upstream / relative).parent.mkdir(parents=True, exist_ok=True)
        (upstream / relative).write_text(text)
    (upstream / "tests").mkdir()
    (upstream / "tests" / "upstream_only.py").write_text("")
    root = check.make_scratch(tmp_path / "scratch", upstream, check.server_directories(upstream))
    assert {relative: (root / relative).read_text() for relative in shared} == shared
    assert (root / "resources_servers" / "good" / "util.py").is_file()
    assert not (root / "tests" / "upstream_only.py").exists() and (root / "tests" / "unit_tests").is_dir()
