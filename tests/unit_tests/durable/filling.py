"""Writes to a store whose file system fills up, until it refuses one."""

from __future__ import annotations

from nemo_gym.durable.store import SessionStore, StoreUnavailable

WORKER = "0123456789abcdef"
STATE = "x" * 3000  # a few pages' worth of log per write, so the log soon needs blocks the file system lacks
MAX_WRITES = 10_000  # a bound, never an expectation


async def commit_until_refused(store: SessionStore) -> StoreUnavailable:
    for number in range(MAX_WRITES):
        try:
            await store.commit(WORKER, {f"s{number}": f'"{STATE}{number}"'})
        except StoreUnavailable as refused:
            return refused
    raise AssertionError(f"{MAX_WRITES} writes fitted on the full file system")
