"""Prefix affinity's routing (producer/affinity.py) on a real Valkey, with heartbeats written as
workers write them: first turns that share a prefix go to one worker, within half a pool; a
message waiting in a worker's queue is stolen only while the shared queue is empty; a lost
worker's queue goes back to the shared one. The whole path with workers and servers:
tests/e2e/test_turns.py and bench/affinity.py."""

from __future__ import annotations

import time
from typing import Any

import redis

from fleetgen.queue.contract import QUEUE, TaskPayload, worker_key, worker_queue
from producer.affinity import PREFIX_BLOCK, Affinity, prefix_key, rendezvous_order


def _routing(client: redis.Redis) -> Affinity:
    affinity = Affinity(client)
    affinity.route_first = True  # a producer that waits for the run, as `fleetgen produce`
    return affinity


def _beat(client: redis.Redis, worker: str, concurrency: int = 8, consuming: bool = True,
          age_s: float = 0.0) -> None:
    client.hset(worker_key(worker), mapping={
        "at": time.time() - age_s, "interval_s": 2.0, "lease_s": 60, "sweep_s": 6,
        "held": 0, "consuming": "1" if consuming else "0", "concurrency": concurrency})


def _payload(line: int, ids: list[int], sample: int | None = None) -> TaskPayload:
    payload: dict[str, Any] = {"run": "r", "line": line, "id": str(line), "input_ids": ids,
                               "max_tokens": 8, "sampling": {}, "row": {}}
    if sample is not None:
        payload["sample"] = sample
    return payload  # type: ignore[return-value]


def _system(k: int) -> list[int]:
    """A prompt opening with shared system prompt k (PREFIX_BLOCK + 20 tokens), then its own."""
    return [1000 + k] * (PREFIX_BLOCK + 20)


def _where(routes: dict[str, list[TaskPayload]]) -> dict[int, str]:
    return {p["line"] * 100 + p.get("sample", 0): q for q, ps in routes.items() for p in ps}


def test_a_short_prompts_samples_go_together_and_a_lone_one_to_the_shared_queue(
        rclient: redis.Redis) -> None:
    for w in ("a", "b", "c", "d"):
        _beat(rclient, w)
    affinity = _routing(rclient)
    samples = [_payload(7, [1, 2, 3], sample=k) for k in range(4)]
    lone = _payload(8, [1, 2, 3])
    routes = affinity.first_routes([*samples, lone])
    where = _where(routes)
    own = {where[700 + k] for k in range(4)}
    assert len(own) == 1 and own != {QUEUE}
    assert where[800] == QUEUE
    assert prefix_key(lone) is None


def test_prompts_sharing_a_long_prefix_meet_one_worker_and_others_spread(
        rclient: redis.Redis) -> None:
    workers = ("a", "b", "c", "d")
    for w in workers:
        _beat(rclient, w, concurrency=1000)
    affinity = _routing(rclient)
    shared = [_payload(n, [*_system(0), n]) for n in range(1, 11)]
    others = [_payload(100 + k, [*_system(k), k]) for k in range(1, 41)]
    routes = affinity.first_routes(shared + others)
    where = _where(routes)
    assert len({where[n * 100] for n in range(1, 11)}) == 1
    spread = {where[(100 + k) * 100] for k in range(1, 41)}
    assert spread == {worker_queue(w) for w in workers}


def test_a_workers_queue_takes_first_turns_up_to_two_pools_and_next_turns_up_to_three(
        rclient: redis.Redis) -> None:
    _beat(rclient, "a", concurrency=8)
    rclient.rpush(worker_queue("a"), "x")  # one waits already
    affinity = _routing(rclient)
    routes = affinity.first_routes([_payload(n, [*_system(n), n]) for n in range(1, 21)])
    assert len(routes[worker_queue("a")]) == 15  # two pools of 8, less the one waiting
    assert len(routes[QUEUE]) == 5  # no other worker has room
    rclient.rpush(worker_queue("a"), *[f"first{k}" for k in range(15)])
    turns = [_payload(n, [n], sample=None) for n in range(1, 21)]
    nexts = affinity.routes(turns, {n: "a" for n in range(1, 21)})
    assert len(nexts[worker_queue("a")]) == 8  # three pools, less the 16 waiting
    assert len(nexts[QUEUE]) == 12


def test_no_routing_without_live_workers_or_when_off(rclient: redis.Redis) -> None:
    _beat(rclient, "lost", age_s=60)
    _beat(rclient, "closed", consuming=False)
    payloads = [_payload(n, _system(0)) for n in range(1, 5)]
    assert _routing(rclient).first_routes(payloads) == {QUEUE: payloads}
    _beat(rclient, "a")
    assert Affinity(rclient, enabled=False).first_routes(payloads) == {QUEUE: payloads}


def test_rendezvous_moves_only_a_leaving_workers_keys() -> None:
    workers = {w: 8 for w in "abcdefgh"}
    keys = [f"k{n}" for n in range(400)]
    before = {k: rendezvous_order(k, workers)[0] for k in keys}
    assert len(set(before.values())) == 8
    del workers["c"]
    after = {k: rendezvous_order(k, workers)[0] for k in keys}
    assert {k for k in keys if before[k] != after[k]} == {k for k in keys if before[k] == "c"}


def test_a_waiting_message_is_stolen_only_while_the_shared_queue_is_empty(
        rclient: redis.Redis) -> None:
    _beat(rclient, "a")
    rclient.rpush(worker_queue("a"), "turn")
    rclient.rpush(QUEUE, "first")
    affinity = Affinity(rclient, wait_s=0.0)
    assert affinity.sweep() == 0 and affinity.sweep() == 0  # seen twice, others busy
    rclient.delete(QUEUE)
    assert affinity.sweep() == 1
    assert rclient.lrange(QUEUE, 0, -1) == [b"turn"]
    assert rclient.llen(worker_queue("a")) == 0


def test_a_lost_workers_queue_goes_back_to_the_shared_one(rclient: redis.Redis) -> None:
    _beat(rclient, "a", age_s=60)
    rclient.rpush(worker_queue("a"), "t1", "t2")
    rclient.rpush(QUEUE, "first")
    assert Affinity(rclient, wait_s=0.0).sweep() == 2
    assert rclient.llen(QUEUE) == 3 and not rclient.exists(worker_queue("a"))


def test_a_key_whose_worker_is_full_goes_whole_to_its_next_worker(rclient: redis.Redis) -> None:
    """Bounded load: a group (here a short prompt's 4 samples) stays together on the next
    worker of its key's order rather than scattering over the shared queue."""
    for w in ("a", "b", "c"):
        _beat(rclient, w, concurrency=3)
    samples = [_payload(7, [1, 2, 3], sample=k) for k in range(4)]
    first, second = rendezvous_order("line 7", {"a": 3, "b": 3, "c": 3})[:2]
    rclient.rpush(worker_queue(first), *"uvwxyz")  # two pools' worth wait there
    routes = _routing(rclient).first_routes(samples)
    assert routes == {worker_queue(second): samples}
