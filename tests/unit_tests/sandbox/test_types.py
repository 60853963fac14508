"""nemo_gym.sandbox.types: a spec's resources, from a mapping, refuse a key they do not know."""

from __future__ import annotations

import pytest

from nemo_gym.sandbox import SandboxResources, SandboxSpec


def test_resources_from_a_mapping_refuse_an_unknown_key():
    assert SandboxSpec(resources={"cpu": 2, "memory_mib": 512}).resources == SandboxResources(cpu=2, memory_mib=512)
    with pytest.raises(ValueError, match="unknown sandbox resources: cores"):
        SandboxSpec(resources={"cores": 2})
