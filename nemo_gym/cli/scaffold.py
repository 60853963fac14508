"""``gym env init NAME``: a new resources server that starts, passes its own tests and plays with the scripted backend.

The scaffold keeps a count per session, with the counter's tool names, so the embedded scripted
backend plays its example tasks as it plays the counter's; replace the tools and tasks with your own.
"""

from __future__ import annotations

import json
import keyword
import re
from pathlib import Path

SERVER_NAME = re.compile(r"^[a-z][a-z0-9_]*$")

APP = '''"""{name}: a resources server made by `gym env init`. Each session keeps its own count."""

from __future__ import annotations

from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel, Field

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseSeedSessionRequest,
    BaseSeedSessionResponse,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym.server_utils import SESSION_ID_KEY


class SeedSessionRequest(BaseSeedSessionRequest):
    initial_count: int = 0


class IncrementCounterRequest(BaseModel):
    count: int


class GetCounterValueRequest(BaseModel):
    pass


class CounterValue(BaseModel):
    count: int


class VerifyRequest(BaseVerifyRequest):
    expected_count: int


class VerifyResponse(BaseVerifyResponse):
    expected_count: int
    count: int | None


class {class_name}(SimpleResourcesServer):
    config: BaseResourcesServerConfig
    # Per-session state: a dict keyed by the session id, whatever the number of workers.
    counts: dict[str, int] = Field(default_factory=dict)

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/increment_counter")(self.increment_counter)
        app.post("/get_counter_value")(self.get_counter_value)
        return app

    async def seed_session(self, request: Request, body: SeedSessionRequest) -> BaseSeedSessionResponse:
        self.counts[request.session[SESSION_ID_KEY]] = body.initial_count
        return BaseSeedSessionResponse()

    async def increment_counter(self, request: Request, body: IncrementCounterRequest) -> CounterValue:
        """Add `count` to this session's counter."""
        session_id = self.seeded_session(request)
        self.counts[session_id] += body.count
        return CounterValue(count=self.counts[session_id])

    async def get_counter_value(self, request: Request, body: GetCounterValueRequest) -> CounterValue:
        """Read this session's counter."""
        return CounterValue(count=self.counts[self.seeded_session(request)])

    def seeded_session(self, request: Request) -> str:
        session_id = request.session[SESSION_ID_KEY]
        if session_id not in self.counts:
            raise HTTPException(404, "This session has no counter: call /seed_session first.")
        return session_id

    async def verify(self, request: Request, body: VerifyRequest) -> VerifyResponse:
        count = self.counts.pop(request.session[SESSION_ID_KEY], None)
        reward = 1.0 if count == body.expected_count else 0.0
        return VerifyResponse(**{{**body.model_dump(), "reward": reward, "count": count}})


if __name__ == "__main__":
    {class_name}.run_webserver()
'''

CONFIG = """# {name} with a simple_agent, played by the embedded scripted backend.
# For a real model, give policy_model `base_url: ${{policy_base_url}}` and `model: ${{policy_model_name}}`
# (set in env.yaml or with ++policy_base_url=...) instead of backend_server.
{name}:
  resources_servers:
    {name}:
      entrypoint: app.py
      num_workers: 4
      domain: other
      verified: false
      description: A count kept per session (made by gym env init)
      datasets:
        - name: example
          type: example
          jsonl_fpath: resources_servers/{name}/data/example.jsonl
{name}_simple_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      resources_server: {{type: resources_servers, name: {name}}}
      model_server: {{type: responses_api_models, name: policy_model}}
policy_model:
  responses_api_models:
    vllm_model:
      entrypoint: app.py
      backend_server: {{type: responses_api_models, name: scripted_backend}}
      model: scripted
scripted_backend:
  responses_api_models:
    scripted_backend:
      entrypoint: app.py
"""

TEST = '''"""{name}, served as its own process and driven over HTTP with session cookies."""

from __future__ import annotations

import pytest

from nemo_gym import config as gym_config
from nemo_gym.client.reading import ReadingClient
from nemo_gym.openai_utils import new_response
from nemo_gym.process import discovery
from nemo_gym.process.launcher import Launcher

NAME = "{name}"
TASK = {{"responses_create_params": {{"input": "The counter starts at 2. Add 3, then get the count and tell me."}}}}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def launcher():
    instances = gym_config.parse({{NAME: {{"resources_servers": {{NAME: {{}}}}}}}})
    discovery.check_settings(instances)
    launcher = Launcher(instances, gym_config.free_port()).start(timeout=60)
    try:
        yield launcher
    finally:
        launcher.stop()


async def call(client: ReadingClient, path: str, cookies: dict[str, str], body: dict) -> dict:
    reply = await client.post(NAME, path, json=body, cookies=cookies)
    assert reply.status == 200, reply.text
    cookies.update(reply.cookies)
    return reply.body


@pytest.mark.anyio
async def test_a_seeded_session_keeps_its_count_and_verifies(launcher):
    client = ReadingClient(launcher.instances)
    try:
        cookies: dict[str, str] = {{}}
        await call(client, "/seed_session", cookies, {{**TASK, "initial_count": 2}})
        assert await call(client, "/increment_counter", cookies, {{"count": 3}}) == {{"count": 5}}
        assert await call(client, "/get_counter_value", cookies, {{}}) == {{"count": 5}}
        verdict = await call(client, "/verify", cookies, {{**TASK, "response": new_response().model_dump(mode="json"), "expected_count": 5}})
        assert verdict["reward"] == 1.0
    finally:
        await client.close()
'''

README = """# {name}

Made by `gym env init {name}`: a count kept per session. Replace the tools, tasks and reward with your own.

| endpoint | body | does |
| --- | --- | --- |
| `POST /seed_session` | `{{"initial_count": n}}` | starts this session's count at `n` |
| `POST /increment_counter` (tool) | `{{"count": k}}` | adds `k` |
| `POST /get_counter_value` (tool) | `{{}}` | reads it |
| `POST /verify` | task row + `response` + `expected_count` | reward 1.0 when the count equals `expected_count` |

```bash
gym env test --resources-server {name}
gym eval run --config resources_servers/{name}/configs/{name}.yaml \\
    --input resources_servers/{name}/data/example.jsonl --num-repeats 40 --output results/{name}.jsonl
```

Run these from the directory that holds `resources_servers/`, or add `--search-dir DIR` for it.
"""

TOOLS = [
    {
        "type": "function",
        "name": "increment_counter",
        "description": "Add `count` to this session's counter.",
        "parameters": {"type": "object", "properties": {"count": {"type": "integer"}}, "required": ["count"], "additionalProperties": False},
        "strict": True,
    },
    {
        "type": "function",
        "name": "get_counter_value",
        "description": "Read this session's counter.",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
        "strict": True,
    },
]
TASKS = [(0, [1, 2]), (0, [5]), (10, [3, 4]), (7, [-2]), (1, [1, 1, 1])]


def example_rows() -> list[dict]:
    rows = []
    for start, amounts in TASKS:
        steps = ", then ".join(f"add {amount}" for amount in amounts)
        text = f"The counter starts at {start}. {steps[0].upper()}{steps[1:]}, then get the count and tell me."
        params = {"input": [{"role": "user", "content": text}], "tools": TOOLS}
        rows.append({"responses_create_params": params, "initial_count": start, "expected_count": start + sum(amounts)})
    return rows


def scaffold(name: str, root: Path) -> Path:
    """Write ``<root>/resources_servers/<name>/`` and return it; an existing directory is left alone."""
    if not SERVER_NAME.match(name) or keyword.iskeyword(name):
        raise ValueError(f"env init: {name!r} is not a server name: use lower-case letters, digits and '_', starting with a letter")
    directory = root / "resources_servers" / name
    if directory.exists():
        raise ValueError(f"env init: {directory} already exists; pick another name or remove it")
    class_name = "".join(part.capitalize() for part in name.split("_")) + "Server"
    files = {
        "__init__.py": "",
        "app.py": APP.format(name=name, class_name=class_name),
        f"configs/{name}.yaml": CONFIG.format(name=name),
        "data/example.jsonl": "".join(json.dumps(row) + "\n" for row in example_rows()),
        "tests/__init__.py": "",
        "tests/test_app.py": TEST.format(name=name),
        "README.md": README.format(name=name),
    }
    for relative, text in files.items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return directory
