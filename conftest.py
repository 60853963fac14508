"""Fixtures shared by every test folder: an asyncio backend, a private state dir, and running servers."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import hypothesis
import pytest

# Property-based tests have no time limit per example: a deadline asserts wall-clock time, which a loaded machine
# cannot give (an example that took 0.2 ms once took 355 ms beside the suite's servers).
hypothesis.settings.register_profile("suite", deadline=None)
hypothesis.settings.load_profile("suite")

# Signing secrets made by the tests go to a directory of this run's own, removed when it ends.
OWN_STATE_DIR = None
if "NEMO_GYM_STATE_DIR" not in os.environ:
    OWN_STATE_DIR = os.environ["NEMO_GYM_STATE_DIR"] = tempfile.mkdtemp(prefix="nemo_gym_test_state_")

from nemo_gym import config as gym_config  # noqa: E402
from nemo_gym.process import discovery
from nemo_gym.process.launcher import Launcher  # noqa: E402
from tests.failed_runs import keep_if_failed  # noqa: E402


def pytest_unconfigure(config: pytest.Config) -> None:
    if OWN_STATE_DIR is not None:
        shutil.rmtree(OWN_STATE_DIR, ignore_errors=True)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@contextlib.contextmanager
def servers_started(session: pytest.Session) -> Iterator[Callable[..., Launcher]]:
    """A function that starts a config (a mapping in the YAML shape) as real processes; all are stopped by PID at the end.
    Where a test failed while they ran, their logs (each process's and each worker's) are kept first, and the
    folder named.

    ``timeout`` defaults to the launcher's, which grows with the number of workers."""
    launchers: list[Launcher] = []
    failed_before = session.testsfailed

    def start(data: dict[str, Any], extra_env: dict[str, str] | None = None, timeout: float | None = None) -> Launcher:
        instances = gym_config.parse(data)
        discovery.check_settings(instances)
        launcher = Launcher(instances, gym_config.free_port(), extra_env)
        launchers.append(launcher)
        return launcher.start(timeout)

    try:
        yield start
    finally:
        for launcher in launchers:
            # A start that failed has removed its directory already, and its error quotes the logs.
            if launcher.run_dir is not None and launcher.run_dir.exists():
                keep_if_failed(session, failed_before, launcher.run_dir.name, functools.partial(shutil.copytree, launcher.run_dir, dirs_exist_ok=True, ignore_dangling_symlinks=True))
            launcher.stop()


@pytest.fixture
def start_servers(request: pytest.FixtureRequest) -> Iterator[Callable[..., Launcher]]:
    """Servers for one test."""
    with servers_started(request.session) as start:
        yield start


@pytest.fixture(scope="module")
def start_module_servers(request: pytest.FixtureRequest) -> Iterator[Callable[..., Launcher]]:
    """Servers shared by the tests of one module."""
    with servers_started(request.session) as start:
        yield start
