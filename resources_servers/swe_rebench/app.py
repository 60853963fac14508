"""swe_rebench: fix a bug in a small Python repository inside a per-session jailed sandbox; hidden tests grade the patch.

``/seed_session`` makes the session's sandbox (a git working copy of the task's repository on a
size-capped tmpfs of its own, under this worker's locked part of the instance's sandbox root) and keeps
it in a dict keyed by session id. Every tool runs as a bounded subprocess inside the sandbox's jail
(``jail.py``), which shows that repository and nothing else of the host. ``/verify`` takes the patch as
``git diff`` against the seed commit (in the jail), applies it to a fresh copy of the task in a fresh
sandbox, runs the hidden tests there (jailed too) and grades from the per-test results the runner signs
over a channel of that run alone (``grading.py``), and removes that one. The session's own sandbox goes
with its end (``on_session_end``), which a 2xx verify makes before its reply starts.

With durable sessions (on when routed, ``nemo_gym.durable``), each session's sandbox is stored by name
(``sessions.py``) and outlives its worker and a restart: sweeps spare the sandboxes the store names, and
a worker that adopts a session re-attaches its sandbox where it is. A verify the store does not commit
ends nothing (``nemo_gym.lifecycle``), so its retry grades the same sandbox. A session that ends
(verify, ``/close_session``, idleness) has its sandbox removed then (``on_session_end``);
what is left when the server stops goes then; those of a killed worker when the server next starts or stops.
``max_sandbox_disk_mb`` caps the disk of all the instance's sandboxes together: each live session counts
for its sandbox's tmpfs cap (``max_disk_mb``), and a new session over the total gets 503 before any is made.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel, Field, model_validator

from nemo_gym import SESSION_ID_KEY
from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseSeedSessionRequest,
    BaseSeedSessionResponse,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym.lifecycle.cap import Cap
from nemo_gym.lifecycle.registry import EndReason
from nemo_gym.sessions.secret import state_dir
from resources_servers.swe_rebench.cgroups import Cgroups, SandboxCgroup, Usage
from resources_servers.swe_rebench.grading import MAX_REPORT_BYTES, RUNNER_SOURCE, Orders, judge
from resources_servers.swe_rebench.jail import Jail, Limits, NoJail
from resources_servers.swe_rebench.sandbox import (
    GRADE_COPY_SCRIPT,
    PATCH_SCRIPT,
    SEED_SCRIPT,
    PathError,
    ProcessResult,
    Sandbox,
    load_tasks,
    resolve_inside,
    run_process,
)
from resources_servers.swe_rebench.sandbox_metrics import SandboxMetrics
from resources_servers.swe_rebench.sandbox_root import SandboxRoot
from resources_servers.swe_rebench.sessions import Sandboxes, sandbox_names

DEFAULT_TASKS_DIR = Path(__file__).resolve().parent / "data" / "tasks"
MAX_FILE_CHARS = 1_000_000
MIB = 1 << 20
# Reads and writes act inside the jail, where a symlink can reach nothing of the host.
READ_SCRIPT = 'exec cat -- "$1"'
WRITE_SCRIPT = 'mkdir -p -- "$(dirname -- "$1")" && exec dd of="$1" bs=65536 status=none'

logger = logging.getLogger(__name__)


class SweRebenchConfig(BaseResourcesServerConfig):
    tasks_dir: str = str(DEFAULT_TASKS_DIR)
    # The instance's sandbox root (made at start, removed at stop); default: swe_rebench-<instance> in the system temp directory.
    sandbox_dir: str | None = None
    # The bubblewrap binary (a name looked up on PATH, or a path).
    bwrap: str = "bwrap"
    # Run the policy's commands unconfined, as the server's user: only for a trusted policy.
    unsafe_no_jail: bool = False
    # Jail limits: the repository's tmpfs (and, apart, each command's /tmp); memory and processes of all of
    # a sandbox's commands together (its cgroup).
    max_disk_mb: int = Field(256, gt=0)
    max_memory_mb: int = Field(2048, gt=0)
    max_processes: int = Field(64, gt=0)
    # The cgroup the sandboxes' cgroups go below (on v1 a directory holding one per controller, memory/ and
    # pids/); default: the server's own cgroup in each hierarchy.
    cgroup_parent: str | None = None
    command_timeout_seconds: float = Field(30.0, gt=0)
    test_timeout_seconds: float = Field(60.0, gt=0)
    max_output_bytes: int = Field(16384, gt=0)
    max_patch_bytes: int = Field(1_000_000, gt=0)
    # Subprocesses running at once in one worker; the rest wait their turn (the timeout starts after).
    max_concurrent_processes: int = Field(8, gt=0)
    # The disk all the instance's sandboxes may take together (null: no cap): each live session counts for
    # max_disk_mb, so at most max_sandbox_disk_mb // max_disk_mb sessions live at once.
    max_sandbox_disk_mb: int | None = Field(None, gt=0)

    @model_validator(mode="after")
    def room_for_one_sandbox(self) -> "SweRebenchConfig":
        if self.max_sandbox_disk_mb is not None and self.max_sandbox_disk_mb < self.max_disk_mb:
            raise ValueError(f"max_sandbox_disk_mb ({self.max_sandbox_disk_mb}) leaves no room for one sandbox of max_disk_mb ({self.max_disk_mb})")
        return self


class SweRebenchSeedSessionRequest(BaseSeedSessionRequest):
    task_id: str


class SweRebenchSeedSessionResponse(BaseSeedSessionResponse):
    task_id: str
    worker_pid: int


class ReadFileRequest(BaseModel):
    path: str


class ReadFileResponse(BaseModel):
    path: str
    content: str
    truncated: bool


class WriteFileRequest(BaseModel):
    path: str
    content: str = Field(max_length=MAX_FILE_CHARS)


class WriteFileResponse(BaseModel):
    path: str
    bytes_written: int


class RunCommandRequest(BaseModel):
    command: str = Field(min_length=1)


class RunTestsRequest(BaseModel):
    pass


class CommandResponse(BaseModel):
    exit_code: int | None
    output: str
    truncated: bool
    timed_out: bool
    # Which cap of the sandbox the command went over (memory or processes) and what the kernel did; null: none.
    over_limit: str | None = None


class RunTestsResponse(CommandResponse):
    passed: bool


class SweRebenchVerifyRequest(BaseVerifyRequest):
    task_id: str


class SweRebenchVerifyResponse(BaseVerifyResponse):
    task_id: str
    # The change graded, as ``git diff`` against the seed commit; None when there was no sandbox to take it from.
    patch: str | None
    tests_passed: bool
    test_output: str
    # Why the reward is 0.0 (None when it is 1.0).
    reason: str | None
    # The worker process that graded the session (the one that held its sandbox).
    worker_pid: int


@dataclass
class Grade:
    """The outcome of a verify: the reward and what it is based on."""

    reward: float = 0.0
    patch: str | None = None
    tests_passed: bool = False
    test_output: str = ""
    reason: str | None = None


class SweRebenchServer(SimpleResourcesServer):
    config: SweRebenchConfig

    def __init__(self, **data: Any) -> None:
        super().__init__(**data)
        self.tasks_dir = Path(self.config.tasks_dir).resolve()
        self.tasks = load_tasks(self.tasks_dir)
        root = Path(self.config.sandbox_dir or Path(tempfile.gettempdir()) / f"swe_rebench-{self.name}").resolve()
        if self.config.unsafe_no_jail:
            self.jail: Jail | NoJail = NoJail()
            self.root = SandboxRoot(root, disk_bytes=None, kept=self.durable_sandboxes)
        else:
            limits = Limits(self.config.max_disk_mb * MIB, self.config.max_memory_mb * MIB, self.config.max_processes)
            self.jail = Jail(self.config.bwrap, limits, hidden=[self.tasks_dir, root, state_dir().resolve()])
            cgroups = Cgroups.for_root(root, limits.memory_bytes, limits.processes, self.config.cgroup_parent)
            self.root = SandboxRoot(root, disk_bytes=limits.disk_bytes, kept=self.durable_sandboxes, cgroups=cgroups)
        self.sandboxes = Sandboxes(self.root, self.tasks)
        self.process_slots = asyncio.Semaphore(self.config.max_concurrent_processes)

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/read_file")(self.read_file)
        app.post("/write_file")(self.write_file)
        app.post("/run_command")(self.run_command)
        app.post("/run_tests")(self.run_tests)
        return app

    def session_states(self) -> Sandboxes:
        return self.sandboxes

    def session_caps(self) -> list[Cap]:
        caps = super().session_caps()
        total = self.config.max_sandbox_disk_mb
        if total is not None:
            detail = f"max_sandbox_disk_mb ({total} MB, {self.config.max_disk_mb} MB per sandbox)"
            caps.append(Cap(total // self.config.max_disk_mb, detail))
        return caps

    async def on_session_end(self, session_id: str, reason: EndReason) -> None:
        """The session's sandbox goes; on a conflict another worker holds the session, and its sandbox, now: forgotten
        here only. On a stop too: the root's sweep at close removes it then, sparing those a store still names."""
        self.sandboxes.lost.pop(session_id, None)
        sandbox = self.sandboxes.pop(session_id, None)
        if sandbox is not None and reason not in (EndReason.CONFLICT, EndReason.STOP):
            await asyncio.to_thread(sandbox.remove)

    def metric_collectors(self) -> list[SandboxMetrics]:
        return [SandboxMetrics(self.root)]

    def durable_sandboxes(self) -> set[str]:
        """The sandboxes of the sessions in the store, which sweeps spare; none without durable sessions."""
        return set() if self.durable is None else sandbox_names(self.durable.stored_states())

    @contextlib.asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        self.root.open()
        try:
            self.check_jail()
            async with super().lifespan(app):
                yield
        finally:
            # Swept after the base lifespan ends, when no request (forwarded ones included) can make another:
            # every sandbox of this worker goes but those of durable sessions.
            self.root.close()

    def check_jail(self) -> None:
        if self.config.unsafe_no_jail:
            logger.warning(
                "swe_rebench %r runs with unsafe_no_jail: true: the policy's commands run as this server's user, "
                "with the whole file system (other sessions, the hidden tests, the secrets) and the network",
                self.name,
            )
            return
        probe = self.root.make(next(iter(self.tasks.values())))
        try:
            self.jail.check(probe)
        finally:
            probe.remove()

    async def run(
        self,
        sandbox: Sandbox,
        argv: list[str],
        mounts: dict[str, Path] | None = None,
        stdin: bytes | None = None,
        timeout: float | None = None,
        max_output: int | None = None,
        pass_fds: tuple[int, ...] = (),
    ) -> ProcessResult:
        """A bounded subprocess in the sandbox's jail, in its working copy; ``mounts`` are shown read-only at ``$<NAME>``,
        ``pass_fds`` are inherited. Jailed, the result says when the command went over a cap of the sandbox."""
        async with self.process_slots:
            spawn = self.jail.command(sandbox, argv, mounts or {})
            try:
                before = spawn.cgroup.usage() if spawn.cgroup else None
                result = await run_process(
                    spawn.argv,
                    spawn.cwd,
                    spawn.env,
                    timeout or self.config.command_timeout_seconds,
                    max_output or self.config.max_output_bytes,
                    stdin,
                    spawn.fds + pass_fds,
                )
            finally:
                spawn.close()
            if spawn.cgroup is not None:
                result.over_limit = self.over_limit(spawn.cgroup, before)
            return result

    def over_limit(self, cgroup: SandboxCgroup, before: Usage) -> str | None:
        after = cgroup.usage()
        if after.oom_kills > before.oom_kills:
            killed = "all its processes" if cgroup.version == 2 else f"{after.oom_kills - before.oom_kills} of its processes"
            return (
                f"memory: the sandbox's processes together reached max_memory_mb ({self.config.max_memory_mb} MB); "
                f"the kernel killed {killed}"
            )
        if after.refused_forks > before.refused_forks:
            return (
                f"processes: the sandbox reached max_processes ({self.config.max_processes} at once); "
                f"{after.refused_forks - before.refused_forks} new processes were refused"
            )
        return None

    def sandbox_of(self, request: Request) -> Sandbox:
        session_id = request.session[SESSION_ID_KEY]
        sandbox = self.sandboxes.get(session_id)
        if sandbox is None:
            lost = self.sandboxes.lost.get(session_id)
            if lost is not None:
                raise HTTPException(410, lost)
            raise HTTPException(404, "this session has no sandbox: call /seed_session first (or it was already verified)")
        return sandbox

    def path_in(self, sandbox: Sandbox, path: str) -> Path:
        try:
            return resolve_inside(sandbox.repo, path)
        except PathError as error:
            raise HTTPException(400, f"refused: {error}") from None

    async def seed_session(self, request: Request, body: SweRebenchSeedSessionRequest) -> SweRebenchSeedSessionResponse:
        task = self.tasks.get(body.task_id)
        if task is None:
            raise HTTPException(422, f"unknown task_id {body.task_id!r}; known: {', '.join(self.tasks)}")
        session_id = request.session[SESSION_ID_KEY]
        self.sandboxes.lost.pop(session_id, None)
        previous = self.sandboxes.pop(session_id, None)
        if previous is not None:
            await asyncio.to_thread(previous.remove)
        sandbox = await asyncio.to_thread(self.root.make, task)
        self.sandboxes[session_id] = sandbox
        try:
            seeded = await self.run(sandbox, ["sh", "-c", SEED_SCRIPT], {"template": task.repo})
            if not seeded.ok:
                raise HTTPException(500, f"could not make the task repository: {describe(seeded)}")
            sandbox.base_commit = seeded.output.strip()
        except BaseException:
            if self.sandboxes.get(session_id) is sandbox:
                del self.sandboxes[session_id]
            await asyncio.to_thread(sandbox.remove)
            raise
        return SweRebenchSeedSessionResponse(task_id=task.task_id, worker_pid=os.getpid())

    async def read_file(self, request: Request, body: ReadFileRequest) -> ReadFileResponse:
        """Read a file of the repository; `path` is relative to the repository root."""
        sandbox = self.sandbox_of(request)
        target = self.path_in(sandbox, body.path)
        if not target.exists():
            raise HTTPException(404, f"no such file: {body.path!r}")
        if target.is_dir():
            raise HTTPException(400, f"{body.path!r} is a directory; list it with run_command (ls)")
        result = await self.run(sandbox, ["sh", "-c", READ_SCRIPT, "read_file", inside(sandbox, target)])
        if not result.ok:
            raise HTTPException(400, f"cannot read {body.path!r}: {describe(result)}")
        return ReadFileResponse(path=body.path, content=result.output, truncated=result.truncated)

    async def write_file(self, request: Request, body: WriteFileRequest) -> WriteFileResponse:
        """Write `content` to a file of the repository (created, or replaced whole); `path` is relative to the repository root."""
        sandbox = self.sandbox_of(request)
        target = self.path_in(sandbox, body.path)
        if target.is_dir():
            raise HTTPException(400, f"{body.path!r} is a directory")
        data = body.content.encode()
        result = await self.run(sandbox, ["sh", "-c", WRITE_SCRIPT, "write_file", inside(sandbox, target)], stdin=data)
        if not result.ok:
            raise HTTPException(400, f"cannot write {body.path!r}: {describe(result)}")
        return WriteFileResponse(path=body.path, bytes_written=len(data))

    async def run_command(self, request: Request, body: RunCommandRequest) -> CommandResponse:
        """Run a bash command in the repository root; returns its exit code and output (stdout and stderr together)."""
        sandbox = self.sandbox_of(request)
        result = await self.run(sandbox, ["bash", "-c", body.command])
        return CommandResponse(**vars(result))

    async def run_tests(self, request: Request, body: RunTestsRequest) -> RunTestsResponse:
        """Run the repository's tests (python -m unittest); returns whether they passed and their output."""
        sandbox = self.sandbox_of(request)
        result = await self.run(sandbox, [self.jail.python, "-m", "unittest"], timeout=self.config.test_timeout_seconds)
        return RunTestsResponse(**vars(result), passed=result.ok)

    async def verify(self, request: Request, body: SweRebenchVerifyRequest) -> SweRebenchVerifyResponse:
        session_id = request.session[SESSION_ID_KEY]
        # Left in place: it goes with the session's end (``on_session_end``), which a 2xx verify makes once its reply
        # is committed; a verify refused unwritten (a full store, a lapsed lease) leaves it for the retry.
        sandbox = self.sandboxes.get(session_id)
        if sandbox is None and session_id in self.sandboxes.lost:
            raise HTTPException(410, self.sandboxes.lost[session_id])
        if sandbox is None:
            grade = Grade(
                reason=f"no sandbox for this session in worker {os.getpid()}: it was never seeded here, was already "
                "verified, or was seeded in another worker; there is no patch to grade"
            )
        else:
            grade = await self.grade(sandbox, body.task_id)
        return SweRebenchVerifyResponse.model_validate(body.model_dump() | vars(grade) | {"worker_pid": os.getpid()})

    async def grade(self, sandbox: Sandbox, task_id: str) -> Grade:
        """Take the patch, apply it to a fresh copy of the task in a fresh sandbox, run the hidden tests there."""
        if sandbox.task.task_id != task_id:
            return Grade(reason=f"the session was seeded with task {sandbox.task.task_id!r}, not {task_id!r}")
        taken = await self.run(sandbox, ["sh", "-c", PATCH_SCRIPT, "patch", sandbox.base_commit], max_output=self.config.max_patch_bytes)
        if taken.truncated:
            return Grade(reason=f"the patch is larger than max_patch_bytes ({self.config.max_patch_bytes})")
        if not taken.ok:
            return Grade(reason=f"could not take the patch: {describe(taken)}")
        graded = await asyncio.to_thread(self.root.make, sandbox.task)
        try:
            return await self.run_hidden_tests(graded, taken.output)
        finally:
            await asyncio.to_thread(graded.remove)

    async def run_hidden_tests(self, graded: Sandbox, patch: str) -> Grade:
        task = graded.task
        copy = ["sh", "-c", GRADE_COPY_SCRIPT, "grade", "apply" if patch else ""]
        applied = await self.run(graded, copy, {"template": task.repo}, stdin=patch.encode() if patch else None)
        if not applied.ok:
            return Grade(patch=patch, reason=f"the patch does not apply: {describe(applied)}")
        report = os.memfd_create("hidden-test-report", 0)
        try:
            orders = Orders.new(report, task.tests)
            argv = [self.jail.python, "-I", "-S", "-c", RUNNER_SOURCE]
            tests = await self.run(
                graded,
                argv,
                {"hidden": task.hidden_tests},
                stdin=orders.stdin,
                timeout=self.config.test_timeout_seconds,
                pass_fds=(report,),
            )
            lines = os.pread(report, MAX_REPORT_BYTES + 1, 0)
        finally:
            os.close(report)
        verdict = judge(lines, orders.key, task.tests, tests.exit_code, tests.timed_out)
        if verdict.passed:
            return Grade(reward=1.0, patch=patch, tests_passed=True, test_output=tests.output)
        reason = verdict.reason + (f" ({tests.over_limit})" if tests.over_limit else "")
        reason += "" if patch else " (the patch is empty: nothing was changed)"
        return Grade(patch=patch, test_output=tests.output, reason=reason)


def inside(sandbox: Sandbox, target: Path) -> str:
    """``target`` (a path checked to be in the repository) as the tools see it: relative to the repository root, their working directory."""
    return f"./{target.relative_to(sandbox.repo)}"


def describe(result: ProcessResult) -> str:
    if result.timed_out:
        return "timed out"
    return f"exit code {result.exit_code}: {result.output.strip()}"


if __name__ == "__main__":
    SweRebenchServer.run_webserver()
