"""Sandbox cgroups: found on v1 and v2 layouts, capped, made and removed with their sandbox, swept, refused clearly.

The v2 layout is a fake tree here (this project's machines mount v1): its mountinfo, /proc/self/cgroup and
cgroup files are plain files, which is all the code reads and writes.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from resources_servers.swe_rebench.cgroups import CgroupError, Cgroups, instance_name
from resources_servers.swe_rebench.tests.test_app import make_server, seeded, verify

MIB = 1 << 20


def fake_proc(tmp_path: Path, mountinfo: str, cgroup: str) -> Path:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "mountinfo").write_text(mountinfo)
    (proc / "self" / "cgroup").write_text(cgroup)
    return proc


@pytest.fixture
def v2_tree(tmp_path):
    """A cgroup v2 hierarchy at <tmp>/unified with the server in /server.slice, memory and pids offered."""
    unified = tmp_path / "unified"
    (unified / "server.slice").mkdir(parents=True)
    for directory in (unified, unified / "server.slice"):
        (directory / "cgroup.controllers").write_text("cpu io memory pids\n")
        (directory / "cgroup.subtree_control").write_text("")
    mountinfo = f"30 25 0:26 / {unified} rw,nosuid - cgroup2 cgroup2 rw\n"
    return unified, fake_proc(tmp_path, mountinfo, "0::/server.slice\n")


def test_a_sandbox_root_at_the_same_path_on_another_mount_has_its_own_cgroups(tmp_path):
    """Hosts or containers with a /tmp of their own share the machine's cgroups: two servers whose sandbox roots are one
    path on different mounts must not name one cgroup directory, or each one's sweep removes the other's cgroups (and
    a seed there fails on a cgroup gone under it). The same root, made meanwhile, keeps its name."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("mounting a file system of its own needs root and unshare (util-linux)")
    root = tmp_path / "sandboxes"
    name = instance_name(root)
    code = f"from pathlib import Path; from resources_servers.swe_rebench.cgroups import instance_name; print(instance_name(Path({str(root)!r})))"
    mounted = 'mount -t tmpfs tmpfs "$1" && exec "$2" -c "$3"'
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", mounted, "sh", str(tmp_path), sys.executable, code]
    other = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[3])
    assert other.returncode == 0, other.stderr
    root.mkdir()
    assert (other.stdout.strip() != name, instance_name(root)) == (True, name)


def test_v2_sandbox_cgroups_go_below_the_servers_own_with_memory_and_pids_capped(v2_tree):
    unified, proc = v2_tree
    # What the kernel would make with the instance's directory.
    made = unified / "server.slice" / instance_name(Path("/srv/sandboxes"))
    made.mkdir()
    (made / "cgroup.controllers").write_text("memory pids\n")
    (made / "cgroup.subtree_control").write_text("")
    cgroups = Cgroups.for_root(Path("/srv/sandboxes"), 64 * MIB, 40, proc=proc)
    assert cgroups.version == 2
    assert cgroups.groups == (made,)
    group = made
    for directory in (unified / "server.slice", made):
        assert (directory / "cgroup.subtree_control").read_text() == "+memory +pids"
    cgroup = cgroups.make("worker-abc/sandbox-def")
    (directory,) = cgroup.dirs
    assert directory == group / "worker-abc.sandbox-def"
    assert (directory / "memory.max").read_text() == str(64 * MIB)
    assert (directory / "memory.oom.group").read_text() == "1"
    assert (directory / "pids.max").read_text() == "40"
    assert cgroup.join_files() == [str(directory / "cgroup.procs")]
    (directory / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n")
    (directory / "pids.events").write_text("max 5\n")
    usage = cgroup.usage()
    assert (usage.oom_kills, usage.refused_forks) == (2, 5)


def test_v2_without_the_memory_controller_refuses_to_start_and_says_why(v2_tree):
    unified, proc = v2_tree
    (unified / "server.slice" / "cgroup.controllers").write_text("cpu io pids\n")
    with pytest.raises(CgroupError, match="does not offer the memory controller"):
        Cgroups.for_root(Path("/srv/sandboxes"), 64 * MIB, 40, proc=proc)


def test_no_cgroup_hierarchy_refuses_to_start_and_says_why(tmp_path):
    proc = fake_proc(tmp_path, "22 1 0:21 / /proc rw - proc proc rw\n", "0::/\n")
    with pytest.raises(CgroupError, match="neither cgroup v1 memory and pids hierarchies nor a cgroup v2"):
        Cgroups.for_root(Path("/srv/sandboxes"), 64 * MIB, 40, proc=proc)


def test_v1_hierarchies_are_found_below_the_servers_own_cgroup_of_each(tmp_path):
    mountinfo = (
        f"40 25 0:35 / {tmp_path}/memory rw - cgroup cgroup rw,memory\n"
        f"41 25 0:36 / {tmp_path}/pids rw - cgroup cgroup rw,pids\n"
        f"42 25 0:37 / {tmp_path}/unified rw - cgroup2 cgroup2 rw\n"
    )
    proc = fake_proc(tmp_path, mountinfo, "8:pids:/\n4:memory:/jobs/one\n0::/\n")
    (tmp_path / "memory" / "jobs" / "one").mkdir(parents=True)
    (tmp_path / "pids").mkdir()
    cgroups = Cgroups.for_root(Path("/srv/sandboxes"), 64 * MIB, 40, proc=proc)
    assert cgroups.version == 1
    assert [group.parent for group in cgroups.groups] == [tmp_path / "memory" / "jobs" / "one", tmp_path / "pids"]


def test_a_server_that_cannot_write_its_cgroups_refuses_to_start_and_says_why(tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    with pytest.raises(CgroupError, match="cannot make one in .*not-a-directory.*unsafe_no_jail"):
        make_server(tmp_path / "sandboxes", cgroup_parent=str(blocker))


def test_a_sandboxs_cgroup_is_made_with_it_removed_with_it_and_swept_when_its_sandbox_is_gone(tmp_path):
    server = make_server(tmp_path / "sandboxes", max_memory_mb=96, max_processes=30)
    groups = server.root.cgroups.groups
    with TestClient(server.build_app()) as client:
        seeded(client)
        (sandbox,) = server.sandboxes.values()
        memory, pids = sandbox.cgroup.dirs
        assert (memory / "memory.limit_in_bytes").read_text().strip() == str(96 * MIB)
        assert (pids / "pids.max").read_text().strip() == "30"
        inside = client.post("/run_command", json={"command": "cat /proc/self/cgroup"}).json()
        assert inside["exit_code"] == 0
        assert str(os.getpid()) not in (memory / "cgroup.procs").read_text()
        verify(client)
        assert not memory.exists() and not pids.exists()
        # A cgroup whose sandbox is gone (its worker was SIGKILLed, say) goes at the next sweep.
        orphans = [group / "worker-gone.sandbox-gone" for group in groups]
        for orphan in orphans:
            orphan.mkdir()
        server.root.sweep()
        assert not any(orphan.exists() for orphan in orphans)
    assert not any(group.exists() for group in groups)
