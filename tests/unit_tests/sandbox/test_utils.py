"""nemo_gym.sandbox.utils: upstream's rewrite_image, the first matching prefix rewrite of an image name."""

from __future__ import annotations

from nemo_gym.sandbox.utils import rewrite_image


def test_rewrite_image_applies_the_first_matching_prefix_rewrite():
    rewrites = [{"from": "docker.io/", "to": "mirror.local/"}, {"from": "docker.io/library/", "to": "never/"}]
    assert rewrite_image("docker.io/library/python:3.11", rewrites) == "mirror.local/library/python:3.11"
    assert rewrite_image("ghcr.io/x:1", rewrites) == "ghcr.io/x:1"
    assert rewrite_image(None, rewrites) is None
