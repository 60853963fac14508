"""The sandbox helpers: paths that could leave the sandbox are refused; subprocesses are bounded."""

import asyncio
import os
import sys
import time

import pytest
import uvloop

from resources_servers.swe_rebench.sandbox import PathError, ProcessResult, resolve_inside, run_process


ENV = {"PATH": os.environ["PATH"]}


@pytest.fixture
def root(tmp_path):
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "module.py").write_text("x = 1\n")
    return repo.resolve()


@pytest.mark.parametrize("path", ["/etc/passwd", "../outside.txt", "pkg/../../outside.txt", "", "  ", "bad\0name"])
def test_absolute_dotdot_empty_and_nul_paths_are_refused(root, path):
    with pytest.raises(PathError):
        resolve_inside(root, path)


def test_a_symlink_pointing_out_is_refused(root, tmp_path):
    (tmp_path / "secret.txt").write_text("secret")
    (root / "link").symlink_to(tmp_path)
    (root / "file_link").symlink_to(tmp_path / "secret.txt")
    for path in ["link/secret.txt", "file_link", "link"]:
        with pytest.raises(PathError, match="symlink"):
            resolve_inside(root, path)


def test_paths_inside_are_resolved_including_new_files_and_inner_symlinks(root):
    (root / "inner").symlink_to(root / "pkg")
    assert resolve_inside(root, "pkg/module.py") == root / "pkg" / "module.py"
    assert resolve_inside(root, "./new/dir/file.txt") == root / "new" / "dir" / "file.txt"
    assert resolve_inside(root, "inner/module.py") == root / "pkg" / "module.py"


@pytest.mark.anyio
async def test_a_command_past_its_timeout_is_killed_with_its_children(root):
    started = time.monotonic()
    result = await run_process(["bash", "-c", "sleep 30 & echo $!; sleep 30"], root, ENV, 0.5, 1000)
    assert result.timed_out and result.exit_code is None
    assert time.monotonic() - started < 10
    child = int(result.output.split()[0])
    assert not process_alive(child)


@pytest.mark.anyio
async def test_background_children_do_not_outlive_a_finished_command(root):
    result = await run_process(["bash", "-c", "sleep 30 >/dev/null 2>&1 & echo $!"], root, ENV, 10, 1000)
    assert result.exit_code == 0 and not result.timed_out
    assert not process_alive(int(result.output))


@pytest.mark.anyio
async def test_output_past_the_cap_is_dropped_and_flagged(root):
    code = "import sys; sys.stdout.write('x' * 200000); sys.stderr.write('done')"
    result = await run_process([sys.executable, "-c", code], root, ENV, 10, 1000)
    assert result.exit_code == 0
    assert result.output == "x" * 1000
    assert result.truncated


@pytest.mark.anyio
async def test_stdout_and_stderr_are_kept_together_and_stdin_is_fed(root):
    result = await run_process(["sh", "-c", "cat; echo oops >&2; exit 3"], root, ENV, 10, 1000, stdin=b"hello\n")
    assert result.exit_code == 3
    assert result.output == "hello\noops\n"
    assert not result.truncated and not result.timed_out


def process_alive(pid: int) -> bool:
    """Alive and not a zombie waiting to be reaped."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return False
        except FileNotFoundError:
            return False
        time.sleep(0.05)
    return os.path.exists(f"/proc/{pid}")


def test_stdin_that_the_process_never_reads_is_dropped_under_uvloop(root):
    async def feed_a_process_that_exits_at_once() -> list[ProcessResult]:
        return [await run_process(["sh", "-c", "exit 4"], root, ENV, 10, 1000, stdin=b"x" * 1_000_000) for _ in range(20)]

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        results = runner.run(feed_a_process_that_exits_at_once())
    assert all(result.exit_code == 4 for result in results)
