"""A replica set's settings: advertise_host, forward_port, peer_dead_after_seconds and TLS between replicas are known keys,
and a replica no other replica could reach, or whose forwarding port is taken, does not start."""

from __future__ import annotations

import logging
import socket

import pytest
from pydantic import ValidationError

from nemo_gym.base_resources_server import BaseResourcesServerConfig
from nemo_gym.process.run import claim_replica_port
from nemo_gym.routing.replica import ReplicaAddressError, advertised_host

BASE = {"name": "counter", "host": "127.0.0.1", "port": 18080, "num_workers": 2, "session_secret": "s" * 40}


def test_the_replica_settings_are_known_keys_with_stated_defaults(caplog):
    settings = {**BASE, "advertise_host": "10.0.0.2", "forward_port": 18181, "peer_dead_after_seconds": 5}
    with caplog.at_level(logging.WARNING):
        config = BaseResourcesServerConfig.model_validate(settings)
    assert "ignoring keys" not in caplog.text
    assert (config.advertise_host, config.forward_port, config.peer_dead_after_seconds) == ("10.0.0.2", 18181, 5)
    defaults = BaseResourcesServerConfig.model_validate(BASE)
    assert (defaults.advertise_host, defaults.forward_port, defaults.peer_dead_after_seconds) == (None, None, 30.0)


def test_tls_between_replicas_needs_all_three_files():
    with pytest.raises(ValidationError, match="replica_tls_ca_file"):
        BaseResourcesServerConfig.model_validate({**BASE, "replica_tls_certfile": "c.pem", "replica_tls_keyfile": "k.pem"})


def test_a_wildcard_host_is_advertised_only_as_advertise_host():
    assert advertised_host("0.0.0.0", "10.0.0.2") == "10.0.0.2"
    assert advertised_host("10.0.0.3", None) == "10.0.0.3"
    with pytest.raises(ReplicaAddressError, match="advertise_host"):
        advertised_host("0.0.0.0", None)


def test_a_replica_on_a_wildcard_host_without_advertise_host_does_not_start():
    config = BaseResourcesServerConfig.model_validate({**BASE, "host": "0.0.0.0"})
    with pytest.raises(SystemExit, match="advertise_host"):
        claim_replica_port(config, "counter")


def test_a_replica_whose_forwarding_port_is_taken_does_not_start():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        config = BaseResourcesServerConfig.model_validate({**BASE, "forward_port": taken.getsockname()[1]})
        with pytest.raises(SystemExit, match="forwarding port"):
            claim_replica_port(config, "counter")


def test_a_config_without_a_session_secret_dumps_without_the_key_so_a_redacted_dump_validates_again():
    # Upstream servers (anyterminal_agent's _safe_config_json) dump their config, replace every *secret* key's
    # value with "***" and validate it again; an unset session_secret must not be there to be replaced.
    config = BaseResourcesServerConfig(**{key: value for key, value in BASE.items() if key != "session_secret"})
    dumped = config.model_dump(mode="json")
    assert "session_secret" not in dumped
    assert BaseResourcesServerConfig.model_validate({**dumped, **{key: "***" for key in dumped if "secret" in key}}) == config
    assert BaseResourcesServerConfig(**BASE).model_dump()["session_secret"] == "s" * 40
