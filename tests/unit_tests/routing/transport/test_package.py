"""nemo_gym.routing.transport: its transports, chosen by name."""

from __future__ import annotations

import pytest

from nemo_gym.routing.transport import DEFAULT_TRANSPORT, TRANSPORTS, Transport, transport_class
from nemo_gym.routing.transport.unix import UnixTransport
from tests.unit_tests.conformance import assert_implements


def test_a_transport_is_chosen_by_name_and_the_default_is_unix():
    assert transport_class("unix") is UnixTransport
    assert transport_class() is transport_class(DEFAULT_TRANSPORT) is UnixTransport


@pytest.mark.parametrize("name", sorted(TRANSPORTS))
def test_every_named_transport_implements_the_protocol(name, tmp_path):
    assert_implements(transport_class(name), Transport)
    assert isinstance(transport_class(name)(str(tmp_path)), Transport)


def test_an_unknown_transport_name_is_refused():
    with pytest.raises(KeyError):
        transport_class("carrier-pigeon")
