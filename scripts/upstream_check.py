"""Try every server directory of an upstream NeMo Gym checkout in a scratch copy of this project.

    python scripts/upstream_check.py UPSTREAM_CHECKOUT [--json OUT] [--no-install] [--jobs 2] [--only NAME ...]

The checkout is only read. A copy of this project's tree is made under a temporary directory (or
--scratch), and each of the checkout's resources_servers/*, responses_api_agents/* and
responses_api_models/* directories is copied into it unchanged (replacing a directory of the same name),
with the checkout's benchmarks/, environments/ and fern/ (which servers and their tests read from the root).
Then, per directory, with a small pool:

- install: a virtualenv over this Python's packages gets what the directory declares (requirements.txt
  or pyproject.toml; for upstream's own ``nemo-gym[...]`` line, those of upstream's dependencies and of
  the extras it names whose modules the directory, or a server directory it reaches through its imports
  or its configs, imports, such as ``ray``) and upstream's pytest plugins (the ``pytest*``
  entries of its ``dev`` extra: pytest-asyncio for ``asyncio_mode=auto``); bounded in time, and a failed
  install is recorded as a cause (the rest still runs). --no-install uses this Python as it is; with
  --venvs DIR the virtualenvs are kept there and a later run gives a kept one only what it did not get.
- import: ``<kind>.<name>.app`` imported from the server directory, it and the root on PYTHONPATH.
- tests: its own tests as upstream's ``ng_test`` runs them (as ``gym env test`` does here): cwd the
  server directory, it and the root first on PYTHONPATH, pytest with ``asyncio_mode=auto``; bounded in time.
- configs: each ``configs/**/*.yaml`` loaded with ``gym env resolve`` from the root, its placeholders
  filled as a user's env.yaml would: ``policy_base_url``, ``policy_api_key``, ``policy_model_name``, each
  ``${oc.select:variable,null}`` variable and each top-level variable the file sets to null are set (and
  each ``${oc.env:NAME,null}`` environment variable), and a
  ``${variable}`` the files leave undefined, a required ``???`` value and a required setting missing get a stand-in (a URL for ``*url``, ``policy_model`` for a model server's ``name``, else a
  string), and a model server the config refers to but does not define (``policy_model``, a judge) is
  upstream's ``openai_model`` config under that name (also one ``_copy``-ed), pointing at the stand-in URL. One process of the
  directory's Python loads all of its configs (its app imported once), bounded in time.

Prints one row per directory (import, tests passed/failed/errors, configs loaded/total, first cause),
the totals, and the causes by how many directories each breaks; --json writes all of it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import tomllib
import traceback
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

PROJECT_ROOT = Path(__file__).resolve().parent.parent
SERVER_KINDS = ("resources_servers", "responses_api_agents", "responses_api_models")
# Upstream's top-level directories that its servers and their tests read from the checkout's root: benchmark
# prompts and modules, environment configs and data, the docs pages a test checks against.
SHARED_DIRECTORIES = ("benchmarks", "environments", "fern")
SKIP_WHEN_COPYING = shutil.ignore_patterns(".git", "__pycache__", "*.egg-info", ".venv", ".pytest_cache")
PYTEST_COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected)")
UNDEFINED_VARIABLE = re.compile(r"Interpolation key '([\w.]+)' not found")
UNSET_ENVIRONMENT = re.compile(r"Environment variable '(\w+)' not found")
REQUIRED_FIELD = re.compile(r"([\w.\-]+): Field required")
REQUIRED_VALUE = re.compile(r"([\w.\-]+): required value \(\?\?\?\) is not set")
UNDEFINED_INSTANCE = re.compile(r"([\w.\-]+): refers to instance '([\w.\-]+)', which the config does not define")
SELECT_OR_NULL = re.compile(r"\$\{oc\.select:([\w.]+),\s*null\s*\}")
ENVIRONMENT_OR_NULL = re.compile(r"\$\{oc\.env:(\w+),\s*null\s*\}")
UNDEFINED_COPY = re.compile(r"_copy: no key '([\w\-]+)' in the config")
SERVER_IMPORT = re.compile(rf"^\s*(?:from|import)\s+({'|'.join(SERVER_KINDS)})\.(\w+)", re.MULTILINE)
MISSING_MODULE = re.compile(r"No module named '([\w.]+)'")
MISSING_NAME = re.compile(r"cannot import name '(\w+)' from '([\w.]+)'")
STAND_IN_URL = "http://127.0.0.1:8000/v1"
MODEL_STAND_IN = {"responses_api_models": {"openai_model": {
    "entrypoint": "app.py", "openai_base_url": STAND_IN_URL, "openai_api_key": "stand-in", "openai_model": "stand-in"}}}
STAND_IN_SERVER = "upstream_check_stand_in"
RESOURCES_STAND_IN = {"resources_servers": {STAND_IN_SERVER: {"entrypoint": "app.py"}}}
STAND_IN_APP = """from nemo_gym.base_resources_server import BaseResourcesServerConfig, BaseVerifyRequest, BaseVerifyResponse, SimpleResourcesServer


class StandInConfig(BaseResourcesServerConfig):
    pass


class StandInServer(SimpleResourcesServer):
    config: StandInConfig

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        return BaseVerifyResponse(**body.model_dump(), reward=0.0)
"""
MAX_FILLS = 12
CONFIG_LINE = "upstream_check config: "
INSTALL_MARKER = "upstream_check_install.json"
ENV_YAML = ("policy_base_url", "policy_api_key", "policy_model_name")


@dataclass
class Result:
    directory: str
    install: str = "skipped"
    has_app: bool = False
    import_ok: bool | None = None
    tests: dict[str, int] = field(default_factory=dict)
    tests_exit: int | None = None
    configs_loaded: int = 0
    configs_total: int = 0
    causes: list[str] = field(default_factory=list)

    @property
    def has_tests(self) -> bool:
        return self.tests_exit not in (None, 5)

    @property
    def tests_pass(self) -> bool:
        return self.tests_exit == 0

    def add_cause(self, cause: str) -> None:
        """Add a cause once; pytest's shortened copies of one (``ConnectionErr...``) are the same cause."""
        stem = cause.removesuffix("...")
        if cause.endswith("...") and any(known.startswith(stem) for known in self.causes):
            return
        self.causes = [known for known in self.causes if not (known.endswith("...") and cause.startswith(known.removesuffix("...")))]
        if cause not in self.causes:
            self.causes.append(cause)


def parse_pytest_summary(output: str) -> dict[str, int]:
    """The counts of pytest's closing line (``3 passed, 1 failed, 2 errors in 1.2s``), ``error`` as ``errors``."""
    lines = [line for line in output.splitlines() if PYTEST_COUNT.search(line) and " in " in line]
    if not lines:
        return {}
    counts: dict[str, int] = {}
    for number, kind in PYTEST_COUNT.findall(lines[-1]):
        counts["errors" if kind.startswith("error") else kind] = int(number)
    return counts


def classify(message: str) -> str:
    """One failure message as a cause shared across directories: a missing module or name, else the
    exception's type and the start of its message."""
    if match := MISSING_NAME.search(message):
        return f"missing name {match.group(2)}.{match.group(1)}"
    if match := MISSING_MODULE.search(message):
        return f"missing module {match.group(1)}"
    message = " ".join(message.split())
    message = re.sub(r"0x[0-9a-f]+", "0x…", message)
    return message[:140]


def failure_messages(pytest_output: str) -> list[str]:
    """The messages of pytest's short summary (``FAILED x::t - Error: ...``, ``ERROR x - ...``), and the
    ``E   SomeError: ...`` lines of a collection error, in order."""
    messages = []
    for line in pytest_output.splitlines():
        if line.startswith(("FAILED ", "ERROR ")) and " - " in line:
            messages.append(line.split(" - ", 1)[1])
        elif re.match(r"E\s+\w+(Error|Exception|Exit)\b", line):
            messages.append(line[1:].strip())
    return messages


def last_exception(output: str) -> str:
    """The last ``SomeError: message`` line of a traceback (or the last line)."""
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    for line in reversed(lines):
        if re.match(r"[\w.]+(Error|Exception|Exit|Interrupt)\b", line):
            return line
    return lines[-1] if lines else "no output"


def stand_in(key: str) -> str:
    """What a user's env.yaml would hold for a placeholder of this name."""
    parts = key.lower().split(".")
    if parts[-1] == "name" and len(parts) > 1:
        return STAND_IN_SERVER if "resources_server" in parts[-2] else "policy_model"
    last = parts[-1]
    if "url" in last:
        return STAND_IN_URL
    return "stand-in"


def required(key: str) -> list[str]:
    """The overrides that fill a required key: a server reference (``resources_server``, ``*model_server``)
    names the stand-in of its kind, anything else is ``stand_in``."""
    last = key.rsplit(".", 1)[-1]
    if last == "resources_server" or last.endswith("model_server"):
        kind = "resources_servers" if last == "resources_server" else "responses_api_models"
        return [f"++{key}.type={kind}", f"++{key}.name={stand_in(key + '.name')}"]
    return [f"++{key}={stand_in(key)}"]


def fill_placeholders(error: str) -> tuple[list[str], dict[str, dict], dict[str, str]]:
    """From a ``gym env resolve`` error: the ``++key=value`` overrides, the instances to define and the
    environment variables to set that fill its undefined variables, required values, servers referred to
    (a resources server referred to is a stand-in that verifies nothing; any other is upstream's
    ``openai_model`` at the stand-in URL) and ``${oc.env:NAME}`` without a default."""
    overrides = [f"++{key}={stand_in(key)}" for key in UNDEFINED_VARIABLE.findall(error)]
    overrides += [override for key in REQUIRED_VALUE.findall(error) + REQUIRED_FIELD.findall(error) for override in required(key)]
    instances = {name: RESOURCES_STAND_IN if "resources_server" in key.rsplit(".", 1)[-1] else MODEL_STAND_IN
                 for key, name in UNDEFINED_INSTANCE.findall(error)}
    instances.update({name: MODEL_STAND_IN for name in UNDEFINED_COPY.findall(error) if "model" in name})
    return overrides, instances, {name: stand_in(name) for name in UNSET_ENVIRONMENT.findall(error)}


UPSTREAM_PACKAGE = re.compile(r"(-e\s+)?nemo[-_]gym\b")


def declared_lines(directory: Path) -> list[str]:
    """The requirement lines of a server directory's requirements.txt, else of its pyproject.toml."""
    if (directory / "requirements.txt").is_file():
        lines = [line.split(" #")[0].strip() for line in (directory / "requirements.txt").read_text().splitlines()]
        return [line for line in lines if line and not line.startswith("#")]
    if (directory / "pyproject.toml").is_file():
        return tomllib.loads((directory / "pyproject.toml").read_text()).get("project", {}).get("dependencies", [])
    return []


def declares_upstream_package(directory: Path) -> bool:
    return any(UPSTREAM_PACKAGE.match(line) for line in declared_lines(directory))


def declared_requirements(directory: Path) -> list[str]:
    """What a server directory declares it needs, without upstream's own package (``-e nemo-gym[dev] @ ../../``)."""
    return [line for line in declared_lines(directory) if not UPSTREAM_PACKAGE.match(line) and not line.startswith("-e .")]


def imported_names(directory: Path) -> set[str]:
    """The top-level modules a directory's Python files import."""
    names: set[str] = set()
    for path in directory.rglob("*.py"):
        names.update(re.findall(r"^\s*(?:import|from)\s+(\w+)", path.read_text(errors="replace"), re.MULTILINE))
    return names


def servers_named(directory: Path) -> set[tuple[str, str]]:
    """The server directories (kind, name) a directory's Python files import and its configs define instances of."""
    named: set[tuple[str, str]] = set()
    for path in directory.rglob("*.py"):
        named.update(SERVER_IMPORT.findall(path.read_text(errors="replace")))
    for config in directory.glob("configs/**/*.yaml"):
        with contextlib.suppress(yaml.YAMLError, UnicodeDecodeError):
            loaded = yaml.safe_load(config.read_text())
            for instance in (loaded.values() if isinstance(loaded, dict) else ()):
                for kind, servers in (instance.items() if isinstance(instance, dict) else ()):
                    if kind in SERVER_KINDS and isinstance(servers, dict):
                        named.update((kind, name) for name in servers)
    return named


def directories_reached(directory: Path) -> list[Path]:
    """The directory and the server directories beside it that it reaches: those its code imports or its
    configs name, theirs, and so on (their modules are imported when its tests run or its configs load)."""
    root, reached, pending = directory.parent.parent, [directory], [directory]
    while pending:
        for kind, name in sorted(servers_named(pending.pop())):
            other = root / kind / name
            if other.is_dir() and other not in reached:
                reached.append(other)
                pending.append(other)
    return reached


def upstream_extras(directory: Path) -> list[str]:
    """The extras named on a directory's upstream package line (``nemo-gym[dev,sandbox]``)."""
    for line in declared_lines(directory):
        if UPSTREAM_PACKAGE.match(line) and (extras := re.search(r"\[([\w,\s-]+)\]", line)):
            return [extra.strip() for extra in extras.group(1).split(",")]
    return []


def upstream_dependencies_used(upstream: Path, directory: Path) -> list[str]:
    """Of upstream's own dependencies (its root pyproject's, and those of the extras the directory's
    ``nemo-gym[...]`` line names), those not installed here whose module the directory's code, or that of
    a server directory it reaches (``directories_reached``), imports (``ray``, ``psutil``, ...). The
    ``pytest*`` entries are left to ``upstream_test_plugins``."""
    pyproject = upstream / "pyproject.toml"
    if not pyproject.is_file():
        return []
    used = set().union(*map(imported_names, directories_reached(directory)))
    project = tomllib.loads(pyproject.read_text()).get("project", {})
    extras = project.get("optional-dependencies", {})
    entries = [*project.get("dependencies", []), *(entry for extra in upstream_extras(directory) for entry in extras.get(extra, []))]
    module = {"gitpython": "git", "hydra_core": "hydra", "mlflow_skinny": "mlflow"}
    wanted = []
    for entry in entries:
        name = re.split(r"[\[<>=!~ ;]", entry, maxsplit=1)[0]
        key = name.lower().replace("-", "_")
        if not name.startswith("pytest") and module.get(key, key) in used and not installed(name) and entry not in wanted:
            wanted.append(entry)
    return wanted


def saved_install(marker: Path, directory: Path, plugins: list[str]) -> tuple[str, str | None, list[str]]:
    """What a kept virtualenv's marker says: the install's outcome, its cause, and what was installed (a
    marker of an earlier version of this script lists nothing: it had the plugins and the directory's
    declared requirements)."""
    if not marker.is_file():
        return "skipped", None, []
    saved = json.loads(marker.read_text())
    if isinstance(saved, list):
        return saved[0], saved[1], [*plugins, *declared_requirements(directory)]
    return saved["install"], saved["cause"], saved["requirements"]


def save_install(marker: Path, install: str, cause: str | None, requirements: list[str]) -> None:
    marker.write_text(json.dumps({"install": install, "cause": cause, "requirements": requirements}))


def installed(distribution: str) -> bool:
    try:
        importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def upstream_test_plugins(upstream: Path) -> list[str]:
    """The ``pytest*`` entries of upstream's ``dev`` extra (pytest-asyncio among them)."""
    pyproject = upstream / "pyproject.toml"
    if not pyproject.is_file():
        return ["pytest-asyncio"]
    extras = tomllib.loads(pyproject.read_text()).get("project", {}).get("optional-dependencies", {})
    return [entry for entry in extras.get("dev", []) if entry.startswith("pytest")] or ["pytest-asyncio"]


def server_directories(upstream: Path) -> list[Path]:
    return [path for kind in SERVER_KINDS if (upstream / kind).is_dir() for path in sorted((upstream / kind).iterdir()) if path.is_dir()]


def make_scratch(scratch: Path, upstream: Path, directories: list[Path]) -> Path:
    """A copy of this project's tree under ``scratch``, with the upstream server directories and
    ``SHARED_DIRECTORIES`` copied in (and the stand-in resources server that configs' placeholders may name)."""
    root = scratch / "project"
    shutil.copytree(PROJECT_ROOT, root, ignore=SKIP_WHEN_COPYING, symlinks=True)
    (root / "resources_servers" / STAND_IN_SERVER).mkdir()
    (root / "resources_servers" / STAND_IN_SERVER / "app.py").write_text(STAND_IN_APP)
    for directory in directories:
        target = root / directory.parent.name / directory.name
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(directory, target, symlinks=True, ignore=shutil.ignore_patterns(".venv", "__pycache__"))
    for name in SHARED_DIRECTORIES:
        if (upstream / name).is_dir():
            shutil.copytree(upstream / name, root / name, symlinks=True, ignore=SKIP_WHEN_COPYING, dirs_exist_ok=True)
    return root


def run(command: list[str], cwd: Path, env: dict[str, str], timeout: float) -> tuple[int | None, str]:
    """Exit code (None on timeout) and output together; on timeout the command's whole process group
    (what its tests started too) is killed."""
    process = subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        return None, output
    return process.returncode, output


class Checker:
    def __init__(self, upstream: Path, root: Path, scratch: Path, venvs: Path, install: bool, timeouts: dict[str, float]):
        self.upstream, self.root, self.scratch, self.venvs, self.install, self.timeouts = upstream, root, scratch, venvs, install, timeouts
        self.plugins = upstream_test_plugins(upstream)

    def env(self, directory: Path | None) -> dict[str, str]:
        paths = [str(directory)] if directory else []
        paths += [str(self.root), *filter(None, [os.environ.get("PYTHONPATH")])]
        return {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)), "PYTHONDONTWRITEBYTECODE": "1"}

    def python_for(self, directory: Path, result: Result) -> str:
        """A virtualenv with what the directory declares (or this Python, with --no-install). A kept one
        gets only what the directory needs now and did not get before (nothing that failed is tried again)."""
        if not self.install:
            return sys.executable
        venv = self.venvs / f"{directory.parent.name}__{directory.name}"
        python = str(venv / "bin" / "python")
        marker = venv / INSTALL_MARKER
        requirements = declared_requirements(directory)
        if declares_upstream_package(directory):
            requirements += upstream_dependencies_used(self.upstream, directory)
        install, cause, done = saved_install(marker, directory, self.plugins)
        missing = [requirement for requirement in [*self.plugins, *requirements] if requirement not in done]
        if missing:
            if not marker.is_file():
                subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True, capture_output=True)
            command = [sys.executable, "-m", "pip", "--python", python, "install", "-q", "--disable-pip-version-check", *missing]
            code, output = run(command, directory, self.env(None), self.timeouts["install"])
            if code is None:
                step = f"timed out after {self.timeouts['install']:.0f}s"
            elif code:
                step = "failed: " + last_exception(output)[:200]
            else:
                step = "ok"
            if install in ("skipped", "ok"):
                install = step
                cause = None if step == "ok" else f"install {step.split(':')[0]}: " + " ".join(missing)[:120]
            save_install(marker, install, cause, [*done, *missing])
        result.install = install
        if cause:
            result.add_cause(cause)
        return python

    def check(self, directory: Path) -> Result:
        directory = self.root / directory.parent.name / directory.name
        result = Result(f"{directory.parent.name}/{directory.name}")
        python = self.python_for(directory, result)
        self.check_import(python, directory, result)
        self.check_tests(python, directory, result)
        self.check_configs(python, directory, result)
        return result

    def check_import(self, python: str, directory: Path, result: Result) -> None:
        result.has_app = (directory / "app.py").is_file()
        if not result.has_app:
            return
        module = f"{directory.parent.name}.{directory.name}.app"
        code, output = run([python, "-c", f"import {module}"], directory, self.env(directory), self.timeouts["import"])
        result.import_ok = code == 0
        if not result.import_ok:
            result.add_cause(classify(last_exception(output)) if code is not None else "import timed out")

    def check_tests(self, python: str, directory: Path, result: Result) -> None:
        if not any(directory.rglob("test_*.py")) and not any(directory.rglob("*_test.py")):
            return
        command = [python, "-m", "pytest", "-q", "-o", "asyncio_mode=auto", "-p", "no:cacheprovider"]
        code, output = run(command, directory, self.env(directory), self.timeouts["tests"])
        result.tests = parse_pytest_summary(output)
        result.tests_exit = -1 if code is None else code
        if code is None:
            result.add_cause(f"tests timed out after {self.timeouts['tests']:.0f}s")
        elif code not in (0, 5):
            for message in failure_messages(output) or [last_exception(output)]:
                result.add_cause(classify(message))

    def check_configs(self, python: str, directory: Path, result: Result) -> None:
        """All of a directory's configs loaded by one process of its Python (``--load-configs``), so its app
        is imported once; bounded in time as a whole."""
        configs = sorted((directory / "configs").rglob("*.yaml")) if (directory / "configs").is_dir() else []
        result.configs_total = len(configs)
        if not configs:
            return
        command = [python, "-m", "scripts.upstream_check", "--load-configs", *(str(config.relative_to(self.root)) for config in configs)]
        code, output = run(command, self.root, self.env(None), self.timeouts["config"])
        causes = dict(json.loads(line.removeprefix(CONFIG_LINE)) for line in output.splitlines() if line.startswith(CONFIG_LINE))
        for config in configs:
            cause = causes.get(str(config.relative_to(self.root)), "config load timed out" if code is None else classify(last_exception(output)))
            if cause is None:
                result.configs_loaded += 1
            else:
                result.add_cause(cause)


def variables_left_to_env_yaml(config: Path) -> list[str]:
    """The variables a config leaves for env.yaml: ``${oc.select:NAME,null}`` ones and top-level keys set to null."""
    text = config.read_text()
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        data = None
    nulls = [str(key) for key, value in data.items() if value is None] if isinstance(data, dict) else []
    return list(dict.fromkeys([*SELECT_OR_NULL.findall(text), *nulls]))


def load_configs_here(configs: list[str]) -> None:
    """``--load-configs``: run in a directory's Python from the scratch root, print one line per config
    with None or the cause why ``gym env resolve`` did not load it."""
    from nemo_gym.cli.main import main as gym

    for config in configs:
        saved = dict(os.environ)
        try:
            cause = load_config_here(gym, config)
        finally:
            os.environ.clear()
            os.environ.update(saved)
        print(CONFIG_LINE + json.dumps([config, cause]), flush=True)


def load_config_here(gym, config: str) -> str | None:
    """None if ``gym env resolve`` loads the config with its placeholders filled (as a user's env.yaml
    would), else the cause."""
    overrides = [f"++{key}={stand_in(key)}" for key in (*ENV_YAML, *variables_left_to_env_yaml(Path(config)))]
    instances: dict[str, dict] = {}
    os.environ.update({name: stand_in(name) for name in ENVIRONMENT_OR_NULL.findall(Path(config).read_text())})
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as extra:
        for _ in range(MAX_FILLS):
            Path(extra.name).write_text(yaml.safe_dump(instances))
            files = ["--config", config] + (["--config", extra.name] if instances else [])
            errors = io.StringIO()
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(errors):
                try:
                    code = gym(["env", "resolve", *files, *overrides])
                except Exception:  # a server's own code, imported by the check, may raise anything
                    code, _ = 1, errors.write(traceback.format_exc())
            if code == 0:
                return None
            output = errors.getvalue()
            more_overrides, more_instances, more_environment = fill_placeholders(output)
            more_overrides = [item for item in more_overrides if item not in overrides]
            more_instances = {name: body for name, body in more_instances.items() if name not in instances}
            more_environment = {name: value for name, value in more_environment.items() if name not in os.environ}
            if not more_overrides and not more_instances and not more_environment:
                return classify(config_error(output))
            overrides += more_overrides
            instances.update(more_instances)
            os.environ.update(more_environment)
    return f"placeholders not filled after {MAX_FILLS} tries"


def config_error(output: str) -> str:
    """The message of a ``gym: error:`` line, less the file and key it names."""
    lines = [line for line in output.splitlines() if line.startswith("gym: error:")]
    if not lines:
        return last_exception(output)
    message = lines[-1].removeprefix("gym: error:").strip()
    if message.endswith(":"):
        following = output.splitlines()[output.splitlines().index(lines[-1]) + 1:]
        message = next((line.strip() for line in following if line.strip()), message)
    message = re.sub(r"^\S+\.yaml: ", "", message)
    key, separator, rest = message.partition(": ")
    if separator and " " not in key:  # an instance's key: keep what is below <instance>.<kind>.<implementation>
        parts = key.split(".")
        message = ".".join(parts[3:] if len(parts) > 3 else parts[1:] or parts) + ": " + rest
    return message


def totals(results: list[Result]) -> dict[str, int]:
    tested = [result for result in results if result.has_tests]
    return {
        "directories": len(results),
        "apps": sum(result.has_app for result in results),
        "apps_importing": sum(bool(result.import_ok) for result in results),
        "directories_with_tests": len(tested),
        "directories_passing_all_tests": sum(result.tests_pass for result in tested),
        **{kind: sum(result.tests.get(kind, 0) for result in results) for kind in ("passed", "failed", "errors", "skipped")},
        "configs": sum(result.configs_total for result in results),
        "configs_loading": sum(result.configs_loaded for result in results),
        "directories_loading_all_configs": sum(result.configs_total > 0 and result.configs_loaded == result.configs_total for result in results),
    }


def causes_by_directories(results: list[Result]) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for result in results:
        for cause in result.causes:
            counts[cause] = counts.get(cause, 0) + 1
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


def table(results: list[Result]) -> str:
    rows = [("directory", "import", "tests p/f/e", "configs", "first cause")]
    for result in results:
        imported = "-" if result.import_ok is None else ("ok" if result.import_ok else "FAIL")
        tests = "-" if result.tests_exit in (None, 5) else "{}/{}/{}".format(*(result.tests.get(kind, 0) for kind in ("passed", "failed", "errors")))
        if result.tests_exit == -1:
            tests += " (timeout)"
        configs = f"{result.configs_loaded}/{result.configs_total}" if result.configs_total else "-"
        rows.append((result.directory, imported, tests, configs, result.causes[0] if result.causes else ""))
    widths = [max(len(row[column]) for row in rows) for column in range(4)]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row[:4], widths)) + "  " + row[4] for row in rows)


def summary(total: dict[str, int]) -> str:
    return "\n".join([
        f"apps importing: {total['apps_importing']} of {total['apps']}",
        f"directories passing all their own tests: {total['directories_passing_all_tests']} of {total['directories_with_tests']}"
        f" ({total['passed']} passed, {total['failed']} failed, {total['errors']} errors, {total['skipped']} skipped)",
        f"configs loading: {total['configs_loading']} of {total['configs']}"
        f" ({total['directories_loading_all_configs']} directories load all of theirs)",
    ])


def saved_result(row: dict) -> Result:
    """A directory's result as --json wrote it (its causes merged as ``add_cause`` merges them)."""
    result = Result(**{key: value for key, value in row.items() if key not in ("tests_pass", "causes")})
    for cause in row.get("causes", []):
        result.add_cause(cause)
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--load-configs"]:
        load_configs_here(argv[1:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("upstream", type=Path, help="an upstream NeMo Gym checkout (only read)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--no-install", action="store_true", help="install nothing; use this Python's packages")
    parser.add_argument("--jobs", type=int, default=2, help="directories checked at once (default 2)")
    parser.add_argument("--only", action="append", default=[], help="only this directory name (repeatable)")
    parser.add_argument("--scratch", type=Path, help="make the scratch copy here (kept) instead of a temporary directory")
    parser.add_argument("--venvs", type=Path, help="keep the per-directory virtualenvs here and reuse them on the next run"
                        " (what a directory got is not installed again)")
    parser.add_argument("--resume", action="store_true", help="keep the directories the --json file already has; check only the others")
    parser.add_argument("--install-timeout", type=float, default=600)
    parser.add_argument("--import-timeout", type=float, default=180)
    parser.add_argument("--tests-timeout", type=float, default=600, help="seconds for one directory's tests")
    parser.add_argument("--config-timeout", type=float, default=600, help="seconds for loading all of one directory's configs")
    args = parser.parse_args(argv)
    upstream = args.upstream.resolve()
    every = server_directories(upstream)
    directories = [path for path in every if not args.only or path.name in args.only]
    if not directories:
        parser.error(f"{upstream}: no server directories ({', '.join(SERVER_KINDS)})")
    results = []
    if args.resume and args.json and args.json.is_file():
        results = [saved_result(row) for row in json.loads(args.json.read_text())["directories"]]
        done = {result.directory for result in results}
        directories = [path for path in directories if f"{path.parent.name}/{path.name}" not in done]
    timeouts = {"install": args.install_timeout, "import": args.import_timeout, "tests": args.tests_timeout, "config": args.config_timeout}
    with tempfile.TemporaryDirectory(prefix="upstream-check-") as temporary:
        scratch = args.scratch.resolve() if args.scratch else Path(temporary)
        scratch.mkdir(parents=True, exist_ok=True)
        root = scratch / "project" if args.resume and (scratch / "project").is_dir() else make_scratch(scratch, upstream, every)
        venvs = args.venvs.resolve() if args.venvs else scratch / "venvs"
        checker = Checker(upstream, root, scratch, venvs, not args.no_install, timeouts)
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            for future in as_completed([pool.submit(checker.check, directory) for directory in directories]):
                results.append(future.result())
                print(f"checked {results[-1].directory}: {results[-1].causes[0] if results[-1].causes else 'ok'}", file=sys.stderr, flush=True)
                if args.json:
                    write_json(args.json, upstream, sorted(results, key=lambda result: result.directory))
    results.sort(key=lambda result: result.directory)
    total = totals(results)
    causes = causes_by_directories(results)
    print(table(results))
    print()
    print(summary(total))
    print("\ncauses by directories:")
    for cause, count in causes:
        print(f"{count:4d}  {cause}")
    return 0


def write_json(path: Path, upstream: Path, results: list[Result]) -> None:
    """The results so far (rewritten after each directory, so a stopped run leaves what it measured)."""
    payload = {"upstream": str(upstream), "totals": totals(results), "causes": causes_by_directories(results),
               "directories": [{**asdict(result), "tests_pass": result.tests_pass} for result in results]}
    path.write_text(json.dumps(payload, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
