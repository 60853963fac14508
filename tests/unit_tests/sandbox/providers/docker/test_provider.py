"""nemo_gym.sandbox.providers.docker.provider: upstream's docker configs as data (their defaults and checks), and what
the provider says where the docker CLI is but no daemon listens, or a spec names no image."""

from __future__ import annotations

import dataclasses

import pytest

from nemo_gym.sandbox import SandboxCreateError, SandboxProviderUnavailable, SandboxSpec
from nemo_gym.sandbox.providers.docker import DockerCreateConfig, DockerCreateError, DockerExecConfig, DockerProbeConfig, DockerProvider
from tests.unit_tests.sandbox.providers.test_unavailable import fake_binary


@pytest.mark.parametrize(
    "config_class, settings",
    [
        (DockerCreateConfig, {"network": "none", "read_only": True, "cap_drop": ["ALL"], "pids_limit": 512, "extra_run_args": ["-v", "/a:/b"], "publish_host": "::1"}),
        (DockerExecConfig, {"default_timeout_s": 30, "concurrency": 4, "exec_shell": "/bin/bash", "extra_exec_args": ["--privileged"]}),
        (DockerProbeConfig, {"command": "true", "expected_stdout": None, "deadline_s": 60, "stable_count": 2, "stable_delay_s": 0.5}),
    ],
)
def test_a_config_round_trips_through_its_dump(config_class, settings):
    config = config_class(**settings)
    dumped = dataclasses.asdict(config)
    assert {key: dumped[key] for key in settings} == settings
    assert config_class(**dumped) == config


def test_configs_have_upstreams_defaults():
    assert dataclasses.asdict(DockerCreateConfig()) == {
        "keepalive_shell": "/bin/sh", "keepalive_cmd": "while :; do sleep 2147483647; done", "start_timeout_s": 600, "use_init": True,
        "network": None, "read_only": False, "cap_drop": [], "security_opt": [], "pids_limit": None, "extra_run_args": [],
        "apply_resource_limits": True, "publish_host": "127.0.0.1",
    }  # fmt: skip
    assert dataclasses.asdict(DockerExecConfig()) == {"default_timeout_s": 180, "extra_exec_args": [], "concurrency": 32, "exec_shell": None}
    assert dataclasses.asdict(DockerProbeConfig()) == {
        "command": "printf docker-sandbox-ready", "expected_stdout": "docker-sandbox-ready", "timeout_s": 30, "deadline_s": None, "stable_count": 1, "stable_delay_s": 0.0,
    }  # fmt: skip


@pytest.mark.parametrize(
    "config_class, settings, message",
    [
        (DockerCreateConfig, {"start_timeout_s": 0}, "create.start_timeout_s must be > 0"),
        (DockerCreateConfig, {"pids_limit": -1}, "create.pids_limit must be > 0"),
        (DockerCreateConfig, {"publish_host": "localhost"}, "create.publish_host must be an IPv4 or IPv6 address"),
        (DockerExecConfig, {"concurrency": 0}, "exec.concurrency must be >= 1"),
        (DockerExecConfig, {"exec_shell": ""}, "exec.exec_shell must be null"),
        (DockerProbeConfig, {"stable_delay_s": -1}, "probe.stable_delay_s must be >= 0"),
    ],
)
def test_a_config_refuses_what_upstreams_refuses(config_class, settings, message):
    with pytest.raises(ValueError, match=message):
        config_class(**settings)


@pytest.mark.anyio
async def test_with_a_docker_cli_but_no_daemon_docker_says_the_daemon_is_missing(tmp_path, monkeypatch):
    fake_binary(tmp_path, "docker")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/docker.sock")
    with pytest.raises(SandboxProviderUnavailable, match=f"docker CLI is at {tmp_path}/docker but no docker daemon listens at unix://{tmp_path}/docker.sock"):
        await DockerProvider().create(SandboxSpec(image="python:3.12"))


@pytest.mark.anyio
async def test_docker_refuses_a_spec_without_an_image_as_upstreams_does():
    with pytest.raises(DockerCreateError, match="spec.image is required for the docker provider"):
        await DockerProvider().create(SandboxSpec())
    assert issubclass(DockerCreateError, SandboxCreateError)
