"""Which servers need Ray (their code imports it), what happens without the extra, and when the launcher
connects to a cluster (docs/ray.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from nemo_gym import config as gym_config
from nemo_gym.config import ConfigError
from nemo_gym.config.paths import search_roots
from nemo_gym.env import CONFIG_PATH_ENV
from nemo_gym.process import discovery
from nemo_gym.process.launcher import Launcher, LaunchError
from nemo_gym.ray_cluster.need import RAY_EXTRA, RayMissing

APP = '''
{imports}
from nemo_gym.base_resources_server import BaseResourcesServerConfig, BaseVerifyRequest, BaseVerifyResponse, SimpleResourcesServer


class {name}Config(BaseResourcesServerConfig):
    pass


class {name}Server(SimpleResourcesServer):
    config: {name}Config

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        return BaseVerifyResponse(**body.model_dump(), reward=0.0)
'''


def make_server(root: Path, name: str, imports: str, helper: str | None = None) -> None:
    directory = root / "resources_servers" / name
    directory.mkdir(parents=True)
    (directory / "app.py").write_text(APP.format(name=name.title().replace("_", ""), imports=imports))
    if helper is not None:
        (directory / f"{name}_helper.py").write_text(helper)


def checked(root: Path, names: list[str]) -> dict[str, gym_config.Instance]:
    instances = gym_config.parse({name: {"resources_servers": {name: {}}} for name in names}, check_ports=False)
    discovery.check_settings(instances, search_roots([root]))
    return instances


@pytest.fixture
def no_ray(monkeypatch):
    """As if ray were not installed: ``import ray`` raises ModuleNotFoundError."""
    monkeypatch.setitem(sys.modules, "ray", None)


def test_a_server_needs_ray_when_a_module_of_its_own_imports_ray_even_inside_a_function(tmp_path, no_ray):
    make_server(tmp_path, "ray_lazy_user", "from ray_lazy_user_helper import check", "def check():\n    import ray\n    return ray\n")
    make_server(tmp_path, "ray_free", "import json")
    instances = checked(tmp_path, ["ray_lazy_user", "ray_free"])
    assert (instances["ray_lazy_user"].needs_ray, instances["ray_free"].needs_ray) == (True, False)


def test_a_server_that_imports_ray_where_it_is_not_installed_fails_at_load_naming_the_extra(tmp_path, no_ray):
    make_server(tmp_path, "ray_eager_user", "import ray")
    with pytest.raises(ConfigError) as error:
        checked(tmp_path, ["ray_eager_user"])
    assert "ray_eager_user" in str(error.value) and RAY_EXTRA in str(error.value)


def test_initialize_ray_without_ray_installed_names_the_extra(tmp_path, monkeypatch, no_ray):
    from nemo_gym.server_utils import initialize_ray

    (tmp_path / "config.json").write_text(json.dumps({}))
    monkeypatch.setenv(CONFIG_PATH_ENV, str(tmp_path / "config.json"))
    with pytest.raises(RayMissing) as error:
        initialize_ray()
    assert RAY_EXTRA in str(error.value)


@pytest.mark.parametrize("needs_ray", [False, True])
def test_the_launcher_connects_to_no_cluster_when_the_servers_join_the_named_one_or_none_needs_ray(needs_ray, no_ray):
    instances = gym_config.parse({"counter": {"resources_servers": {"example_session_state_mgmt": {}}}}, check_ports=False)
    instances["counter"].needs_ray = needs_ray
    settings = {"ray_head_node_address": "10.0.0.1:6379"} if needs_ray else {}
    launcher = Launcher(instances, None, settings=settings)
    launcher._connect_ray()
    assert launcher.ray_connected is False


def test_num_replicas_above_one_without_a_ray_cluster_is_refused_naming_the_key():
    data = {"counter": {"resources_servers": {"example_session_state_mgmt": {"num_replicas": 3, "num_workers": 2}}}}
    launcher = Launcher(gym_config.parse(data, check_ports=False), gym_config.free_port())
    with pytest.raises(LaunchError, match="ray_head_node_address"):
        launcher.start()
