"""nemo_gym.sandbox.Sandbox (upstream's synchronous wrapper of AsyncSandbox, used by mini_swe_agent_2 and
osworld_agent), SandboxEndpoint and AsyncSandbox.endpoint, on the local provider."""

from __future__ import annotations

import asyncio

import pytest

from nemo_gym.sandbox import AsyncSandbox, Sandbox, SandboxEndpoint, SandboxSpec, SandboxStatus


def test_sandbox_runs_a_local_sandboxs_life_without_an_event_loop_of_the_callers(tmp_path):
    sandbox = Sandbox({"local": {"root": str(tmp_path)}})
    assert sandbox.start(SandboxSpec(files={"a.txt": "hi\n"})) is sandbox
    assert sandbox.status() == SandboxStatus.RUNNING
    result = sandbox.exec("cat a.txt; echo $X", env={"X": "there"})
    assert (result.return_code, result.stdout) == (0, "hi\nthere\n")
    (tmp_path / "up.txt").write_text("up\n")
    sandbox.upload(tmp_path / "up.txt", "up.txt")
    sandbox.download("up.txt", tmp_path / "down.txt")
    assert (tmp_path / "down.txt").read_text() == "up\n"
    sandbox.stop()
    sandbox.stop()
    assert sandbox.status() == SandboxStatus.STOPPED


def test_sandbox_as_a_context_manager_stops_on_exit(tmp_path):
    with Sandbox({"local": {"root": str(tmp_path)}}, SandboxSpec()).start() as sandbox:
        assert sandbox.exec("echo ok").stdout == "ok\n"
    assert sandbox.status() == SandboxStatus.STOPPED


def test_sandbox_called_from_inside_its_own_loop_is_refused_not_deadlocked(tmp_path):
    sandbox = Sandbox({"local": {"root": str(tmp_path)}}, SandboxSpec()).start()
    try:
        async def inside():
            return sandbox.status()

        with pytest.raises(RuntimeError, match="its own event loop"):
            asyncio.run_coroutine_threadsafe(inside(), sandbox._loop).result(timeout=30)
    finally:
        sandbox.stop()


def test_a_sandbox_endpoint_is_an_absolute_url_with_string_headers():
    endpoint = SandboxEndpoint(" http://127.0.0.1:8080/x ", {"X-Port": 8080})
    assert (endpoint.endpoint, endpoint.headers) == ("http://127.0.0.1:8080/x", {"X-Port": "8080"})
    for bad in ("", "   ", "/relative", "127.0.0.1:80"):
        with pytest.raises(ValueError, match="absolute URL"):
            SandboxEndpoint(bad)
    with pytest.raises(TypeError, match="mapping"):
        SandboxEndpoint("http://h", headers=["a"])


@pytest.mark.anyio
async def test_endpoint_needs_a_declared_port_and_a_provider_that_routes_ports(tmp_path):
    async with AsyncSandbox({"local": {"root": str(tmp_path)}}) as sandbox:
        await sandbox.start(SandboxSpec(ports=[8080]))
        for port in (0, 65536, True, "8080"):
            with pytest.raises(ValueError, match="between 1 and 65535"):
                await sandbox.endpoint(port)
        with pytest.raises(ValueError, match="not declared"):
            await sandbox.endpoint(9090)
        with pytest.raises(NotImplementedError, match="'local'"):
            await sandbox.endpoint(8080)


@pytest.mark.anyio
async def test_async_with_does_not_start_the_sandbox_start_inside_it_does_as_upstreams(tmp_path):
    async with AsyncSandbox({"local": {"root": str(tmp_path)}}) as sandbox:
        assert await sandbox.status() == SandboxStatus.UNKNOWN
        assert await sandbox.start(SandboxSpec(files={"a.txt": "a\n"})) is sandbox
        assert (await sandbox.exec("cat a.txt")).stdout == "a\n"
    assert await sandbox.status() == SandboxStatus.STOPPED
