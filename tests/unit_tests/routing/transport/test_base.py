"""The transport seam (``transport.base``): a declared protocol, which each transport implements."""

from __future__ import annotations

from nemo_gym.routing.transport import Transport
from nemo_gym.routing.transport.tcp import TcpTransport
from nemo_gym.routing.transport.unix import UnixTransport
from tests.unit_tests.conformance import assert_implements


def test_the_unix_transport_implements_every_method_of_the_protocol():
    assert_implements(UnixTransport, Transport)


def test_the_tcp_transport_implements_every_method_of_the_protocol():
    assert_implements(TcpTransport, Transport)
