"""nemo_gym.config.ports: a free port is drawn below the ephemeral range, is free now, and is handed to one
process only while its server may still be starting (the reservation every drawing process sees)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from nemo_gym.config import ports

# Processes drawing at once from a range no larger than they draw in all, many times over.
DRAWERS, DRAWS, RANGE = 4, 20, 120
DRAW = """import json, sys
from nemo_gym.config import ports
ports.FREE_PORTS = (int(sys.argv[1]), int(sys.argv[2]))
sys.stdin.readline()
print(json.dumps([ports.free_port() for _ in range(int(sys.argv[3]))]))
"""


@pytest.fixture(autouse=True)
def own_reservations(tmp_path, monkeypatch):
    """Reservations of this test alone (drawing processes it starts are given the same directory)."""
    monkeypatch.setenv(ports.RESERVATIONS_ENV, str(tmp_path / "reserved"))
    return tmp_path / "reserved"


def free_run(length: int) -> int:
    """The first port of ``length`` ports in a row nothing holds now."""
    return next(port for port in range(20000, 30000, length) if not any(ports.port_in_use("127.0.0.1", port + i) for i in range(length)))


def test_a_free_port_is_drawn_below_the_ephemeral_range_where_no_outgoing_connection_can_take_it():
    ephemeral = ports.ephemeral_ports()
    if ephemeral is None:
        pytest.skip(f"{ports.EPHEMERAL_PORTS_FILE} cannot be read here")
    drawn = [ports.free_port() for _ in range(200)]
    assert all(ports.FREE_PORTS[0] <= port < ephemeral[0] for port in drawn)
    assert len(set(drawn)) == 200  # drawn, not handed out in order, and never twice while reserved


def test_a_port_held_by_someone_is_never_a_free_port(monkeypatch):
    port = free_run(2)
    monkeypatch.setattr(ports, "FREE_PORTS", (port, port + 1))
    with socket.socket() as held:
        held.bind(("127.0.0.1", port))
        held.listen()
        assert ports.free_port() == port + 1


def test_free_port_falls_back_to_the_kernels_choice_where_no_port_below_the_ephemeral_range_is_left(monkeypatch):
    monkeypatch.setattr(ports, "ephemeral_ports", lambda: (ports.FREE_PORTS[0], 60999))
    port = ports.free_port()
    assert 0 < port < 65536 and not ports.port_in_use("127.0.0.1", port)


def test_processes_drawing_at_once_from_one_range_never_get_the_same_port():
    """What "address already in use" came from at start-up on a loaded machine (L16): another test's process drew
    the port a server had been given and not yet bound."""
    low = free_run(RANGE)
    drawers = [
        subprocess.Popen([sys.executable, "-c", DRAW, str(low), str(low + RANGE - 1), str(DRAWS)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(DRAWERS)
    ]
    for drawer in drawers:  # all drawing at once
        drawer.stdin.write("go\n")
        drawer.stdin.flush()
    drawn = [port for drawer in drawers for port in json.loads(drawer.communicate(timeout=120)[0])]
    assert len(drawn) == DRAWERS * DRAWS and len(set(drawn)) == len(drawn)
    assert all(low <= port < low + RANGE for port in drawn)


def test_a_port_reserved_by_another_process_is_not_drawn_until_its_reservation_lapses(monkeypatch, own_reservations):
    port = free_run(2)
    monkeypatch.setattr(ports, "FREE_PORTS", (port, port + 1))
    subprocess.run([sys.executable, "-c", f"from nemo_gym.config import ports; ports.FREE_PORTS = ({port}, {port}); ports.free_port()"], check=True, timeout=60)
    assert {ports.free_port()} == {port + 1}
    lapsed = time.time() - ports.RESERVED_SECONDS - 1
    for reserved in (port, port + 1):
        os.utime(own_reservations / str(reserved), (lapsed, lapsed))
    assert {ports.free_port(), ports.free_port()} == {port, port + 1}


def test_free_port_still_draws_where_reservations_cannot_be_kept(monkeypatch, tmp_path):
    (tmp_path / "a_file").write_text("")
    monkeypatch.setenv(ports.RESERVATIONS_ENV, str(tmp_path / "a_file" / "reserved"))
    port = ports.free_port()
    assert not ports.port_in_use("127.0.0.1", port)
