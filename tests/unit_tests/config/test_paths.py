"""Checking a config imports each server with its own directory first on sys.path, as upstream starts one,
and leaves no bare module of one server for the next to find."""

from __future__ import annotations

import sys
from pathlib import Path

from nemo_gym import config as gym_config
from nemo_gym.config.paths import search_roots
from nemo_gym.process import discovery

APP = '''
from util import KIND

from nemo_gym.base_resources_server import BaseResourcesServerConfig, BaseVerifyRequest, BaseVerifyResponse, SimpleResourcesServer


class {name}Config(BaseResourcesServerConfig):
    kind: str = KIND


class {name}Server(SimpleResourcesServer):
    config: {name}Config

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        return BaseVerifyResponse(**body.model_dump(), reward=0.0)
'''


def make_server(root: Path, name: str, util: str) -> Path:
    directory = root / "resources_servers" / name
    directory.mkdir(parents=True)
    (directory / "app.py").write_text(APP.format(name=name.title().replace("_", "")))
    (directory / "util.py").write_text(util)
    return directory


def test_two_servers_with_a_sibling_module_of_the_same_name_each_load_their_own(tmp_path):
    make_server(tmp_path, "sibling_alpha", "KIND = 'alpha'\n")
    make_server(tmp_path, "sibling_beta", "from util_beta_only import KIND\n")
    (tmp_path / "resources_servers" / "sibling_beta" / "util_beta_only.py").write_text("KIND = 'beta'\n")
    data = {
        "alpha": {"resources_servers": {"sibling_alpha": {}}},
        "beta": {"resources_servers": {"sibling_beta": {}}},
    }
    path_before = list(sys.path)
    discovery.check_settings(gym_config.parse(data, check_ports=False), search_roots([tmp_path]))
    assert sys.modules["resources_servers.sibling_alpha.app"].KIND == "alpha"
    assert sys.modules["resources_servers.sibling_beta.app"].KIND == "beta"
    assert "util" not in sys.modules and sys.path == path_before
