"""A root holding one stateless resources server (``answer_match``: reward 1.0 when the response's text is the
row's ``expected_answer``), and a config that runs it with a simple_agent and the scripted model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from nemo_gym.openai_utils import new_response

APP = '''
from typing import ClassVar

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig, BaseVerifyRequest, BaseVerifyResponse, ReverifyMode, SimpleResourcesServer,
)


class AnswerConfig(BaseResourcesServerConfig):
    REVERIFY_MODE: ClassVar[ReverifyMode] = ReverifyMode.{mode}


class AnswerVerifyRequest(BaseVerifyRequest):
    expected_answer: str


class AnswerVerifyResponse(AnswerVerifyRequest):
    reward: float


class AnswerMatch(SimpleResourcesServer):
    config: AnswerConfig

    async def verify(self, body: AnswerVerifyRequest) -> AnswerVerifyResponse:
        said = body.response.output_text.strip()
        return AnswerVerifyResponse(**body.model_dump(), reward=float(said == body.expected_answer))


if __name__ == "__main__":
    AnswerMatch.run_webserver()
'''

AGENT = "answer_agent"
SERVER = "answer_match"


def write_root(root: Path, mode: str = "STATELESS") -> Path:
    """``root/resources_servers/answer_match`` with the given reverify mode, and ``root/answer.yaml`` (returned)."""
    directory = root / "resources_servers" / SERVER
    directory.mkdir(parents=True)
    (directory / "app.py").write_text(APP.replace("{mode}", mode))
    config = {
        SERVER: {"resources_servers": {SERVER: {"entrypoint": "app.py", "domain": "other", "description": "answers compared"}}},
        AGENT: {
            "responses_api_agents": {
                "simple_agent": {
                    "entrypoint": "app.py",
                    "resources_server": {"type": "resources_servers", "name": SERVER},
                    "model_server": {"type": "responses_api_models", "name": "policy_model"},
                }
            }
        },
        "policy_model": {
            "responses_api_models": {
                "vllm_model": {"entrypoint": "app.py", "model": "scripted", "backend_server": {"type": "responses_api_models", "name": "scripted_backend"}}
            }
        },
        "scripted_backend": {"responses_api_models": {"scripted_backend": {"entrypoint": "app.py"}}},
    }
    path = root / "answer.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def task_row(task: int, rollout: int, expected: str) -> dict[str, Any]:
    """A materialized input row, as rollout collection stamps it."""
    return {
        "_ng_task_index": task,
        "_ng_rollout_index": rollout,
        "agent_ref": {"type": "responses_api_agents", "name": AGENT},
        "responses_create_params": {"input": f"task {task}"},
        "expected_answer": expected,
    }


def rollout_row(task: int, rollout: int, expected: str, said: str, reward: float) -> dict[str, Any]:
    """A rollout as ``/run`` returns it: the row, the agent's response saying ``said``, and its reward."""
    message = {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed", "content": [{"type": "output_text", "text": said, "annotations": []}]}
    response = new_response(output=[message], usage={"input_tokens": 3, "output_tokens": 1, "total_tokens": 4,
                                                      "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}})
    return {**task_row(task, rollout, expected), "response": response.model_dump(mode="json"), "reward": reward}
