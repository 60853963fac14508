"""``AsyncSandbox``: one sandbox's life (start, exec, files, endpoints, stop) on a provider, as upstream's
API has it; ``Sandbox``, the same for synchronous callers."""

from __future__ import annotations

import asyncio
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nemo_gym.sandbox.registry import create_provider
from nemo_gym.sandbox.types import SandboxEndpoint, SandboxExecResult, SandboxHandle, SandboxProvider, SandboxSpec, SandboxStatus

DEFAULT_EXEC_TIMEOUT_S = 180


class AsyncSandbox:
    """``AsyncSandbox(provider, spec)``: ``provider`` a provider or a one-key provider config. Usable once: after ``stop`` it is done.
    ``async with AsyncSandbox(...) as sandbox: await sandbox.start()``, as upstream's: entering does not start it."""

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

    async def endpoint(self, port: int) -> SandboxEndpoint:
        """The route to ``port`` (one the spec's ``ports`` declares) from the provider's ``endpoint``;
        NotImplementedError for a provider that routes no ports (``local``)."""
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise ValueError(f"a sandbox endpoint port must be a whole number between 1 and 65535, got {port!r}")
        declared = self._spec.ports if self._spec is not None else ()
        if port not in declared:
            raise ValueError(f"port {port} is not declared in SandboxSpec.ports {list(declared)!r}")
        route = getattr(self._provider, "endpoint", None)
        if route is None:
            raise NotImplementedError(f"the {getattr(self._provider, 'name', type(self._provider).__name__)!r} sandbox provider routes no ports")
        resolved = await route(self._running(), port)
        if not isinstance(resolved, SandboxEndpoint):
            raise TypeError(f"a provider's endpoint() must return a SandboxEndpoint, got {type(resolved).__name__}")
        return resolved

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
        """As upstream's: the block stops the sandbox on leaving; ``start()`` inside it starts it."""
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.stop()


class Sandbox:
    """``Sandbox(provider, spec)``: ``AsyncSandbox``'s operations as blocking calls, run on an event loop of
    its own (a daemon thread, ended by ``stop``). Not callable from inside that loop."""

    def __init__(self, provider: Mapping[str, Any] | SandboxProvider, spec: SandboxSpec | None = None) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="nemo-gym-sandbox", daemon=True)
        self._thread.start()
        self._closed = False
        try:
            self._sandbox = self._run(self._build(provider, spec))
        except BaseException:
            self._close_loop()
            raise

    @staticmethod
    async def _build(provider: Mapping[str, Any] | SandboxProvider, spec: SandboxSpec | None) -> AsyncSandbox:
        return AsyncSandbox(provider, spec)

    def _run(self, awaitable: Any) -> Any:
        if threading.current_thread() is self._thread:
            awaitable.close()
            raise RuntimeError("a Sandbox cannot be called from inside its own event loop; use AsyncSandbox there")
        return asyncio.run_coroutine_threadsafe(awaitable, self._loop).result()

    def _close_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def start(self, spec: SandboxSpec | None = None) -> "Sandbox":
        self._run(self._sandbox.start(spec))
        return self

    def exec(
        self, command: str, *, cwd: str | None = None, env: dict[str, str] | None = None,
        timeout_s: int | float | None = DEFAULT_EXEC_TIMEOUT_S, user: str | int | None = None,
    ) -> SandboxExecResult:  # fmt: skip
        return self._run(self._sandbox.exec(command, cwd=cwd, env=env, timeout_s=timeout_s, user=user))

    def upload(self, local_path: Path | str, remote_path: str) -> None:
        self._run(self._sandbox.upload(local_path, remote_path))

    def download(self, remote_path: str, local_path: Path | str) -> None:
        self._run(self._sandbox.download(remote_path, local_path))

    def status(self) -> SandboxStatus:
        return SandboxStatus.STOPPED if self._closed else self._run(self._sandbox.status())

    def endpoint(self, port: int) -> SandboxEndpoint:
        return self._run(self._sandbox.endpoint(port))

    def stop(self) -> None:
        """Stop the sandbox and end the loop; again, nothing."""
        if self._closed:
            return
        self._closed = True
        try:
            self._run(self._sandbox.stop())
        finally:
            self._close_loop()

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()
