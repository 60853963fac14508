"""A row's text with the requests it remembers (``durable.applied``): joined from each request's JSON made once,
it is what ``json.dumps`` of the whole object writes, and reads back as it was written."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from nemo_gym.durable.applied import APPLIED_KEY, STATE_KEY, Applied, state_of, unwrap, wrap

TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)))
HEADERS = st.lists(st.tuples(TEXT, TEXT), max_size=3).map(tuple)
APPLIED = st.builds(Applied, TEXT, st.integers(100, 599), HEADERS, st.none() | st.binary(max_size=64))


@given(TEXT, st.lists(APPLIED, min_size=1, max_size=16))
def test_a_row_is_what_json_writes_of_its_state_and_requests_and_reads_back_as_written(state: str, applied: list[Applied]):
    row = wrap(state, applied)
    assert row == json.dumps({STATE_KEY: state, APPLIED_KEY: [item.to_json() for item in applied]})
    assert unwrap(row) == (state, applied)
    assert wrap(state, applied) == row  # each request's text, made once, is the same the next time


@given(TEXT)
def test_a_row_that_remembers_no_request_is_the_state_as_it_is(state: str):
    assert wrap(state, []) == state


@given(TEXT, st.lists(APPLIED, max_size=4), TEXT)
def test_the_state_read_alone_is_the_state_unwrap_reads(state: str, applied: list[Applied], tail: str):
    """``state_of`` (a tombstone's check, on every commit of one) and ``unwrap`` agree on any row: one made by
    ``wrap``, and one cut short or trailed by other text (not a row of remembered requests: the text as it is)."""
    row = wrap(state, applied)
    for text in (row, row[: len(row) // 2], row + tail, tail):
        assert state_of(text) == unwrap(text)[0]
