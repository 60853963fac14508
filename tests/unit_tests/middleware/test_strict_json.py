"""Strict JSON bodies: NaN and Infinity are a 422 that says so, served by a real uvicorn."""

from __future__ import annotations

import aiohttp
import pytest
from fastapi import FastAPI, Request
from pydantic import BaseModel

from nemo_gym.middleware.strict_json import StrictJSONRoute
from tests.unit_tests.in_process_server import serving

pytestmark = pytest.mark.anyio


class Reading(BaseModel):
    value: float
    label: str = ""


async def take_reading(body: Reading) -> dict:
    return body.model_dump()


async def take_raw(request: Request) -> dict:
    return {"got": await request.json()}


@pytest.fixture
async def url():
    app = FastAPI()
    app.router.route_class = StrictJSONRoute
    app.post("/reading")(take_reading)
    app.post("/raw")(take_raw)
    async with serving(app) as base:
        yield base


async def post(url: str, body: bytes) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as session:
        async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as reply:
            return reply.status, await reply.json()


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
async def test_a_body_holding_nan_or_infinity_gets_422_naming_the_constant_and_where_it_is(url, constant):
    body = f'{{"label": "NaN here is text", "value": {constant}}}'
    status, reply = await post(f"{url}/reading", body.encode())
    assert status == 422
    [problem] = reply["detail"]
    assert problem["type"] == "json_invalid"
    assert problem["loc"] == ["body", body.index(constant, body.index("value"))]
    assert problem["ctx"]["error"] == f"{constant} is not valid JSON"


@pytest.mark.parametrize(("body", "error"), [(b"[1, NaN]", "NaN is not valid JSON"), (b"{not json", "Expecting property name enclosed in double quotes")])
async def test_a_handler_reading_the_json_itself_gets_the_same_422(url, body, error):
    status, reply = await post(f"{url}/raw", body)
    assert status == 422
    [problem] = reply["detail"]
    assert (problem["type"], problem["ctx"]["error"]) == ("json_invalid", error)


async def test_nan_and_infinity_as_strings_and_ordinary_numbers_are_accepted(url):
    assert await post(f"{url}/reading", b'{"value": 1e308, "label": "Infinity"}') == (200, {"value": 1e308, "label": "Infinity"})
    assert await post(f"{url}/raw", b'{"NaN": "-Infinity"}') == (200, {"got": {"NaN": "-Infinity"}})
