"""The Unix transport: liveness is a name held in the abstract socket namespace, not a file a /tmp cleaner
can delete; a private socket serves, and is served by, processes of this user only."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable

import pytest

from nemo_gym.routing.transport.unix import LifeName, is_alive, live_workers, socket_address
from nemo_gym.sessions.worker import new_worker_id
from tests.unit_tests.routing_workers import new_session

NOBODY = 65534


@pytest.fixture
def socket_dir():
    directory = tempfile.mkdtemp(prefix="ngw-test-", dir="/tmp")
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def test_a_worker_is_alive_while_it_holds_its_name_and_dead_once_it_releases_it(socket_dir):
    worker = new_worker_id()
    assert not is_alive(socket_dir, worker)
    life = LifeName(socket_dir, worker)
    life.hold()
    try:
        assert is_alive(socket_dir, worker)
        assert is_alive(socket_dir, worker)  # asking does not take the name
    finally:
        life.release()
    assert not is_alive(socket_dir, worker)


def test_a_live_worker_stays_alive_when_its_socket_directory_is_emptied_or_removed(socket_dir):
    worker = new_worker_id()
    life = LifeName(socket_dir, worker)
    life.hold()
    try:
        for entry in os.listdir(socket_dir):
            os.unlink(os.path.join(socket_dir, entry))
        assert is_alive(socket_dir, worker)
        os.rmdir(socket_dir)
        assert is_alive(socket_dir, worker)
        assert live_workers(socket_dir) == 1
    finally:
        life.release()


def test_a_killed_worker_is_dead_at_once_and_no_longer_counted(socket_dir):
    worker = new_worker_id()
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import sys, time; from nemo_gym.routing.transport.unix import LifeName; life = LifeName({socket_dir!r}, {worker!r}); life.hold(); print('held', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout.readline() == b"held\n"
        assert is_alive(socket_dir, worker) and live_workers(socket_dir) == 1
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
    assert not is_alive(socket_dir, worker)
    assert live_workers(socket_dir) == 0


def test_workers_of_another_server_are_not_counted(socket_dir):
    other = tempfile.mkdtemp(prefix="ngw-test-", dir="/tmp")
    mine, theirs = LifeName(socket_dir, new_worker_id()), LifeName(other, new_worker_id())
    mine.hold()
    theirs.hold()
    try:
        assert live_workers(socket_dir) == 1 and live_workers(other) == 1
    finally:
        mine.release()
        theirs.release()
        os.rmdir(other)


class AnotherUser:
    """A forked child that runs ``work`` as the user nobody. ``work`` calls ``ready()`` once set up,
    and the bytes it returns are the child's report."""

    def __init__(self, work: Callable[[Callable[[], None]], bytes]) -> None:
        if os.getuid() != 0:
            pytest.skip("needs root, to run a process as another user")
        read, write = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            try:
                os.close(read)
                os.setgid(NOBODY)
                os.setuid(NOBODY)
                os.write(write, work(lambda: os.write(write, b"ready\n")))
            finally:
                os._exit(0)
        os.close(write)
        self.pipe = os.fdopen(read, "rb")
        assert self.pipe.readline() == b"ready\n"

    def report(self) -> bytes:
        with self.pipe:
            report = self.pipe.read()
        os.waitpid(self.pid, 0)
        return report


def squat(address: str) -> Callable[[Callable[[], None]], bytes]:
    def work(ready: Callable[[], None]) -> bytes:
        with socket.socket(socket.AF_UNIX) as listener:
            listener.bind(address)
            listener.listen()
            listener.settimeout(3)
            ready()
            try:
                connection, _ = listener.accept()
                connection.settimeout(3)
                return b"got a request: " + connection.recv(100) if connection.recv(1, socket.MSG_PEEK) else b"nothing"
            except OSError as error:
                return repr(error).encode()

    return work


def visit(address: str) -> Callable[[Callable[[], None]], bytes]:
    def work(ready: Callable[[], None]) -> bytes:
        with socket.socket(socket.AF_UNIX) as connection:
            connection.settimeout(5)
            connection.connect(address)
            ready()
            try:
                connection.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                return connection.recv(100)
            except ConnectionResetError:
                return b""

    return work


@pytest.mark.anyio
async def test_a_dead_owners_socket_name_taken_by_another_user_gets_no_request_and_the_session_410(pair):
    a, b, caller = pair
    cookies = await new_session(caller, a)
    assert (await (await caller.post(b, "/increment", cookies)).json())["count"] == 2  # b now pools a connection to a
    await a.stop()
    squatter = AnotherUser(squat(socket_address(a.server.transport.socket_dir, a.server.worker_id)))
    response = await caller.post(b, "/increment", cookies)
    assert response.status == 410
    assert a.server.worker_id in (await response.json())["detail"]
    assert b"got a request" not in squatter.report()


@pytest.mark.anyio
async def test_the_private_socket_answers_no_process_of_another_user(pair):
    a, b, caller = pair
    visitor = AnotherUser(visit(socket_address(a.server.transport.socket_dir, a.server.worker_id)))
    assert await asyncio.to_thread(visitor.report) == b""  # closed, unanswered
    assert (await caller.post(a, "/echo/x")).status == 200
