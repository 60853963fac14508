"""Upstream's container providers (docker, apptainer, enroot) under upstream's paths: their configs are data as upstream's, and a sandbox says at use what this machine lacks."""

from __future__ import annotations

import dataclasses
import os
import stat
import subprocess
import sys

import pytest

from nemo_gym.sandbox import AsyncSandbox, SandboxCreateError, SandboxHandle, SandboxProviderUnavailable, SandboxSpec, get_provider_class, list_providers
from nemo_gym.sandbox.providers.apptainer import ApptainerCreateConfig, ApptainerExecConfig, ApptainerProbeConfig, ApptainerProvider
from nemo_gym.sandbox.providers.apptainer import provider as apptainer_provider
from nemo_gym.sandbox.providers.docker import DockerCreateConfig, DockerCreateError, DockerExecConfig, DockerProbeConfig, DockerProvider
from nemo_gym.sandbox.providers.docker import provider as docker_provider
from nemo_gym.sandbox.providers.enroot import EnrootCreateConfig, EnrootExecConfig, EnrootProbeConfig, EnrootProvider

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


@pytest.mark.parametrize(
    "config_class, settings",
    [
        (DockerCreateConfig, {"network": "none", "read_only": True, "cap_drop": ["ALL"], "pids_limit": 512, "extra_run_args": ["-v", "/a:/b"], "publish_host": "::1"}),
        (DockerExecConfig, {"default_timeout_s": 30, "concurrency": 4, "exec_shell": "/bin/bash", "extra_exec_args": ["--privileged"]}),
        (DockerProbeConfig, {"command": "true", "expected_stdout": None, "deadline_s": 60, "stable_count": 2, "stable_delay_s": 0.5}),
        (ApptainerCreateConfig, {"mount_point": "/work", "start_timeout_s": None, "extra_start_args": ["--writable-tmpfs"]}),
        (ApptainerExecConfig, {"fakeroot_for_root": False, "default_binds": ["/a:/b:ro"], "concurrency": 1}),
        (ApptainerProbeConfig, {"timeout_s": 5}),
        (EnrootCreateConfig, {"base_dir": "/scratch", "rw": False, "remap_root": True, "start_poll_s": 0.1, "extra_import_args": ["--arch", "x86_64"]}),
        (EnrootExecConfig, {"exec_shell": "bash", "default_mounts": ["/a:/b"]}),
        (EnrootProbeConfig, {"timeout_s": 60, "deadline_s": 180, "stable_count": 2, "stable_delay_s": 1.0}),
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
    assert dataclasses.asdict(ApptainerCreateConfig()) == {"mount_point": "/sandbox", "start_timeout_s": 600, "extra_start_args": [], "apply_resource_limits": True}
    assert dataclasses.asdict(ApptainerExecConfig()) == {"default_timeout_s": 180, "fakeroot_for_root": True, "default_binds": [], "extra_exec_args": [], "concurrency": 32}
    assert ApptainerProbeConfig().command == "printf apptainer-sandbox-ready"
    enroot = dataclasses.asdict(EnrootCreateConfig())
    assert (enroot["mount_point"], enroot["import_timeout_s"], enroot["init_command"], enroot["bypass_entrypoint"]) == ("/sandbox", 1800, "while true; do sleep 86400; done", True)
    assert EnrootExecConfig().exec_shell == "sh"
    assert EnrootProbeConfig().expected_stdout == "enroot-sandbox-ready"


@pytest.mark.parametrize(
    "config_class, settings, message",
    [
        (DockerCreateConfig, {"start_timeout_s": 0}, "create.start_timeout_s must be > 0"),
        (DockerCreateConfig, {"pids_limit": -1}, "create.pids_limit must be > 0"),
        (DockerCreateConfig, {"publish_host": "localhost"}, "create.publish_host must be an IPv4 or IPv6 address"),
        (DockerExecConfig, {"concurrency": 0}, "exec.concurrency must be >= 1"),
        (DockerExecConfig, {"exec_shell": ""}, "exec.exec_shell must be null"),
        (DockerProbeConfig, {"stable_delay_s": -1}, "probe.stable_delay_s must be >= 0"),
        (ApptainerCreateConfig, {"mount_point": "sandbox"}, "create.mount_point must be an absolute path"),
        (ApptainerExecConfig, {"default_timeout_s": -5}, "exec.default_timeout_s must be > 0"),
        (EnrootCreateConfig, {"import_timeout_s": 0}, "create.import_timeout_s must be > 0"),
        (EnrootCreateConfig, {"start_poll_s": 0}, "create.start_poll_s must be > 0"),
        (EnrootProbeConfig, {"stable_count": 0}, "probe.stable_count must be >= 1"),
    ],
)
def test_a_config_refuses_what_upstreams_refuses(config_class, settings, message):
    with pytest.raises(ValueError, match=message):
        config_class(**settings)


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
async def test_with_a_docker_cli_but_no_daemon_docker_says_the_daemon_is_missing(tmp_path, monkeypatch):
    fake_binary(tmp_path, "docker")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/docker.sock")
    with pytest.raises(SandboxProviderUnavailable, match=f"docker CLI is at {tmp_path}/docker but no docker daemon listens at unix://{tmp_path}/docker.sock"):
        await DockerProvider().create(SandboxSpec(image="python:3.12"))


@pytest.mark.anyio
async def test_apptainer_looks_for_its_binary_in_bin_path_when_given(tmp_path, monkeypatch):
    fake_binary(tmp_path, "apptainer")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert apptainer_provider._require_apptainer(str(tmp_path)) == str(tmp_path / "apptainer")
    with pytest.raises(SandboxProviderUnavailable, match=f"apptainer CLI, not found in {tmp_path}/bin"):
        await ApptainerProvider(bin_path=str(tmp_path / "bin")).create(SandboxSpec(image="python:3.12"))


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


@pytest.mark.anyio
async def test_docker_refuses_a_spec_without_an_image_as_upstreams_does():
    with pytest.raises(DockerCreateError, match="spec.image is required for the docker provider"):
        await DockerProvider().create(SandboxSpec())
    assert issubclass(DockerCreateError, SandboxCreateError)


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


def test_remote_configs_have_upstreams_defaults_and_checks():
    from nemo_gym.sandbox.providers.daytona import DaytonaBatchConfig, DaytonaCreateConfig, DaytonaProviderOptions, DaytonaProvider
    from nemo_gym.sandbox.providers.opensandbox import OpenSandboxAttributionConfig, OpenSandboxCreateConfig
    from nemo_gym.sandbox.providers.openshell import OpenShellConnectionConfig, OpenShellProbeConfig, OpenShellProviderOptions

    assert (DaytonaCreateConfig().timeout_s, DaytonaBatchConfig().concurrency, OpenShellProbeConfig().deadline_s) == (60.0, 4, 60)
    assert OpenSandboxAttributionConfig(key_prefix="example.com").key_prefix == "example.com/"
    assert DaytonaProviderOptions.from_mapping({"snapshot_id": "s", "volumes": [{"id": "v"}]}).volumes == ({"id": "v"},)
    assert OpenShellProviderOptions.from_mapping({"providers": "github"}).providers == ["github"]
    with pytest.raises(ValueError, match="Unsupported Daytona DaytonaCreateConfig settings: timeout"):
        DaytonaProvider(create={"timeout": 5})
    with pytest.raises(ValueError, match="image_pull_policy must be one of: Always, IfNotPresent, Never"):
        OpenSandboxCreateConfig(image_pull_policy="Sometimes")
    with pytest.raises(ValueError, match="must be a lowercase DNS subdomain"):
        OpenSandboxAttributionConfig(key_prefix="Not_A_Domain")
    with pytest.raises(ValueError, match="tls_cert_path and connection.tls_key_path must be set together"):
        OpenShellConnectionConfig(tls_cert_path="/cert.pem")
    with pytest.raises(ValueError, match="Unknown openshell provider_options keys"):
        OpenShellProviderOptions.from_mapping({"provider": "github"})


def test_ecs_fargate_settings_build_upstreams_config_as_its_mapping_does():
    from nemo_gym.sandbox.providers.ecs_fargate import EcsFargateConfig, EcsFargateProvider, SshSidecarConfig, engine_config_from_mapping

    config = engine_config_from_mapping({"region": "us-east-1", "cluster": "c", "cpu": 2048, "subnets": ["s-1"], "ssh_sidecar": {"public_key_secret_arn": "pub", "private_key_secret_arn": "priv"}})
    assert (config.cpu, config.assign_public_ip, config.subnets, config.memory) == ("2048", True, ["s-1"], "8192")
    assert config.ssh_sidecar == SshSidecarConfig(sshd_port=52222, public_key_secret_arn="pub", private_key_secret_arn="priv", exec_server_port=19542)
    assert EcsFargateProvider(cluster="c")._cfg == EcsFargateConfig(cluster="c", assign_public_ip=True)
    with pytest.raises(ValueError, match="ssh_sidecar.public_key_secret_arn and ssh_sidecar.private_key_secret_arn are required"):
        engine_config_from_mapping({"ssh_sidecar": {"public_key_secret_arn": "pub"}})
