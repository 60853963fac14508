"""The lifecycle tests use the durable tests' SQLite store."""

from tests.unit_tests.durable.conftest import store  # noqa: F401 (a fixture)
