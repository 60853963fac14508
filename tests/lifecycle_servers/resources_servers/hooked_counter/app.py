"""The counter, with an ``on_session_end`` that appends "<session id> <reason>" to the file ``hook_log`` names
(one short ``O_APPEND`` write per call, so the lines of all the workers interleave whole): the test counts the calls."""

from __future__ import annotations

import os

from nemo_gym.base_resources_server import BaseResourcesServerConfig
from nemo_gym.lifecycle.registry import EndReason
from resources_servers.example_session_state_mgmt.app import CounterServer


class HookedCounterConfig(BaseResourcesServerConfig):
    hook_log: str


class HookedCounterServer(CounterServer):
    config: HookedCounterConfig

    async def on_session_end(self, session_id: str, reason: EndReason) -> None:
        fd = os.open(self.config.hook_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{session_id} {reason}\n".encode())
        finally:
            os.close(fd)


if __name__ == "__main__":
    HookedCounterServer.run_webserver()
