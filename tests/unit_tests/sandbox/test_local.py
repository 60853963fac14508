"""nemo_gym.sandbox.local: upstream's AsyncSandbox on the local provider, a fresh directory whose commands run with only the spec's environment."""

from __future__ import annotations

import os

import pytest

from nemo_gym.sandbox import AsyncSandbox, SandboxSpec, SandboxStatus


@pytest.mark.anyio
async def test_a_local_sandbox_writes_the_specs_files_then_runs_commands_in_its_workdir_with_its_env(tmp_path):
    spec = SandboxSpec(workdir="repo", env={"GREETING": "hello"}, files={"repo/task.txt": "fix the bug\n"})
    async with AsyncSandbox({"local": {"root": str(tmp_path)}}) as sandbox:
        await sandbox.start(spec)
        result = await sandbox.exec('cat task.txt; echo "$GREETING $EXTRA"; pwd', env={"EXTRA": "there"})
        assert await sandbox.status() == SandboxStatus.RUNNING
    lines = result.stdout.splitlines()
    assert (result.return_code, result.error_type, lines[:2]) == (0, None, ["fix the bug", "hello there"])
    assert lines[2].endswith("/repo")


@pytest.mark.anyio
async def test_a_command_does_not_see_this_processs_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("NEMO_GYM_TEST_CREDENTIAL", "do-not-leak")
    async with AsyncSandbox({"local": {"root": str(tmp_path)}}) as sandbox:
        await sandbox.start(SandboxSpec())
        result = await sandbox.exec('echo "[$NEMO_GYM_TEST_CREDENTIAL]"')
    assert result.stdout == "[]\n"


@pytest.mark.anyio
async def test_exit_code_and_stderr_come_back_and_a_command_past_its_timeout_is_killed(tmp_path):
    async with AsyncSandbox({"local": {"root": str(tmp_path)}}) as sandbox:
        await sandbox.start(SandboxSpec())
        failed = await sandbox.exec("echo oops >&2; exit 3")
        slow = await sandbox.exec("sleep 30 & wait", timeout_s=0.5)
    assert (failed.return_code, failed.stderr) == (3, "oops\n")
    assert (slow.return_code, slow.error_type) == (124, "timeout")


@pytest.mark.anyio
async def test_files_go_in_and_out_and_a_path_outside_the_sandbox_is_refused(tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("payload")
    async with AsyncSandbox({"local": {"root": str(tmp_path / "boxes")}}) as sandbox:
        await sandbox.start(SandboxSpec())
        await sandbox.upload(source, "/data/in.txt")
        await sandbox.exec("tr a-z A-Z < data/in.txt > data/out.txt")
        await sandbox.download("data/out.txt", tmp_path / "out.txt")
        with pytest.raises(ValueError, match="outside the sandbox"):
            await sandbox.download("../../in.txt", tmp_path / "stolen.txt")
    assert (tmp_path / "out.txt").read_text() == "PAYLOAD"


@pytest.mark.anyio
async def test_stop_removes_the_sandbox_and_it_cannot_be_used_again(tmp_path):
    sandbox = await AsyncSandbox({"local": {"root": str(tmp_path)}}, SandboxSpec()).start()
    assert len(os.listdir(tmp_path)) == 1
    await sandbox.stop()
    assert os.listdir(tmp_path) == [] and await sandbox.status() == SandboxStatus.STOPPED
    with pytest.raises(RuntimeError, match="not been started"):
        await sandbox.exec("true")
    with pytest.raises(RuntimeError, match="started already"):
        await sandbox.start()
