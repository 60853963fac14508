"""The ``local`` sandbox provider: each sandbox is a fresh directory on this machine, its commands ``bash -c`` processes in it.

It isolates files, not processes: a command runs as this user with this machine's network (its
environment is only ``PATH``, ``HOME`` and the spec's ``env``), so it
is for trusted commands and tests (the image, resources and ports of a spec are not applied).
Paths inside the sandbox are relative to its directory; an absolute path or ``..`` that leaves it is
refused.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
import uuid
from pathlib import Path

from nemo_gym.sandbox.types import SandboxExecResult, SandboxHandle, SandboxSpec, SandboxStatus

TIMEOUT_RETURN_CODE = 124


class LocalProcessProvider:
    name = "local"

    def __init__(self, root: str | None = None) -> None:
        # Where the sandboxes' directories go (default: the system's temporary directory).
        self.root = root
        self._dirs: dict[str, Path] = {}
        self._env: dict[str, dict[str, str]] = {}

    async def create(self, spec: SandboxSpec) -> SandboxHandle:
        sandbox_id = uuid.uuid4().hex
        if self.root:
            Path(self.root).mkdir(parents=True, exist_ok=True)
        home = Path(tempfile.mkdtemp(prefix=f"nemo-gym-sandbox-{sandbox_id[:8]}-", dir=self.root))
        self._dirs[sandbox_id] = home
        self._env[sandbox_id] = dict(spec.env)
        if spec.workdir:
            self.path(SandboxHandle(sandbox_id, self.name), spec.workdir).mkdir(parents=True, exist_ok=True)
        return SandboxHandle(sandbox_id, self.name, raw=home)

    def path(self, handle: SandboxHandle, path: str) -> Path:
        """A path of the sandbox as a path on this machine."""
        home = self._dirs[handle.sandbox_id]
        resolved = (home / path.lstrip("/")).resolve()
        if not resolved.is_relative_to(home.resolve()):
            raise ValueError(f"{path!r} is outside the sandbox")
        return resolved

    def base_env(self, handle: SandboxHandle) -> dict[str, str]:
        """Not this process's environment (its credentials stay out): a ``PATH``, and ``HOME`` the sandbox's directory."""
        return {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(self._dirs[handle.sandbox_id])}

    async def exec(
        self, handle: SandboxHandle, command: str, *, cwd: str | None = None, env: dict[str, str] | None = None,
        timeout_s: int | float | None = None, user: str | int | None = None,
    ) -> SandboxExecResult:  # fmt: skip
        if user is not None:
            raise ValueError("the local provider runs commands as this process's user only")
        process = await asyncio.create_subprocess_exec(
            "bash", "-c", command, cwd=self.path(handle, cwd or "."), env={**self.base_env(handle), **self._env[handle.sandbox_id], **(env or {})},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(), timeout_s)
        except TimeoutError:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = await process.communicate()
            return SandboxExecResult(stdout.decode(errors="replace"), stderr.decode(errors="replace"), TIMEOUT_RETURN_CODE, "timeout")
        return SandboxExecResult(stdout.decode(errors="replace"), stderr.decode(errors="replace"), process.returncode)

    async def upload_file(self, handle: SandboxHandle, source_path: Path, target_path: str) -> None:
        target = self.path(handle, target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source_path, target)

    async def download_file(self, handle: SandboxHandle, source_path: str, target_path: Path) -> None:
        Path(target_path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.path(handle, source_path), target_path)

    async def status(self, handle: SandboxHandle) -> SandboxStatus:
        return SandboxStatus.RUNNING if handle.sandbox_id in self._dirs else SandboxStatus.STOPPED

    async def close(self, handle: SandboxHandle) -> None:
        home = self._dirs.pop(handle.sandbox_id, None)
        self._env.pop(handle.sandbox_id, None)
        if home is not None:
            shutil.rmtree(home, ignore_errors=True)

    async def aclose(self) -> None:
        for sandbox_id in list(self._dirs):
            await self.close(SandboxHandle(sandbox_id, self.name))
