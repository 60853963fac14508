"""nemo_gym.sandbox.providers.unavailable: upstream's providers under upstream's names and paths, built from their configs
(mappings or instances) without their runtime, and a sandbox that says at use what this machine lacks. Each provider's
own configs are tested in its folder's test_provider.py."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from nemo_gym.sandbox import AsyncSandbox, SandboxHandle, SandboxProviderUnavailable, SandboxSpec, get_provider_class, list_providers
from nemo_gym.sandbox.providers.apptainer import ApptainerProvider
from nemo_gym.sandbox.providers.docker import DockerExecConfig, DockerProvider
from nemo_gym.sandbox.providers.docker import provider as docker_provider
from nemo_gym.sandbox.providers.enroot import EnrootProvider

CONTAINER_PROVIDERS = {"docker": DockerProvider, "apptainer": ApptainerProvider, "enroot": EnrootProvider}


def fake_binary(directory, name):
    path = directory / name
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_the_providers_are_registered_under_upstreams_names_as_their_classes():
    assert {"local", "docker", "apptainer", "enroot"} <= set(list_providers())
    assert {name: get_provider_class(name) for name in CONTAINER_PROVIDERS} == CONTAINER_PROVIDERS


def test_a_provider_module_imports_without_its_runtime_in_a_fresh_interpreter():
    code = (
        "import sys; from nemo_gym.sandbox.providers.docker import DockerCreateConfig, DockerProvider; "
        "from nemo_gym.sandbox.providers.apptainer import ApptainerProvider; from nemo_gym.sandbox.providers.enroot import EnrootProvider; "
        "DockerProvider(create=DockerCreateConfig(network='host')); ApptainerProvider(); EnrootProvider()"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env={**os.environ, "PATH": "/nonexistent"})
    assert result.returncode == 0, result.stderr


def test_a_provider_takes_its_configs_as_mappings_or_instances_and_refuses_anything_else():
    provider = DockerProvider(create={"network": "host", "extra_run_args": ["-v", "/a:/b"]}, exec=DockerExecConfig(concurrency=2))
    assert (provider._create_config.network, provider._create_config.extra_run_args, provider._exec_config.concurrency) == ("host", ["-v", "/a:/b"], 2)
    assert ApptainerProvider(exec={"default_binds": ["/x:/y"]})._exec_config.default_binds == ["/x:/y"]
    with pytest.raises(TypeError, match="DockerProbeConfig must be a mapping"):
        DockerProvider(probe=["printf"])
    with pytest.raises(TypeError):
        DockerProvider(create={"networks": "host"})


@pytest.mark.anyio
@pytest.mark.parametrize("name", CONTAINER_PROVIDERS)
async def test_without_its_binary_a_sandbox_says_at_use_that_the_binary_is_missing(name, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    sandbox = AsyncSandbox({name: {}}, SandboxSpec(image="python:3.12"))
    with pytest.raises(SandboxProviderUnavailable, match=f"{name} is not available on this machine: the {name} provider needs the {name} CLI, not found on PATH.*use the local provider"):
        await sandbox.start()


@pytest.mark.anyio
@pytest.mark.parametrize("name", CONTAINER_PROVIDERS)
async def test_with_its_runtime_present_a_provider_still_says_this_project_does_not_drive_it(name, tmp_path, monkeypatch):
    fake_binary(tmp_path, name)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(docker_provider, "daemon_listens", lambda address: True)
    provider = CONTAINER_PROVIDERS[name]()
    handle = SandboxHandle("a", name, None)
    for use in (provider.create(SandboxSpec(image="python:3.12")), provider.exec(handle, "true"), provider.status(handle), provider.close(handle)):
        with pytest.raises(SandboxProviderUnavailable, match=f"{tmp_path}/{name}.* is here, but this project does not drive {name} containers"):
            await use
    await provider.aclose()


REMOTE_SECTIONS = {
    "daytona": ("connection", "create", "probe", "operations", "batch"),
    "opensandbox": ("connection", "create", "probe", "operations", "attribution"),
    "openshell": ("connection", "create", "exec", "probe", "operations"),
}


@pytest.mark.anyio
@pytest.mark.parametrize("name, module", [("daytona", "daytona"), ("opensandbox", "opensandbox"), ("openshell", "openshell")])
async def test_a_remote_provider_builds_from_its_sections_and_says_at_use_that_its_service_and_sdk_are_missing(name, module):
    provider = get_provider_class(name)(**{section: {} for section in REMOTE_SECTIONS[name]})
    with pytest.raises(SandboxProviderUnavailable, match=f"{name} is not available on this machine: the {name} provider needs .* SDK \\(module '{module}'\\), not installed; use the local provider"):
        await AsyncSandbox(provider, SandboxSpec(image="python:3.12")).start()


@pytest.mark.anyio
@pytest.mark.parametrize("name", ["docker", "apptainer", "enroot", "daytona", "ecs_fargate", "opensandbox", "openshell"])
async def test_a_provider_that_cannot_run_here_loads_from_its_config_and_says_so_at_use(name, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    sandbox = AsyncSandbox({name: {}}, SandboxSpec(image="python:3.12"))
    with pytest.raises(SandboxProviderUnavailable, match=f"{name} is not available on this machine: .*; use the local provider"):
        await sandbox.start()
