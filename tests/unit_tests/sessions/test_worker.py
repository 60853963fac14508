"""nemo_gym.sessions.worker: a worker's ID is random and of one exact form, the only form ever routed to."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nemo_gym.sessions.worker import WORKER_ID_PATTERN, is_worker_id, new_worker_id


def test_a_new_worker_id_is_a_worker_id_and_no_two_are_the_same():
    ids = {new_worker_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(is_worker_id(worker) for worker in ids)


@pytest.mark.parametrize(
    "value",
    [
        "0123456789ABCDEF",  # upper case
        "0123456789abcde",  # short
        "0123456789abcdef0",  # long
        "0123456789abcdeg",
        "../../etc/passwd",
        "0123456789abcdef\n",
        " 0123456789abcdef",
        b"0123456789abcdef",
        16,
        None,
        ["0123456789abcdef"],
    ],
)
def test_nothing_but_sixteen_lower_case_hex_digits_is_a_worker_id(value):
    assert is_worker_id(value) is False


@given(st.text(max_size=40))
def test_a_text_is_a_worker_id_exactly_when_it_is_sixteen_lower_case_hex_digits(text):
    assert is_worker_id(text) is (len(text) == 16 and all(char in "0123456789abcdef" for char in text))
    assert is_worker_id(text) is (WORKER_ID_PATTERN.fullmatch(text) is not None)
