"""The lifecycle tests use the durable tests' SQLite stores (one on a tmpfs that fills up)."""

from tests.unit_tests.durable.conftest import store, tmpfs, tmpfs_store  # noqa: F401 (fixtures)
