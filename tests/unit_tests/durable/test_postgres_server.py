"""The tests' PostgreSQL (tests/postgres.py): it asks for its password, and keeps its data across stop and start."""

import psycopg
import pytest

from tests.postgres import postgres_or_skip


@pytest.fixture(scope="module")
def server():
    with postgres_or_skip(password="pa:ss@word") as postgres:
        yield postgres


def test_a_client_without_the_password_is_refused(server):
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(server.dsn(password="wrong"), connect_timeout=10)
    with psycopg.connect(server.dsn(), connect_timeout=10) as connection:
        assert connection.execute("SELECT current_user").fetchone() == ("gym",)


def test_its_data_outlives_a_stop_and_a_start_over_tcp_and_its_socket(server):
    with psycopg.connect(server.dsn(), autocommit=True) as connection:
        connection.execute("CREATE TABLE kept (n int)")
        connection.execute("INSERT INTO kept VALUES (7)")
    server.stop()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(server.dsn(), connect_timeout=10)
    server.start()
    with psycopg.connect(server.dsn(via_socket=True), connect_timeout=10) as connection:
        assert connection.execute("SELECT n FROM kept").fetchall() == [(7,)]
