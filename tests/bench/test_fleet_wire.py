"""The fleet_scale bench's wire workers send Valkey what the real code sends on each path (take,
row, beat, sweep), counted by Valkey's own commandstats, so its figures are a real worker's."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import redis

from bench import fleet_scale
from bench.central import InstantEngine
from bench.fleet_wire import Wire, WireWorker, load_scripts
from fleetgen.queue.acks import ACKS
from fleetgen.queue.contract import QUEUE
from fleetgen.queue.wire import SWEEP_DUE, task_message
from fleetgen.runstate.keys import RunKeys
from fleetgen.runstate.manifest import STATE_PRODUCED

# Connection set-up (redis-py's HELLO 3 and CLIENT SETINFO) and the test's own reads.
NOT_A_PATH = {"hello", "client|setinfo", "info", "config|resetstat"}


def _counted(client: redis.Redis, path: Callable[[], Any]) -> dict[str, int]:
    client.config_resetstat()
    path()
    return {k.removeprefix("cmdstat_"): int(v["calls"])
            for k, v in client.info("commandstats").items()
            if k.removeprefix("cmdstat_") not in NOT_A_PATH}


def test_each_wire_path_sends_the_real_codes_commands(redis_url: str,
                                                      rclient: redis.Redis) -> None:
    rclient.hset(RunKeys(fleet_scale.RUN).manifest, mapping={"state": STATE_PRODUCED})
    rclient.lpush(QUEUE, *[task_message(fleet_scale.payload(line)) for line in range(1, 9)])
    real = fleet_scale.Worker(redis_url, "real@test")
    engine = InstantEngine(20)
    loop = asyncio.new_event_loop()
    host, port = redis_url.removeprefix("redis://").split("/")[0].split(":")
    wire = loop.run_until_complete(Wire.open(host, int(port)))
    loop.run_until_complete(load_scripts(wire))
    emulated = WireWorker("wire@test", wire)
    run = loop.run_until_complete

    async def no_restore(holders: list[bytes], cutoff: float) -> None:
        raise AssertionError("no lease lapsed")

    real.beat()  # its connections made before anything is counted
    held: list[Any] = []
    tags: list[bytes] = []
    paths: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
        "take": (lambda: held.append(real.fetch()), lambda: tags.append(run(emulated.take()))),
        # The real ack lands from the acks thread (fleetgen/queue/acks.py): counted once it has.
        "row": (lambda: (real.finish(held.pop(), engine), ACKS.settle(5)),
                lambda: run(emulated.answer(tags[-1], fleet_scale.payload(
                    emulated.held[tags[-1]]), engine))),  # type: ignore[arg-type]
        "beat": (real.beat, lambda: run(emulated.beat({}, 2.0, 60.0, 6.0))),
        "sweep": (real.sweep, lambda: run(emulated.sweep(60.0, no_restore))),
    }
    for name, (real_path, wire_path) in paths.items():
        rclient.delete(SWEEP_DUE)  # each sweep the fleet's of its period, not skipped
        sent = _counted(rclient, real_path)
        assert sent, name
        rclient.delete(SWEEP_DUE)
        assert _counted(rclient, wire_path) == sent, name
    # Within the period another worker's sweep is one round trip, the due script's, and
    # nothing else: the fleet sweeps once a period, not once a period a worker.
    skipped = {"evalsha": 1, "set": 1}  # the script's own SET NX that found the key
    assert _counted(rclient, real.sweep) == skipped
    assert _counted(rclient, lambda: run(emulated.sweep(60.0, no_restore))) == skipped
    assert rclient.hlen("unacked") == 0 and rclient.xlen(RunKeys(fleet_scale.RUN).stream) == 2
    wire.close()
    loop.close()
