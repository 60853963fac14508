"""Worker liveness: a name held in the abstract socket namespace, not a file a /tmp cleaner can delete."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest

from nemo_gym.routing.liveness import LifeName, is_alive, live_workers
from nemo_gym.routing.worker import new_worker_id


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
        [sys.executable, "-c", f"import sys, time; from nemo_gym.routing.liveness import LifeName; life = LifeName({socket_dir!r}, {worker!r}); life.hold(); print('held', flush=True); time.sleep(600)"],
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
