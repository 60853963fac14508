"""nemo_gym.ray_cluster.cluster, where Ray is not installed: joining a cluster says who needs Ray and which extra
installs it, and an import error of another module inside Ray is not taken for Ray missing. Joining and starting real clusters is tested end to end
(tests/e2e/ray/test_local_cluster.py)."""

from __future__ import annotations

import re
import sys

import pytest

from nemo_gym.ray_cluster.cluster import join, ray_module
from nemo_gym.ray_cluster.need import RAY_EXTRA, RayMissing


@pytest.fixture
def no_ray(monkeypatch):
    """As if ray were not installed: ``import ray`` raises ModuleNotFoundError."""
    monkeypatch.setitem(sys.modules, "ray", None)


def test_without_ray_joining_names_who_needs_it_and_the_extra(no_ray):
    with pytest.raises(RayMissing, match=re.escape(f"the launcher needs Ray, which is not installed: install the ray extra ({RAY_EXTRA})")):
        join("10.0.0.1:6379", what="the launcher")
    with pytest.raises(RayMissing, match="this process needs Ray"):
        ray_module("this process")


def test_an_import_error_inside_ray_that_is_not_ray_missing_is_raised_as_it_is(monkeypatch):
    class Broken:
        def find_spec(self, name, path=None, target=None):
            if name == "ray":
                raise ImportError("libfoo.so: cannot open shared object file", name="libfoo")

    monkeypatch.delitem(sys.modules, "ray", raising=False)
    monkeypatch.setattr(sys, "meta_path", [Broken(), *sys.meta_path])
    with pytest.raises(ImportError, match="libfoo.so") as raised:
        ray_module("this process")
    assert not isinstance(raised.value, RayMissing)
