"""nemo_gym.ray_cluster.cluster, where Ray is not installed: joining a cluster says who needs Ray and which extra
installs it, and an import error of another module inside Ray is not taken for Ray missing; a local start whose node
did not register in time is tried again, with a stand-in for Ray that starts real processes. Joining and starting
real clusters is tested end to end (tests/e2e/ray/test_local_cluster.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from nemo_gym.process.parent import children
from nemo_gym.ray_cluster.cluster import LOCAL_START_ATTEMPTS, join, ray_module, start_local
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


class StartingRay:
    """A stand-in for ``ray`` whose ``init`` starts a real child process as a node would, then fails as Ray does
    when its node did not register in time, as many times as ``failures`` says (or with ``error``)."""

    def __init__(self, failures: int, error: str = "The current node timed out during startup. This could happen ...") -> None:
        self.failures = failures
        self.error = error
        self.nodes: list[subprocess.Popen] = []

    def init(self, ignore_reinit_error: bool) -> None:
        self.nodes.append(subprocess.Popen(["sleep", "60"]))
        if len(self.nodes) <= self.failures:
            raise Exception(self.error)

    def end(self) -> None:
        for node in self.nodes:
            node.kill()
            node.wait()


def test_a_local_start_whose_node_did_not_register_in_time_is_tried_again_once_its_processes_are_gone():
    ray = StartingRay(failures=1)
    try:
        start_local(ray)
        first, second = ray.nodes
        assert first.poll() is not None  # killed and reaped before the second start
        assert second.poll() is None and children(os.getpid()) >= {second.pid}
    finally:
        ray.end()


def test_a_local_start_that_fails_otherwise_or_every_time_raises_rays_error():
    for ray, tries in ((StartingRay(failures=1, error="GCS failed to start"), 1), (StartingRay(failures=LOCAL_START_ATTEMPTS), LOCAL_START_ATTEMPTS)):
        try:
            with pytest.raises(Exception, match=re.escape(ray.error)):
                start_local(ray)
            assert len(ray.nodes) == tries
        finally:
            ray.end()
