"""How the simulator's handlers read request bodies and write their JSON answers."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from fleetgen.simulator.request import bad_request


async def read_json(request: web.Request) -> Any:
    raw = await request.read()
    if not raw:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        raise bad_request(f"The request body is not valid JSON: {error}.") from None


async def read_control_body(request: web.Request) -> dict[str, Any]:
    body = await read_json(request)
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    return body


def json_response(payload: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(payload), status=status, content_type="application/json")
