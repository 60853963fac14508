"""nemo_gym.sandbox.providers.opensandbox.provider: upstream's opensandbox configs, their defaults and checks."""

from __future__ import annotations

import pytest

from nemo_gym.sandbox.providers.opensandbox import OpenSandboxAttributionConfig, OpenSandboxCreateConfig


def test_configs_have_upstreams_defaults_and_checks():
    assert OpenSandboxAttributionConfig(key_prefix="example.com").key_prefix == "example.com/"
    with pytest.raises(ValueError, match="image_pull_policy must be one of: Always, IfNotPresent, Never"):
        OpenSandboxCreateConfig(image_pull_policy="Sometimes")
    with pytest.raises(ValueError, match="must be a lowercase DNS subdomain"):
        OpenSandboxAttributionConfig(key_prefix="Not_A_Domain")
