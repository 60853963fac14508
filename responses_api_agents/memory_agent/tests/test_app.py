"""memory_agent: a second /v1/responses call of a session continues the conversation of the first."""

from starlette.testclient import TestClient

from nemo_gym import config as gym_config
from nemo_gym.client import ServerReply
from nemo_gym.openai_utils import (
    NeMoGymResponseCreateParamsNonStreaming,
    NeMoGymResponseOutputMessage,
    NeMoGymResponseOutputText,
    new_response,
)
from responses_api_agents.memory_agent.app import MemoryAgent


class Model:
    """Stands in for the model server: answers 'reply N' and records the input of every call."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.inputs: list[list[dict]] = []

    async def post(self, server_name, path, json=None, cookies=None, timeout=None) -> ServerReply:
        assert (server_name, path) == ("policy_model", "/v1/responses")
        self.inputs.append(json["input"])
        message = NeMoGymResponseOutputMessage(content=[NeMoGymResponseOutputText(text=f"reply {len(self.inputs)}")])
        response = new_response(NeMoGymResponseCreateParamsNonStreaming.model_validate(json), output=[message])
        body = response.model_dump(mode="json") if self.status == 200 else {"detail": "backend down"}
        return ServerReply(self.status, body, {}, str(body))

    async def close(self) -> None:
        pass


def make_agent(model: Model, **settings) -> MemoryAgent:
    data = {
        "memory_agent": {"responses_api_agents": {"memory_agent": {"model_server": {"type": "responses_api_models", "name": "policy_model"}, **settings}}},
        "policy_model": {"responses_api_models": {"scripted_backend": {}}},
    }
    agent = MemoryAgent("memory_agent", gym_config.parse(data))
    agent.server_client = model
    return agent


def texts(items: list[dict]) -> list[str]:
    return [item["content"] if isinstance(item["content"], str) else item["content"][0]["text"] for item in items]


def test_the_second_turn_continues_the_first():
    model = Model()
    client = TestClient(make_agent(model).build_app())
    first = client.post("/v1/responses", json={"input": "My name is Ada."})
    assert first.status_code == 200 and first.json()["output"][0]["content"][0]["text"] == "reply 1"
    client.post("/v1/responses", json={"input": [{"role": "user", "content": "What is my name?"}]})
    assert texts(model.inputs[0]) == ["My name is Ada."]
    assert texts(model.inputs[1]) == ["My name is Ada.", "reply 1", "What is my name?"]


def test_sessions_do_not_share_memory():
    model = Model()
    app = make_agent(model).build_app()
    ada, bob = TestClient(app), TestClient(app)
    ada.post("/v1/responses", json={"input": "I am Ada."})
    bob.post("/v1/responses", json={"input": "I am Bob."})
    bob.post("/v1/responses", json={"input": "Who am I?"})
    assert texts(model.inputs[2]) == ["I am Bob.", "reply 2", "Who am I?"]


def test_a_failed_turn_is_not_remembered():
    model = Model()
    agent = make_agent(model)
    client = TestClient(agent.build_app())
    client.post("/v1/responses", json={"input": "one"})
    model.status = 502
    assert client.post("/v1/responses", json={"input": "lost"}).status_code == 502
    model.status = 200
    client.post("/v1/responses", json={"input": "two"})
    assert texts(model.inputs[-1]) == ["one", "reply 1", "two"]


def test_past_max_sessions_the_least_recently_used_conversation_is_forgotten():
    model = Model()
    app = make_agent(model, max_sessions=2).build_app()
    first, second, third = TestClient(app), TestClient(app), TestClient(app)
    first.post("/v1/responses", json={"input": "first"})
    second.post("/v1/responses", json={"input": "second"})
    first.post("/v1/responses", json={"input": "first again"})
    third.post("/v1/responses", json={"input": "third"})
    first.post("/v1/responses", json={"input": "first once more"})
    second.post("/v1/responses", json={"input": "second again"})
    assert texts(model.inputs[4]) == ["first", "reply 1", "first again", "reply 3", "first once more"]
    assert texts(model.inputs[5]) == ["second again"]


def test_run_says_there_is_no_environment():
    reply = TestClient(make_agent(Model()).build_app()).post("/run", json={"responses_create_params": {"input": "x"}})
    assert reply.status_code == 501 and "/v1/responses" in reply.json()["detail"]
