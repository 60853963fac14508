"""Small upstream names that upstream's servers import from existing modules: server_utils'
get_global_aiohttp_client / is_global_aiohttp_client_request_debug_enabled (remote_agent),
ServerClient.poll_for_status (local_vllm_model_proxy),
global_config.find_open_port (local_vllm_model), config_types.OmegaConf (swe_agents)."""

from __future__ import annotations

import asyncio
import http.server
import json
import socket
import threading

import aiohttp
import pytest
from omegaconf import OmegaConf

from nemo_gym import global_config, server_utils


@pytest.mark.anyio
async def test_get_global_aiohttp_client_is_the_one_pooled_session_request_uses():
    client = server_utils.get_global_aiohttp_client()
    assert isinstance(client, aiohttp.ClientSession) and not client.closed
    assert server_utils.get_global_aiohttp_client() is client
    await client.close()


def test_the_shared_session_of_an_event_loop_is_closed_when_asyncio_run_ends_the_loop():
    async def used_and_left_open() -> aiohttp.ClientSession:
        return server_utils.get_global_aiohttp_client()

    sessions = [asyncio.run(used_and_left_open()) for _ in range(2)]
    assert sessions[0] is not sessions[1] and all(session.closed for session in sessions)


def test_request_debug_is_off_unless_the_config_turns_it_on(tmp_path, monkeypatch):
    global_config.get_global_config_dict.cache_clear()
    monkeypatch.delenv(global_config.CONFIG_PATH_ENV, raising=False)
    assert server_utils.is_global_aiohttp_client_request_debug_enabled() is False
    (tmp_path / "config.json").write_text(json.dumps({"global_aiohttp_client_request_debug": True}))
    monkeypatch.setenv(global_config.CONFIG_PATH_ENV, str(tmp_path / "config.json"))
    global_config.get_global_config_dict.cache_clear()
    assert server_utils.is_global_aiohttp_client_request_debug_enabled() is True
    global_config.get_global_config_dict.cache_clear()


def test_find_open_port_gives_a_port_that_can_be_bound_and_is_not_disallowed(monkeypatch):
    monkeypatch.delenv(global_config.CONFIG_PATH_ENV, raising=False)
    taken = global_config.find_open_port()
    port = global_config.find_open_port(disallowed_ports=[taken])
    assert port != taken
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_find_open_port_keeps_to_the_configs_port_range(tmp_path, monkeypatch):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        low = sock.getsockname()[1]
    (tmp_path / "config.json").write_text(json.dumps({"port_range_low": low, "port_range_high": low}))
    monkeypatch.setenv(global_config.CONFIG_PATH_ENV, str(tmp_path / "config.json"))
    global_config.get_global_config_dict.cache_clear()
    try:
        assert global_config.find_open_port() == low
        with pytest.raises(RuntimeError, match="disallowed"):
            global_config.find_open_port(disallowed_ports=[low], max_retries=3)
    finally:
        global_config.get_global_config_dict.cache_clear()


def test_config_types_has_omegaconf_as_upstreams_does():
    from omegaconf import OmegaConf

    from nemo_gym.config_types import OmegaConf as exported

    assert exported is OmegaConf


class NotFoundHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_error(404)

    def log_message(self, *args):
        pass


def test_poll_for_status_is_success_for_any_reply_and_connection_error_where_nothing_listens():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFoundHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    settings = {"host": "127.0.0.1", "entrypoint": "app.py"}
    config = OmegaConf.create({
        "up": {"responses_api_models": {"m": {**settings, "port": server.server_address[1]}}},
        "down": {"responses_api_models": {"m": {**settings, "port": closed_port}}},
        "head_server": {**settings, "port": server.server_address[1]},
    })
    client = server_utils.ServerClient(global_config_dict=config)
    try:
        assert [client.poll_for_status(name) for name in ("up", "down", "head_server")] == ["success", "connection_error", "success"]
    finally:
        server.shutdown()
        thread.join(timeout=10)
