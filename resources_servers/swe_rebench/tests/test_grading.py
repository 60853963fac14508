"""The reward cannot be faked from inside the patch: each attack on grading scores 0.0 with a reason.

Every attack leaves the task's bug in place (``bounds.py`` still returns the lower bound above the range),
so any reward above 0.0 is a faked one. The hidden tests are graded from results the runner signs with a
per-run key over a descriptor of its own (``grading.py``, ``hidden_runner.py``).
"""

import hashlib
import hmac
import json
import shutil
import subprocess
import sys

import pytest
from starlette.testclient import TestClient

from resources_servers.swe_rebench import grading
from resources_servers.swe_rebench.app import DEFAULT_TASKS_DIR
from resources_servers.swe_rebench.grading import NamedTests, Orders, judge
from resources_servers.swe_rebench.tests.test_app import make_server, seeded, verify
from responses_api_models.scripted_backend.app import SWE_REBENCH_FIXES

BUGGY = (DEFAULT_TASKS_DIR / "clamp_upper" / "repo" / "bounds.py").read_text()
TESTS = NamedTests.load(DEFAULT_TASKS_DIR / "clamp_upper" / "tests.json")
FAKE_REPORT = "".join(f"{'0' * 64}\t{number}\tresult\t{test}\tpassed\t\n" for number, test in enumerate(TESTS.all))
# Appended to bounds.py: the clamp of the task, its bug kept, called from the hidden tests.
BOUNDS_CALLS = "\n\n_clamp = clamp\n\n\ndef clamp(value, low, high):\n    {}\n    return _clamp(value, low, high)\n"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    return make_server(tmp_path_factory.mktemp("grading") / "sandboxes", test_timeout_seconds=30)


@pytest.fixture(scope="module")
def app(server):
    app = server.build_app()
    with TestClient(app):
        yield app


def graded(app, bounds_source: str) -> dict:
    """Seed a session, write ``bounds_source`` as bounds.py, verify."""
    client = seeded(TestClient(app))
    reply = client.post("/write_file", json={"path": "bounds.py", "content": bounds_source})
    assert reply.status_code == 200, reply.text
    return verify(client)


def assert_zero(result: dict, reason: str) -> None:
    assert result["reward"] == 0.0 and result["tests_passed"] is False, result
    assert reason in result["reason"], result["reason"]


def test_os_exit_0_at_import_of_the_patched_module_scores_zero(app):
    assert_zero(graded(app, "import os\nos._exit(0)\n" + BUGGY), "the runner did not finish (exit code 0)")


@pytest.mark.parametrize("exit_call", ["import sys; sys.exit(0)", "import os; os._exit(0)"])
def test_an_exit_inside_a_test_scores_zero(app, exit_call):
    result = graded(app, BUGGY + BOUNDS_CALLS.format(exit_call))
    assert result["reward"] == 0.0 and result["reason"], result
    assert "did not finish" in result["reason"] or "SystemExit" in result["reason"], result["reason"]


def test_a_patch_that_kills_its_parent_scores_zero(app):
    kill = "import os, signal\ntry:\n    os.kill(os.getppid(), signal.SIGKILL)\nexcept OSError:\n    pass\nos._exit(0)\n"
    assert_zero(graded(app, kill + BUGGY), "the runner did not finish")


def test_a_patch_that_deletes_or_rewrites_the_hidden_tests_scores_zero(app):
    """On disk (read-only, and read before the patch runs) and in memory (the test class swapped as it is made)."""
    attack = (
        "import builtins, os\n"
        "hidden = os.environ.get('HIDDEN', '')\n"
        "for name in (os.listdir(hidden) if hidden else []):\n"
        "    for act in (lambda p: os.remove(p), lambda p: open(p, 'w').write('import unittest\\n')):\n"
        "        try:\n"
        "            act(os.path.join(hidden, name))\n"
        "        except OSError:\n"
        "            pass\n"
        "_build = builtins.__build_class__\n"
        "def build(func, name, *bases, **kw):\n"
        "    cls = _build(func, name, *bases, **kw)\n"
        "    for attr in list(vars(cls)):\n"
        "        if attr.startswith('test'):\n"
        "            setattr(cls, attr, lambda self: None)\n"
        "    return cls\n"
        "builtins.__build_class__ = build\n"
    )
    assert_zero(graded(app, attack + BUGGY), "changed while they ran")


def test_a_fake_runner_report_on_stdout_and_every_descriptor_scores_zero(app):
    forge = (
        "import os, sys\n"
        f"report = {FAKE_REPORT!r}\n"
        "sys.stdout.write(report + 'OK\\n'); sys.stdout.flush()\n"
        "for fd in range(3, min(os.sysconf('SC_OPEN_MAX'), 1 << 16)):\n"
        "    try:\n"
        "        os.write(fd, report.encode())\n"
        "    except OSError:\n"
        "        pass\n"
        "os._exit(0)\n"
    )
    assert_zero(graded(app, forge + BUGGY), "not signed with this run's key")


def test_a_patch_that_makes_assert_equal_a_no_op_scores_zero(app):
    patch = "import unittest\nunittest.TestCase.assertEqual = lambda self, first, second, msg=None: None\n"
    assert_zero(graded(app, patch + BUGGY), "at import: unittest.case.TestCase.assertEqual was replaced")


def test_a_patch_that_swaps_assert_equal_in_the_module_namespace_scores_zero(app):
    patch = "import unittest.case\nclass Lenient(unittest.case.TestCase):\n    def assertEqual(self, *args, **kwargs):\n        pass\nunittest.TestCase = unittest.case.TestCase = Lenient\n"
    assert_zero(graded(app, patch + BUGGY), "the test framework or the hidden tests were changed while they ran")


def test_the_runs_key_is_in_no_argument_environment_or_output_of_the_run(app, monkeypatch):
    key = bytes(range(32))
    monkeypatch.setattr(grading.secrets, "token_bytes", lambda size: key)
    spy = (
        "import os, sys\n"
        "print('ARGV', sys.argv, 'ENV', dict(os.environ), 'STDIN', sys.stdin.read())\n"
        "try:\n"
        "    print('CMDLINE', open('/proc/self/cmdline').read())\n"
        "except RuntimeError as refused:\n"
        "    print('REFUSED', refused)\n"
    )
    result = graded(app, spy + BUGGY)
    assert "ARGV" in result["test_output"] and "REFUSED" in result["test_output"], result["test_output"]
    assert key.hex() not in result["test_output"]
    assert result["reward"] == 0.0


def test_a_named_test_that_does_not_run_scores_zero_even_with_the_fix(tmp_path):
    tasks = tmp_path / "tasks"
    shutil.copytree(DEFAULT_TASKS_DIR, tasks)
    named = json.loads((tasks / "clamp_upper" / "tests.json").read_text())
    named["PASS_TO_PASS"].append("test_hidden_bounds.HiddenClampTest.test_gone")
    (tasks / "clamp_upper" / "tests.json").write_text(json.dumps(named))
    with TestClient(make_server(tmp_path / "sandboxes", tasks_dir=str(tasks)).build_app()) as client:
        result = graded(client.app, SWE_REBENCH_FIXES["bounds.py"])
    assert_zero(result, "PASS_TO_PASS test test_hidden_bounds.HiddenClampTest.test_gone missing")


# Run in a copy of a task (its repository and hidden tests side by side): the ids the hidden files hold, and
# for each id given on the command line whether it ran alone and passed, as JSON.
OUTCOMES = (
    "import json, pathlib, sys, unittest\n"
    "loader = unittest.TestLoader()\n"
    "def ids(suite):\n"
    "    return [i for t in suite for i in (ids(t) if isinstance(t, unittest.TestSuite) else [t.id()])]\n"
    "held = ids(loader.loadTestsFromNames(sorted(p.stem for p in pathlib.Path(sys.argv[1]).glob('test_*.py'))))\n"
    "passed = {}\n"
    "for test in sys.argv[2:]:\n"
    "    result = unittest.TestResult()\n"
    "    loader.loadTestsFromName(test).run(result)\n"
    "    passed[test] = result.testsRun == 1 and result.wasSuccessful()\n"
    "print(json.dumps({'held': sorted(held), 'passed': passed}))\n"
)


def hidden_outcomes(task_dir, copy, fixed: bool) -> dict:
    shutil.copytree(task_dir / "repo", copy)
    shutil.copytree(task_dir / "hidden", copy, dirs_exist_ok=True)
    for name, source in SWE_REBENCH_FIXES.items():
        if fixed and (copy / name).exists():
            (copy / name).write_text(source)
    tests = NamedTests.load(task_dir / "tests.json")
    run = subprocess.run([sys.executable, "-c", OUTCOMES, str(task_dir / "hidden"), *tests.all], cwd=copy, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


@pytest.mark.parametrize("task_id", sorted(path.name for path in DEFAULT_TASKS_DIR.iterdir() if path.is_dir()))
def test_each_tasks_named_tests_are_its_hidden_tests_fail_to_pass_failing_as_shipped_and_every_one_passing_with_the_fix(tmp_path, task_id):
    task_dir = DEFAULT_TASKS_DIR / task_id
    tests = NamedTests.load(task_dir / "tests.json")
    shipped, fixed = hidden_outcomes(task_dir, tmp_path / "shipped", False), hidden_outcomes(task_dir, tmp_path / "fixed", True)
    assert shipped["held"] == sorted(tests.all), "tests.json must name every hidden test, and only those"
    assert {test: shipped["passed"][test] for test in tests.all} == {**dict.fromkeys(tests.fail_to_pass, False), **dict.fromkeys(tests.pass_to_pass, True)}
    assert fixed["passed"] == dict.fromkeys(tests.all, True)


def signed(key: bytes, *lines: str) -> bytes:
    return b"".join(judge_line(key, number, line) for number, line in enumerate(lines))


def judge_line(key: bytes, number: int, line: str) -> bytes:
    body = f"{number}\t{line}".encode()
    return hmac.new(key, body, hashlib.sha256).hexdigest().encode() + b"\t" + body + b"\n"


def full_report() -> list[str]:
    return ["start\t4", *(f"result\t{test}\tpassed\t" for test in TESTS.all), "finished\t4"]


def test_judge_gives_one_only_to_a_complete_signed_report_that_agrees_with_the_exit_status():
    orders = Orders.new(7, TESTS)
    key, lines = orders.key, full_report()
    assert orders.stdin.decode().splitlines() == [f"7 {key.hex()}", *TESTS.all]
    assert judge(signed(key, *lines), key, TESTS, 0, False).passed
    cases = {
        "exited with status 1": (signed(key, *lines), 1, False),
        "did not finish": (signed(key, *lines[:-1]), 0, False),
        "timed out": (signed(key, *lines[:-1]), None, True),
        "not signed": (signed(b"x" * 32, *lines), 0, False),
        "out of order": (judge_line(key, 1, lines[0]) + judge_line(key, 0, lines[1]), 0, False),
        "not a named test": (signed(key, lines[0], "result\tother.Test.test\tpassed\t", *lines[1:]), 0, False),
        "without a result": (signed(key, lines[0], *lines[2:]), 0, False),
        "reported nothing": (b"", 0, False),
    }
    for reason, (report, exit_code, timed_out) in cases.items():
        verdict = judge(report, key, TESTS, exit_code, timed_out)
        assert not verdict.passed and reason in verdict.reason, (reason, verdict)
