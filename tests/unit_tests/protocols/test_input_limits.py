"""The input limits' settings, and the head limit's byte count read beside the HTTP parser on a real uvicorn."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_gym.config import free_port
from nemo_gym.config_types import BaseRunServerInstanceConfig
from nemo_gym.protocols.input_limits import InputLimits
from tests.e2e.test_input_limits import head_of
from tests.unit_tests.in_process_server import serving_in_a_thread

LIMIT = 1000


async def ok(scope, receive, send) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    """A uvicorn held to a 1000-byte head limit, in a thread of its own."""
    with serving_in_a_thread(ok, free_port(), http=InputLimits(max_header_bytes=LIMIT).protocol()) as port:
        yield port


def status_of(port: int, pieces: list[bytes]) -> int:
    """Send ``pieces`` one by one (each its own segment), then read the reply's status."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for piece in pieces:
            connection.sendall(piece)
            time.sleep(0.001)
        reply = b""
        while b"\r\n" not in reply:
            received = connection.recv(4096)
            assert received, "closed without a reply"
            reply += received
    return int(reply.split()[1])


@given(
    size=st.one_of(st.integers(LIMIT - 40, LIMIT + 40), st.integers(40, 4 * LIMIT)),
    cuts=st.lists(st.integers(1, 4 * LIMIT), max_size=6),
)
@settings(max_examples=80, deadline=None)
def test_a_head_is_served_exactly_when_it_is_within_the_limit_however_its_bytes_are_split(port, size, cuts):
    head = head_of(size)
    bounds = [0, *sorted(cut for cut in set(cuts) if cut < len(head)), len(head)]
    pieces = [head[start:end] for start, end in zip(bounds, bounds[1:])]
    assert status_of(port, pieces) == (200 if size <= LIMIT else 431)


def test_the_limits_are_settings_with_their_defaults():
    config = BaseRunServerInstanceConfig(name="x", port=1)
    assert InputLimits.of(config) == InputLimits()
    assert InputLimits.of(BaseRunServerInstanceConfig(name="x", port=1, max_header_bytes=10, header_timeout_seconds=0.5)) == InputLimits(10, 0.5)


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("max_header_bytes", 0),
        ("header_timeout_seconds", 0),
        ("header_timeout_seconds", float("inf")),
        ("body_timeout_seconds", float("nan")),
        ("min_body_bytes_per_second", -1),
        ("min_body_bytes_per_second", float("inf")),
    ],
)
def test_a_limit_that_is_not_a_finite_positive_number_is_a_config_error(setting, value):
    with pytest.raises(pydantic.ValidationError, match=setting):
        BaseRunServerInstanceConfig(name="x", port=1, **{setting: value})
