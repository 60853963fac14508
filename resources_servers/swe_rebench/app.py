"""swe_rebench: fix a bug in a small Python repository inside a per-session sandbox; hidden tests grade the patch.

``/seed_session`` makes the session's sandbox (a git working copy of the task's repository, in its own
temp directory) and keeps it in a dict keyed by session id. The tools read and write files, run shell
commands and run the task's tests there, each as a bounded subprocess. ``/verify`` pops the sandbox,
takes the patch as ``git diff`` against the seed commit, applies it to a clean copy of the task, runs
the hidden tests on that, and removes the sandbox. Sandboxes never verified go when the server stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel, Field

from nemo_gym import SESSION_ID_KEY
from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseSeedSessionRequest,
    BaseSeedSessionResponse,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym.server import ServerApp
from resources_servers.swe_rebench.sandbox import (
    HIDDEN_TEST_RUNNER,
    PATCH_SCRIPT,
    SEED_SCRIPT,
    PathError,
    ProcessResult,
    Sandbox,
    load_tasks,
    resolve_inside,
    run_process,
    sandbox_env,
)

DEFAULT_TASKS_DIR = Path(__file__).resolve().parent / "data" / "tasks"
MAX_FILE_CHARS = 1_000_000


class SweRebenchConfig(BaseResourcesServerConfig):
    tasks_dir: str = str(DEFAULT_TASKS_DIR)
    # Where sandboxes are made; default: the system temp directory.
    sandbox_dir: str | None = None
    command_timeout_seconds: float = Field(30.0, gt=0)
    test_timeout_seconds: float = Field(60.0, gt=0)
    max_output_bytes: int = Field(16384, gt=0)
    max_patch_bytes: int = Field(1_000_000, gt=0)
    # Subprocesses running at once in one worker; the rest wait their turn (the timeout starts after).
    max_concurrent_processes: int = Field(8, gt=0)


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
    config_class = SweRebenchConfig
    config: SweRebenchConfig

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.tasks = load_tasks(Path(self.config.tasks_dir))
        self.sandbox_dir = Path(self.config.sandbox_dir or tempfile.gettempdir())
        self.sandbox_dir.mkdir(parents=True, exist_ok=True)
        self.sandboxes: dict[str, Sandbox] = {}
        self.process_slots = asyncio.Semaphore(self.config.max_concurrent_processes)

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/read_file")(self.read_file)
        app.post("/write_file")(self.write_file)
        app.post("/run_command")(self.run_command)
        app.post("/run_tests")(self.run_tests)
        return app

    @contextlib.asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        # Swept after the base lifespan ends, when no request (forwarded ones included) can make another.
        try:
            async with super().lifespan(app):
                yield
        finally:
            self.remove_all_sandboxes()

    def remove_all_sandboxes(self) -> None:
        """Remove the sandboxes of sessions that never verified (the server is stopping)."""
        while self.sandboxes:
            self.sandboxes.popitem()[1].remove()

    async def run(
        self,
        sandbox: Sandbox,
        argv: list[str],
        cwd: Path | None = None,
        stdin: bytes | None = None,
        timeout: float | None = None,
        max_output: int | None = None,
    ) -> ProcessResult:
        """A bounded subprocess in the sandbox (in its working copy unless ``cwd`` says otherwise)."""
        async with self.process_slots:
            return await run_process(
                argv,
                cwd or sandbox.repo,
                sandbox_env(sandbox.root),
                timeout or self.config.command_timeout_seconds,
                max_output or self.config.max_output_bytes,
                stdin,
            )

    def sandbox_of(self, request: Request) -> Sandbox:
        sandbox = self.sandboxes.get(request.session[SESSION_ID_KEY])
        if sandbox is None:
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
        previous = self.sandboxes.pop(session_id, None)
        if previous is not None:
            previous.remove()
        sandbox = Sandbox.make(task, self.sandbox_dir)
        self.sandboxes[session_id] = sandbox
        try:
            await asyncio.to_thread(shutil.copytree, task.repo, sandbox.repo)
            seeded = await self.run(sandbox, ["sh", "-c", SEED_SCRIPT])
            if not seeded.ok:
                raise HTTPException(500, f"could not make the task repository: {describe(seeded)}")
            sandbox.base_commit = seeded.output.strip()
        except BaseException:
            if self.sandboxes.get(session_id) is sandbox:
                del self.sandboxes[session_id]
            sandbox.remove()
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
        result = await self.run(sandbox, ["cat", "--", str(target)])
        if not result.ok:
            raise HTTPException(400, f"cannot read {body.path!r}: {describe(result)}")
        return ReadFileResponse(path=body.path, content=result.output, truncated=result.truncated)

    async def write_file(self, request: Request, body: WriteFileRequest) -> WriteFileResponse:
        """Write `content` to a file of the repository (created, or replaced whole); `path` is relative to the repository root."""
        sandbox = self.sandbox_of(request)
        target = self.path_in(sandbox, body.path)
        if target.is_dir():
            raise HTTPException(400, f"{body.path!r} is a directory")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise HTTPException(400, f"cannot write {body.path!r}: {error.strerror}") from None
        data = body.content.encode()
        result = await self.run(sandbox, ["dd", f"of={target}", "bs=65536", "status=none"], stdin=data)
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
        result = await self.run(sandbox, [sys.executable, "-m", "unittest"], timeout=self.config.test_timeout_seconds)
        return RunTestsResponse(**vars(result), passed=result.ok)

    async def verify(self, request: Request, body: SweRebenchVerifyRequest) -> SweRebenchVerifyResponse:
        sandbox = self.sandboxes.pop(request.session[SESSION_ID_KEY], None)
        if sandbox is None:
            grade = Grade(
                reason=f"no sandbox for this session in worker {os.getpid()}: it was never seeded here, was already "
                "verified, or was seeded in another worker; there is no patch to grade"
            )
        else:
            try:
                grade = await self.grade(sandbox, body.task_id)
            finally:
                await asyncio.to_thread(sandbox.remove)
        return SweRebenchVerifyResponse.model_validate(body.model_dump() | vars(grade) | {"worker_pid": os.getpid()})

    async def grade(self, sandbox: Sandbox, task_id: str) -> Grade:
        """Take the patch, apply it to a clean copy of the task, run the hidden tests there."""
        if sandbox.task.task_id != task_id:
            return Grade(reason=f"the session was seeded with task {sandbox.task.task_id!r}, not {task_id!r}")
        taken = await self.run(sandbox, ["sh", "-c", PATCH_SCRIPT, "patch", sandbox.base_commit], max_output=self.config.max_patch_bytes)
        if taken.truncated:
            return Grade(reason=f"the patch is larger than max_patch_bytes ({self.config.max_patch_bytes})")
        if not taken.ok:
            return Grade(reason=f"could not take the patch: {describe(taken)}")
        patch = taken.output
        graded, hidden = sandbox.root / "graded", sandbox.root / "hidden"
        await asyncio.to_thread(copy_trees, {sandbox.task.repo: graded, sandbox.task.hidden_tests: hidden})
        if patch:
            applied = await self.run(sandbox, ["git", "apply", "--whitespace=nowarn", "-"], cwd=graded, stdin=patch.encode())
            if not applied.ok:
                return Grade(patch=patch, reason=f"the patch does not apply: {describe(applied)}")
        argv = [sys.executable, "-I", "-S", "-c", HIDDEN_TEST_RUNNER, str(graded), str(hidden)]
        tests = await self.run(sandbox, argv, cwd=graded, timeout=self.config.test_timeout_seconds)
        if tests.ok:
            return Grade(reward=1.0, patch=patch, tests_passed=True, test_output=tests.output)
        reason = "the hidden tests timed out" if tests.timed_out else "the hidden tests failed"
        reason += "" if patch else " (the patch is empty: nothing was changed)"
        return Grade(patch=patch, test_output=tests.output, reason=reason)


def copy_trees(copies: dict[Path, Path]) -> None:
    for source, destination in copies.items():
        shutil.copytree(source, destination)


def describe(result: ProcessResult) -> str:
    if result.timed_out:
        return "timed out"
    return f"exit code {result.exit_code}: {result.output.strip()}"


app = ServerApp(SweRebenchServer)
