"""A replica set's settings: advertise_host, forward_port, peer_dead_after_seconds, TLS between replicas and replicas are
known keys, a bad replicas list is refused at load, and a replica no other replica could reach, or whose forwarding port
is taken, does not start."""

from __future__ import annotations

import logging
import socket

import pytest
from pydantic import ValidationError

from nemo_gym.base_resources_server import BaseResourcesServerConfig
from nemo_gym.config import ConfigError
from nemo_gym.process import discovery
from nemo_gym.process.run import claim_replica_port
from nemo_gym.routing.replica import ReplicaAddressError, advertised_host, other_replica_urls

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


def test_replicas_is_a_known_key_listing_root_urls_with_their_ports(caplog):
    with caplog.at_level(logging.WARNING):
        config = BaseResourcesServerConfig.model_validate({**BASE, "replicas": ["http://10.0.0.2:18080", "HTTPS://Replica-3.Example/", "http://[fd00::4]"]})
    assert "ignoring keys" not in caplog.text
    assert config.replicas == ["http://10.0.0.2:18080", "https://replica-3.example:443", "http://[fd00::4]:80"]
    assert BaseResourcesServerConfig.model_validate(BASE).replicas == []


COUNTER = "counter:\n  resources_servers:\n    example_session_state_mgmt:\n      num_workers: 2\n      replicas: {}\n"


@pytest.mark.parametrize(
    "value",
    [
        '"http://10.0.0.2:18080"',
        "[ftp://10.0.0.2:18080]",
        "[10.0.0.2:18080]",
        "[http://10.0.0.2:18080/counter]",
        "['http://10.0.0.2:18080?x=1']",
        "[http://user@10.0.0.2:18080]",
        "[http://10.0.0.2:99999]",
        "[http://bad_host:18080]",
        "[http://0.0.0.0:18080]",
        "[http:///]",
        "[12]",
        "[http://10.0.0.2:18080, http://10.0.0.2:18080]",
        "[http://replica:80, HTTP://REPLICA/]",
    ],
)
def test_a_bad_replicas_value_is_refused_at_load_naming_the_key(tmp_path, value):
    path = tmp_path / "counter.yaml"
    path.write_text(COUNTER.format(value))
    with pytest.raises(ConfigError, match=r"counter\.resources_servers\.example_session_state_mgmt\.replicas"):
        discovery.load([path], check_ports=False)


def test_a_listed_replica_at_the_instances_own_address_is_the_instance_itself():
    settings = {"host": "0.0.0.0", "advertise_host": "10.0.0.1", "port": 18080, "replicas": ["http://10.0.0.1:18080", "http://10.0.0.2:18080"]}
    assert other_replica_urls(settings) == ["http://10.0.0.2:18080"]
    assert other_replica_urls({"host": "10.0.0.2", "port": 18080, "replicas": ["http://10.0.0.2:18080/"]}) == []
    assert other_replica_urls({"host": "127.0.0.1", "port": 1}) == []
