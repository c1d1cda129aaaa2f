"""Prefix affinity's own queues under a fault, at the defaults a user gets: a worker SIGKILLed
while its own queue holds first turns routed to it (the samples of long prompts) leaves
nothing stranded. The waiting producer moves that queue to the shared one once the worker's
heartbeat lapses (producer/affinity.py `sweep`), the prompts it held come back with their
lease, and every request is written once with the simulator's answer."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import redis

from fleetgen.queue.contract import worker_queue
from tests.support.content import assert_fleet_content
from tests.support.fleet import FleetFactory, sim_stats
from tests.support.held import worker_name
from tests.support.pipeline import assert_exactly_once, drain, produce, write_jsonl
from tests.support.waiting import wait_until

FILLER = " ".join(f"word{k}" for k in range(200))  # ~400 tokens: routed by its prefix


def test_a_killed_workers_queue_of_first_turns_goes_to_the_others(make_fleet: FleetFactory,
                                                                  tmp_path: Path) -> None:
    # gpu1's first tokens take 2 s, so its own queue still holds routed samples when it dies.
    fleet = make_fleet(gpus=2, gpu_sim_args={1: ["--ttft-ms", "2000"]})
    rows = 30
    prompts = write_jsonl(tmp_path / "p.jsonl", [
        {"id": f"s{i}", "messages": [{"role": "user", "content": f"Prompt {i}: {FILLER}"}]}
        for i in range(rows)])
    out = tmp_path / "out"
    client = redis.Redis.from_url(fleet.redis_url)
    own = worker_queue(worker_name(1))
    # `fleetgen produce` as users run it: it stays until every row has an outcome (and sweeps).
    threading.Thread(target=lambda: produce(fleet, prompts, "kill", wait=True, n=4,
                                            sampling={"temperature": 0.8},
                                            max_output_tokens=60), daemon=True).start()
    wait_until(lambda: client.llen(own) > 0 and sim_stats(fleet)[1]["num_running_reqs"] > 0,
               60, "gpu1 to hold requests with routed samples waiting in its own queue")
    fleet.workers[1].signal(signal.SIGKILL)
    stranded = int(client.llen(own))
    assert fleet.workers[1].proc.wait(timeout=10) == -signal.SIGKILL
    assert stranded > 0, "gpu1's own queue was empty when it died: the test proves nothing"
    killed_at = time.monotonic()
    drain(fleet, "kill", out, timeout_s=180)
    data = assert_exactly_once(out, {f"s{i}#{k}" for i in range(rows) for k in range(4)})
    assert len(data["results"]) == 4 * rows and not data["failures"]
    assert_fleet_content(fleet, prompts, data, sampling={"temperature": 0.8})
    # The recovery path ran: gpu1's queue is gone, its prompts answered by gpu0.
    assert not client.exists(own)
    after = [r for r in data["results"] if r["worker"] == worker_name(0)]
    assert len(after) >= stranded
    print(f"\nSIGKILL with {stranded} routed first turns in gpu1's own queue: the run was "
          f"complete {time.monotonic() - killed_at:.0f} s later, every request once")
