"""The producer's hand-built task messages have the shape Celery itself would send."""

from __future__ import annotations

import base64

import orjson
import redis

from fleetgen.queue.celeryconf import make_app
from fleetgen.queue.contract import QUEUE, TASK_NAME, TaskPayload
from fleetgen.runstate.keys import RunKeys
from producer.enqueue import Enqueuer, task_message

PAYLOAD = TaskPayload(run="r", line=3, id="x", input_ids=[1, 2, 3], max_tokens=5, sampling={},
                      row={"a": 1})


def test_headers_and_body_match_celery_protocol_2(redis_url: str) -> None:
    ours = orjson.loads(task_message(PAYLOAD))
    app = make_app(redis_url, visibility_timeout_s=10)
    celery = app.amqp.as_task_v2("some-id", TASK_NAME, args=[PAYLOAD])
    assert set(ours["headers"]) == set(celery.headers)
    assert ours["headers"]["task"] == TASK_NAME
    assert ours["headers"]["id"] == ours["headers"]["root_id"]
    args, kwargs, embed = orjson.loads(base64.b64decode(ours["body"]))
    assert [args, kwargs, embed] == [list(x) if isinstance(x, tuple) else x
                                     for x in orjson.loads(orjson.dumps(celery.body))]
    assert ours["properties"]["delivery_info"]["routing_key"] == QUEUE
    assert "input_ids" not in ours["headers"]["argsrepr"]  # no 300 token ids in logs


def test_send_is_fifo_and_marks_lines_sent(rclient: redis.Redis, redis_url: str) -> None:
    enqueuer = Enqueuer(rclient, "r")
    enqueuer.send([{**PAYLOAD, "line": n} for n in (1, 2, 9)])  # type: ignore[typeddict-item]
    order = [orjson.loads(base64.b64decode(orjson.loads(raw)["body"]))[0][0]["line"]
             for raw in rclient.lrange(QUEUE, 0, -1)[::-1]]  # BRPOP takes from the right
    assert order == [1, 2, 9]
    sent = RunKeys("r").sent
    assert [rclient.getbit(sent, n) for n in range(11)] == [0, 1, 1, 0, 0, 0, 0, 0, 0, 1, 0]
