"""nemo_gym.rollout_correlation: a rollout's id from its row or its path prefix, current for the whole request."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI, Request

from nemo_gym.base_resources_server import BaseRunRequest
from nemo_gym.rollout_correlation import RolloutContextMiddleware, current_rollout_id, maybe_rollout_id_from_run_body, rollout_context
from tests.unit_tests.in_process_server import serving


def test_a_rows_own_rollout_id_comes_first_and_a_redispatch_adds_its_attempt():
    assert maybe_rollout_id_from_run_body({"_ng_rollout_id": "run7.r-1", "_ng_task_index": 3, "_ng_rollout_index": 0}) == "run7.r-1"
    assert maybe_rollout_id_from_run_body({"_ng_rollout_id": "x", "_ng_attempt_index": 2}) == "x-a2"


def test_without_one_the_id_is_task_dash_rollout_from_a_dict_or_a_model():
    row = BaseRunRequest.model_validate({"responses_create_params": {"input": "hi"}, "_ng_task_index": 3, "_ng_rollout_index": 1, "_ng_attempt_index": 0})
    assert maybe_rollout_id_from_run_body(row) == "3-1"
    assert maybe_rollout_id_from_run_body({"_ng_task_index": 3, "_ng_rollout_index": 1, "_ng_attempt_index": 1}) == "3-1-a1"


def test_a_row_without_indices_or_no_row_has_no_rollout_id():
    assert maybe_rollout_id_from_run_body({"_ng_task_index": 3}) is None
    assert maybe_rollout_id_from_run_body(None) is None


@pytest.mark.parametrize("bad", ["a/b", ".hidden", "", 7])
def test_a_given_rollout_id_that_is_not_one_path_segment_is_refused_not_rewritten(bad):
    with pytest.raises(ValueError, match="_ng_rollout_id"):
        maybe_rollout_id_from_run_body({"_ng_rollout_id": bad})


def test_rollout_context_sets_the_current_id_for_its_block_only():
    with rollout_context("outer"):
        with rollout_context("inner"):
            assert current_rollout_id() == "inner"
        assert current_rollout_id() == "outer"
    assert current_rollout_id() is None


def seen_app() -> FastAPI:
    app = FastAPI()

    @app.post("/v1/responses")
    async def responses(request: Request) -> dict:
        return {"path": request.url.path, "rollout_id": current_rollout_id()}

    return app


@pytest.mark.anyio
async def test_the_middleware_strips_the_prefix_and_makes_its_id_current_for_the_request():
    async with serving(RolloutContextMiddleware(seen_app())) as url, httpx.AsyncClient(base_url=url) as client:
        prefixed = (await client.post("/ng-rollout/3-1-a2/v1/responses")).json()
        plain = (await client.post("/v1/responses")).json()
        not_an_id = await client.post("/ng-rollout/.x/v1/responses")
    assert prefixed == {"path": "/v1/responses", "rollout_id": "3-1-a2"}
    assert plain == {"path": "/v1/responses", "rollout_id": None}
    assert not_an_id.status_code == 404
