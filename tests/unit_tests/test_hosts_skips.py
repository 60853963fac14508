"""A test that needs a program this machine lacks skips, naming the program and its package (tests/programs.py):
the tests with real hosts without ``ip`` or HAProxy, swe_rebench's without bubblewrap; they never error half-way."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests import hosts
from resources_servers.swe_rebench.tests.test_app import make_server
from tests.hosts import Hosts, HostsUnavailable
from tests.programs import lacking

REPO = Path(__file__).resolve().parents[2]
HOSTS_TEST = "tests/e2e/hosts/test_hosts_harness.py::test_hosts_reach_each_other_by_address_and_by_name"
RUN_TIMEOUT_SECONDS = 120


def path_without(directory: Path, *programs: str) -> str:
    """A PATH of one directory holding a link to every program of this PATH but ``programs``."""
    directory.mkdir()
    for entry in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(entry):
            continue
        for name in os.listdir(entry):
            target = os.path.join(entry, name)
            link = directory / name
            if name not in programs and not link.exists() and os.access(target, os.X_OK) and os.path.isfile(target):
                link.symlink_to(target)
    return str(directory)


def test_a_program_not_on_path_is_named_with_the_package_that_has_it(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", path_without(tmp_path / "bin", "haproxy", "ip"))
    assert lacking("haproxy", "ip", "sh") == "no haproxy (install: apt-get install haproxy); no ip (install: apt-get install iproute2)"
    assert lacking("sh") is None


def test_hosts_without_ip_are_unavailable_naming_iproute2_and_make_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", path_without(tmp_path / "bin", "ip"))
    monkeypatch.setattr(hosts.os, "geteuid", lambda: 0)
    monkeypatch.setattr(hosts, "sweep_stale", lambda: pytest.fail("the hosts were started on"))
    with pytest.raises(HostsUnavailable, match=r"^no ip \(install: apt-get install iproute2\)$"):
        Hosts(["h1"]).__enter__()


def test_a_hosts_test_without_haproxy_on_path_is_skipped_saying_so():
    # Outside /tmp, which a host's own /tmp would hide: without the check, the hosts are made and run from this PATH.
    with tempfile.TemporaryDirectory(dir="/var/tmp") as directory:
        env = {**os.environ, "PATH": path_without(Path(directory) / "bin", "haproxy"), "NEMO_GYM_MULTIWORKER_E2E": "1"}
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", HOSTS_TEST],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_SECONDS,
        )
    assert run.returncode == 0 and "1 skipped" in run.stdout, run.stdout + run.stderr
    assert "no haproxy (install: apt-get install haproxy)" in run.stdout, run.stdout


def test_a_jailed_swe_rebench_server_without_bwrap_skips_its_test_naming_bubblewrap(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", path_without(tmp_path / "bin", "bwrap"))
    with pytest.raises(pytest.skip.Exception, match=r"^no bwrap \(install: apt-get install bubblewrap\)$"):
        make_server(tmp_path / "sandboxes")
