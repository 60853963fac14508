"""nemo_gym.sandbox.registry: a provider config names exactly one registered provider; a name is registered once."""

from __future__ import annotations

import pytest

from nemo_gym.sandbox import create_provider, list_providers, register_provider


def test_provider_configs_name_one_known_provider():
    assert {"local", "docker", "apptainer"} <= set(list_providers())
    with pytest.raises(ValueError, match="unknown sandbox provider 'kubevirt'"):
        create_provider({"kubevirt": {}})
    with pytest.raises(ValueError, match="exactly one key"):
        create_provider({"local": {}, "docker": {}})
    with pytest.raises(ValueError, match="already registered"):
        register_provider("local", object)
