"""Fixtures of the transport tests."""

from __future__ import annotations

import tempfile

import pytest

from nemo_gym.routing.transport.unix import remove_socket_dir


@pytest.fixture
def socket_dir():
    directory = tempfile.mkdtemp(prefix="ngw-", dir="/tmp")
    yield directory
    remove_socket_dir(directory)


