"""nemo_gym.sandbox.providers.daytona.provider: upstream's daytona configs, their defaults and checks."""

from __future__ import annotations

import pytest

from nemo_gym.sandbox.providers.daytona import DaytonaBatchConfig, DaytonaCreateConfig, DaytonaProvider, DaytonaProviderOptions


def test_configs_have_upstreams_defaults_and_checks():
    assert (DaytonaCreateConfig().timeout_s, DaytonaBatchConfig().concurrency) == (60.0, 4)
    assert DaytonaProviderOptions.from_mapping({"snapshot_id": "s", "volumes": [{"id": "v"}]}).volumes == ({"id": "v"},)
    with pytest.raises(ValueError, match="Unsupported Daytona DaytonaCreateConfig settings: timeout"):
        DaytonaProvider(create={"timeout": 5})
