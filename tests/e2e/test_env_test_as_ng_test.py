"""`gym env test` runs a server's own tests as upstream's `ng_test` does: from the server's directory,
with it and its root on PYTHONPATH, and async tests unmarked (asyncio_mode=auto) where pytest-asyncio is installed."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_gym.config import REPO_ROOT

NAME = "ng_test_style"
APP = '''
from nemo_gym.base_resources_server import BaseResourcesServerConfig, BaseVerifyRequest, BaseVerifyResponse, SimpleResourcesServer


class NgTestStyleConfig(BaseResourcesServerConfig):
    pass


class NgTestStyleServer(SimpleResourcesServer):
    config: NgTestStyleConfig

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        return BaseVerifyResponse(**body.model_dump(), reward=1.0)
'''
TESTS = '''
import json

import util
from resources_servers.ng_test_style.app import NgTestStyleServer


def test_a_sibling_module_imports_bare_and_data_opens_relative_to_the_server_directory():
    assert util.ANSWER == 42 and NgTestStyleServer.__name__ == "NgTestStyleServer"
    with open("data/example.jsonl") as rows:
        assert json.loads(rows.readline())["responses_create_params"]["input"] == "hi"
'''
ASYNC_TEST = '''
import asyncio


async def test_an_unmarked_async_test_runs():
    await asyncio.sleep(0)
'''
GYM_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}


def make_server(root: Path, with_async_test: bool) -> Path:
    directory = root / "resources_servers" / NAME
    (directory / "tests").mkdir(parents=True)
    (directory / "data").mkdir()
    (directory / "app.py").write_text(APP)
    (directory / "util.py").write_text("ANSWER = 42\n")
    (directory / "data" / "example.jsonl").write_text('{"responses_create_params": {"input": "hi"}}\n')
    (directory / "tests" / "test_app.py").write_text(TESTS)
    if with_async_test:
        (directory / "tests" / "test_async.py").write_text(ASYNC_TEST)
    return directory


def env_test(directory: Path, cwd: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "nemo_gym.cli.main", "env", "test", "--resources-server", str(directory)]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=cwd, env=GYM_ENV)


def test_env_test_runs_from_the_server_directory_with_it_and_its_root_importable(tmp_path):
    finished = env_test(make_server(tmp_path / "checkout", with_async_test=False), cwd=tmp_path)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert "1 passed" in finished.stdout


@pytest.mark.skipif(importlib.util.find_spec("pytest_asyncio") is None, reason="pytest-asyncio is not installed")
def test_env_test_runs_an_unmarked_async_test_where_pytest_asyncio_is_installed(tmp_path):
    finished = env_test(make_server(tmp_path / "checkout", with_async_test=True), cwd=tmp_path)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert "2 passed" in finished.stdout
