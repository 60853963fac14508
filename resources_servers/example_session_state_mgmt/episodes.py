"""The counter episodes the multi-worker numbers are measured with: +1 then +2, each from its own start."""

from __future__ import annotations

from pathlib import Path

from nemo_gym.client.rollouts import read_rows

DATA = Path(__file__).resolve().parent / "data" / "example.jsonl"


def plus_one_plus_two(count: int) -> list[dict]:
    """``count`` rows of the first example task ("add 1, then add 2, then get the count"), starting at
    0, 1, 2, ... so that no two episodes expect the same count."""
    row = read_rows(DATA, limit=1)[0]
    return [{**row, "initial_count": start, "expected_count": start + 3} for start in range(count)]
