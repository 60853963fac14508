"""``AsyncSandbox``: one sandbox's life (start, exec, files, stop) on a provider, as upstream's API has it."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nemo_gym.sandbox.registry import create_provider
from nemo_gym.sandbox.types import SandboxExecResult, SandboxHandle, SandboxProvider, SandboxSpec, SandboxStatus

DEFAULT_EXEC_TIMEOUT_S = 180


class AsyncSandbox:
    """``AsyncSandbox(provider, spec)``: ``provider`` a provider or a one-key provider config. Usable once: after ``stop`` it is done."""

    def __init__(self, provider: Mapping[str, Any] | SandboxProvider, spec: SandboxSpec | None = None) -> None:
        self._provider = create_provider(provider) if isinstance(provider, Mapping) else provider
        self._spec = spec
        self._handle: SandboxHandle | None = None
        self._done = False

    def _running(self) -> SandboxHandle:
        if self._handle is None:
            raise RuntimeError("the sandbox has not been started")
        return self._handle

    async def start(self, spec: SandboxSpec | None = None) -> "AsyncSandbox":
        """Create the sandbox and write the spec's ``files``; if writing them fails, the sandbox is closed again."""
        if self._done or self._handle is not None:
            raise RuntimeError("the sandbox was started already")
        spec = spec or self._spec
        if spec is None:
            raise ValueError("AsyncSandbox.start() needs a SandboxSpec")
        handle = await self._provider.create(spec)
        try:
            with tempfile.TemporaryDirectory(prefix="nemo-gym-sandbox-files-") as staging:
                for index, (target, text) in enumerate(spec.files.items()):
                    source = Path(staging) / str(index)
                    source.write_text(text, encoding="utf-8")
                    await self._provider.upload_file(handle, source, target)
        except BaseException:
            await self._provider.close(handle)
            await self._provider.aclose()
            self._done = True
            raise
        self._spec, self._handle = spec, handle
        return self

    async def exec(
        self, command: str, *, cwd: str | None = None, env: dict[str, str] | None = None,
        timeout_s: int | float | None = DEFAULT_EXEC_TIMEOUT_S, user: str | int | None = None,
    ) -> SandboxExecResult:  # fmt: skip
        """Run ``command`` (in the spec's ``workdir`` unless ``cwd`` says otherwise)."""
        handle = self._running()
        cwd = cwd if cwd is not None else self._spec.workdir
        return await self._provider.exec(handle, command, cwd=cwd, env=env, timeout_s=timeout_s, user=user)

    async def upload(self, local_path: Path | str, remote_path: str) -> None:
        await self._provider.upload_file(self._running(), Path(local_path), remote_path)

    async def download(self, remote_path: str, local_path: Path | str) -> None:
        await self._provider.download_file(self._running(), remote_path, Path(local_path))

    async def status(self) -> SandboxStatus:
        if self._handle is None:
            return SandboxStatus.STOPPED if self._done else SandboxStatus.UNKNOWN
        return await self._provider.status(self._handle)

    async def stop(self) -> None:
        if self._done:
            return
        self._done = True
        try:
            if self._handle is not None:
                handle, self._handle = self._handle, None
                await self._provider.close(handle)
        finally:
            await self._provider.aclose()

    async def __aenter__(self) -> "AsyncSandbox":
        return await self.start()

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.stop()
