"""A request id is 1 to ``MAX_ID_LENGTH`` printable ASCII characters without spaces: ``valid_id`` (one regular
expression) and that definition, read byte by byte, agree on every header value."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from nemo_gym.routing.request_id import MAX_ID_LENGTH, valid_id

# Mostly the edges: space, the printable ends, DEL, control bytes, and bytes above ASCII.
BYTES = st.sampled_from([0x00, 0x09, 0x0A, 0x20, 0x21, 0x41, 0x7E, 0x7F, 0x80, 0xFF]) | st.integers(0, 255)


def by_definition(value: bytes) -> bool:
    return 0 < len(value) <= MAX_ID_LENGTH and all(0x21 <= byte <= 0x7E for byte in value)


@given(st.lists(BYTES, max_size=MAX_ID_LENGTH + 2).map(bytes))
def test_an_id_is_valid_exactly_when_it_is_1_to_255_printable_ascii_characters_without_spaces(value: bytes):
    assert valid_id(value) == by_definition(value)


def test_an_id_at_the_length_limit_is_valid_and_one_past_it_or_empty_is_not():
    assert valid_id(b"k" * MAX_ID_LENGTH) and not valid_id(b"k" * (MAX_ID_LENGTH + 1)) and not valid_id(b"")
    assert not valid_id(b"key\n") and not valid_id(b"a key")
