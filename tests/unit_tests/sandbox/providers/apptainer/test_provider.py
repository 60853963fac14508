"""nemo_gym.sandbox.providers.apptainer.provider: upstream's apptainer configs as data (their defaults and checks),
and the binary looked for in ``bin_path`` when given."""

from __future__ import annotations

import dataclasses

import pytest

from nemo_gym.sandbox import SandboxProviderUnavailable, SandboxSpec
from nemo_gym.sandbox.providers.apptainer import ApptainerCreateConfig, ApptainerExecConfig, ApptainerProbeConfig, ApptainerProvider
from nemo_gym.sandbox.providers.apptainer import provider as apptainer_provider
from tests.unit_tests.sandbox.providers.test_unavailable import fake_binary


@pytest.mark.parametrize(
    "config_class, settings",
    [
        (ApptainerCreateConfig, {"mount_point": "/work", "start_timeout_s": None, "extra_start_args": ["--writable-tmpfs"]}),
        (ApptainerExecConfig, {"fakeroot_for_root": False, "default_binds": ["/a:/b:ro"], "concurrency": 1}),
        (ApptainerProbeConfig, {"timeout_s": 5}),
    ],
)
def test_a_config_round_trips_through_its_dump(config_class, settings):
    config = config_class(**settings)
    dumped = dataclasses.asdict(config)
    assert {key: dumped[key] for key in settings} == settings
    assert config_class(**dumped) == config


def test_configs_have_upstreams_defaults():
    assert dataclasses.asdict(ApptainerCreateConfig()) == {"mount_point": "/sandbox", "start_timeout_s": 600, "extra_start_args": [], "apply_resource_limits": True}
    assert dataclasses.asdict(ApptainerExecConfig()) == {"default_timeout_s": 180, "fakeroot_for_root": True, "default_binds": [], "extra_exec_args": [], "concurrency": 32}
    assert ApptainerProbeConfig().command == "printf apptainer-sandbox-ready"


@pytest.mark.parametrize(
    "config_class, settings, message",
    [
        (ApptainerCreateConfig, {"mount_point": "sandbox"}, "create.mount_point must be an absolute path"),
        (ApptainerExecConfig, {"default_timeout_s": -5}, "exec.default_timeout_s must be > 0"),
    ],
)
def test_a_config_refuses_what_upstreams_refuses(config_class, settings, message):
    with pytest.raises(ValueError, match=message):
        config_class(**settings)


@pytest.mark.anyio
async def test_apptainer_looks_for_its_binary_in_bin_path_when_given(tmp_path, monkeypatch):
    fake_binary(tmp_path, "apptainer")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert apptainer_provider._require_apptainer(str(tmp_path)) == str(tmp_path / "apptainer")
    with pytest.raises(SandboxProviderUnavailable, match=f"apptainer CLI, not found in {tmp_path}/bin"):
        await ApptainerProvider(bin_path=str(tmp_path / "bin")).create(SandboxSpec(image="python:3.12"))
