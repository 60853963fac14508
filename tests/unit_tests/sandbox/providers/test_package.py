"""nemo_gym.sandbox.providers: upstream's providers paths name the same types and registry as nemo_gym.sandbox."""

from __future__ import annotations


def test_upstreams_providers_paths_name_the_same_types_and_registry():
    import nemo_gym.sandbox as sandbox
    from nemo_gym.sandbox import providers
    from nemo_gym.sandbox.providers import base

    for name in base.__all__:
        assert getattr(base, name) is getattr(sandbox, name) is getattr(providers, name)
    assert providers.create_provider is sandbox.create_provider
