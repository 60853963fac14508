"""Sandboxes: a task's repository in its own directory, path checks, and the bounded subprocesses that act on it."""

from __future__ import annotations

import asyncio
import os
import signal
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from resources_servers.swe_rebench.cgroups import SandboxCgroup
from resources_servers.swe_rebench.grading import NamedTests
from resources_servers.swe_rebench.tmpfs import remove_tree

READ_CHUNK = 65536
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "NeMo Gym",
    "GIT_AUTHOR_EMAIL": "swe_rebench@nemo-gym.invalid",
    "GIT_COMMITTER_NAME": "NeMo Gym",
    "GIT_COMMITTER_EMAIL": "swe_rebench@nemo-gym.invalid",
}
# One shell line for the seed: the task's files (mounted at $TEMPLATE) copied in and committed.
SEED_SCRIPT = (
    'cp -R "$TEMPLATE"/. . && git -c init.defaultBranch=main init -q'
    " && printf '__pycache__/\\n*.pyc\\n' >> .git/info/exclude"
    " && git add -A && git commit -q -m 'Task repository as seeded' && git rev-parse HEAD"
)
# The grading copy: the task's files, then the patch (on stdin) applied to them unless it is empty ($1 = "").
GRADE_COPY_SCRIPT = 'cp -R "$TEMPLATE"/. . && { test -z "$1" || git apply --whitespace=nowarn -; }'
# The patch is every change since the seed commit, new files included.
PATCH_SCRIPT = 'git add -A && git diff --cached --binary "$1"'
class PathError(ValueError):
    """A path argument that is empty or would lead outside the sandbox."""


@dataclass(frozen=True)
class Task:
    """A task shipped in ``data/tasks/<task_id>/``: ``repo/`` is what the model sees, ``hidden/`` grades it,
    ``tests.json`` names the hidden tests that must pass (``FAIL_TO_PASS`` and ``PASS_TO_PASS``)."""

    task_id: str
    repo: Path
    hidden_tests: Path
    tests: NamedTests


def load_tasks(tasks_dir: Path) -> dict[str, Task]:
    tasks = {
        path.name: Task(path.name, path / "repo", path / "hidden", NamedTests.load(path / "tests.json"))
        for path in sorted(tasks_dir.iterdir())
        if (path / "repo").is_dir() and (path / "hidden").is_dir()
    }
    if not tasks:
        raise ValueError(f"no tasks (directories with repo/, hidden/ and tests.json) in {tasks_dir}")
    return tasks


@dataclass
class Sandbox:
    """One session's directory: ``repo/`` is the working copy the tools act on.

    Jailed, the directory is a size-capped tmpfs owned by ``uid``, the sandbox's own unprivileged user.
    """

    task: Task
    root: Path
    uid: int | None = None
    base_commit: str = ""
    # Jailed, the cgroup that caps the memory and the processes of all its commands together.
    cgroup: SandboxCgroup | None = None

    @property
    def repo(self) -> Path:
        return self.root / "repo"

    def remove(self) -> None:
        if self.cgroup is not None:
            self.cgroup.remove()
        remove_tree(self.root)


def resolve_inside(root: Path, path: str) -> Path:
    """``path`` taken relative to ``root`` (a resolved directory), refused when it could lead outside."""
    if not path.strip():
        raise PathError("the path is empty; give a path relative to the repository root")
    if "\0" in path:
        raise PathError(f"{path!r} contains a NUL byte")
    relative = PurePosixPath(path)
    if relative.is_absolute():
        raise PathError(f"{path!r} is an absolute path; give a path relative to the repository root")
    if ".." in relative.parts:
        raise PathError(f"{path!r} goes up with '..'; paths must stay inside the repository")
    try:
        resolved = (root / relative).resolve()
    except (OSError, RuntimeError) as error:
        raise PathError(f"{path!r} cannot be resolved: {error}") from None
    if not resolved.is_relative_to(root):
        raise PathError(f"{path!r} leads outside the repository through a symlink (to {resolved})")
    return resolved


@dataclass
class ProcessResult:
    exit_code: int | None
    output: str
    truncated: bool
    timed_out: bool
    # Which cap of the sandbox the command went over, and what the kernel did about it (None: none).
    over_limit: str | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


async def run_process(
    argv: list[str],
    cwd: Path,
    env: dict[str, str],
    timeout: float,
    max_output: int,
    stdin: bytes | None = None,
    pass_fds: tuple[int, ...] = (),
) -> ProcessResult:
    """Run ``argv`` in its own process group; stdout and stderr together, the first ``max_output`` bytes kept.

    Output past the cap is read and dropped, so the process never stalls on a full pipe. At the
    timeout, or when the caller is cancelled, the whole group is killed (background children too).
    """
    process = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=env,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
        pass_fds=pass_fds,
    )
    kept = bytearray()
    dropped = 0

    async def communicate() -> None:
        nonlocal dropped
        if stdin is not None:
            # The process may exit without reading it; uvloop says so with RuntimeError ("the handler is closed").
            try:
                process.stdin.write(stdin)
                await process.stdin.drain()
            except (BrokenPipeError, ConnectionResetError, RuntimeError):
                pass
            process.stdin.close()
        while chunk := await process.stdout.read(READ_CHUNK):
            room = max(0, max_output - len(kept))
            kept.extend(chunk[:room])
            dropped += len(chunk) - min(room, len(chunk))
        await process.wait()

    timed_out = False
    try:
        await asyncio.wait_for(communicate(), timeout)
    except TimeoutError:
        timed_out = True
    finally:
        kill_group(process.pid)
        if process.returncode is None:
            await asyncio.shield(process.wait())
    output = kept.decode("utf-8", errors="replace")
    return ProcessResult(None if timed_out else process.returncode, output, dropped > 0, timed_out)


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
