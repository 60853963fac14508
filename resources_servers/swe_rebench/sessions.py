"""Each session's sandbox, kept durable (``nemo_gym.durable``): stored as its task, its name under the sandbox root
and its seed commit; restored by re-attaching the sandbox where it is on disk, or, when that cannot be, as a lost
session that answers 410 with the reason (never a fresh sandbox in its place)."""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from resources_servers.swe_rebench.sandbox import Sandbox, Task
from resources_servers.swe_rebench.sandbox_root import SandboxGone, SandboxRoot, is_sandbox_name


class SandboxState(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    task_id: str
    # The sandbox's directory relative to the root: ``worker-*/sandbox-*``.
    sandbox: str
    # Passed to git inside the jail: a commit id and nothing else (SHA-1 or SHA-256).
    base_commit: str = Field(pattern=r"^([0-9a-f]{40}|[0-9a-f]{64})$")


class Sandboxes(dict[str, Sandbox]):
    """The sandboxes this worker holds, by session id; ``lost`` says why a restored session has none (kept until
    the session is seeded again, so each of its requests gets 410 with the reason)."""

    def __init__(self, root: SandboxRoot, tasks: dict[str, Task]) -> None:
        super().__init__()
        self.root = root
        self.tasks = tasks
        self.lost: dict[str, str] = {}

    def export(self, session_id: str) -> str | None:
        sandbox = self.get(session_id)
        # A sandbox still being seeded (another request of the session ends meanwhile) has nothing to keep yet.
        if sandbox is None or not sandbox.base_commit:
            return None
        name = self.root.name_of(sandbox)
        return SandboxState(task_id=sandbox.task.task_id, sandbox=name, base_commit=sandbox.base_commit).model_dump_json()

    def restore(self, session_id: str, data: str) -> None:
        self.lost.pop(session_id, None)
        try:
            state = SandboxState.model_validate_json(data)
        except ValidationError as error:
            self.lost[session_id] = f"This session's stored state is malformed, so its sandbox cannot be found: {error}"
            return
        task = self.tasks.get(state.task_id)
        try:
            if task is None:
                raise SandboxGone(f"its task {state.task_id!r} is not among this server's tasks")
            sandbox = self.root.reattach(state.sandbox, task)
        except SandboxGone as error:
            self.lost[session_id] = f"This session's sandbox cannot be taken over: {error}. Its work is lost; seed a new session."
            return
        sandbox.base_commit = state.base_commit
        self[session_id] = sandbox

    def end(self, session_id: str) -> None:
        self.lost.pop(session_id, None)
        sandbox = self.pop(session_id, None)
        if sandbox is not None:
            sandbox.remove()

    def forget(self, session_id: str) -> None:
        """The sandbox stays where it is: the worker holding the session now re-attaches it (on this host)."""
        self.lost.pop(session_id, None)
        self.pop(session_id, None)


def sandbox_names(states: Iterable[str]) -> set[str]:
    """The sandboxes that stored states name: what sweeps spare. A malformed state names none."""
    names = set()
    for data in states:
        try:
            name = SandboxState.model_validate_json(data).sandbox
        except ValidationError:
            continue
        if is_sandbox_name(name):
            names.add(name)
    return names
