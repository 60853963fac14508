"""nemo_gym.sandbox.providers.enroot.provider: upstream's enroot configs as data, their defaults and checks."""

from __future__ import annotations

import dataclasses

import pytest

from nemo_gym.sandbox.providers.enroot import EnrootCreateConfig, EnrootExecConfig, EnrootProbeConfig


@pytest.mark.parametrize(
    "config_class, settings",
    [
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
    enroot = dataclasses.asdict(EnrootCreateConfig())
    assert (enroot["mount_point"], enroot["import_timeout_s"], enroot["init_command"], enroot["bypass_entrypoint"]) == ("/sandbox", 1800, "while true; do sleep 86400; done", True)
    assert EnrootExecConfig().exec_shell == "sh"
    assert EnrootProbeConfig().expected_stdout == "enroot-sandbox-ready"


@pytest.mark.parametrize(
    "config_class, settings, message",
    [
        (EnrootCreateConfig, {"import_timeout_s": 0}, "create.import_timeout_s must be > 0"),
        (EnrootCreateConfig, {"start_poll_s": 0}, "create.start_poll_s must be > 0"),
        (EnrootProbeConfig, {"stable_count": 0}, "probe.stable_count must be >= 1"),
    ],
)
def test_a_config_refuses_what_upstreams_refuses(config_class, settings, message):
    with pytest.raises(ValueError, match=message):
        config_class(**settings)
