"""The in-flight limit's controller (workers/pacing.py) on a model of a server's queue, the
heartbeat's words for it, and when a limit holds an engine back; the pure parts only (the
workers that pace against real servers: tests/workers/test_pool_size.py)."""

from __future__ import annotations

import functools
import itertools
import random
from collections.abc import Callable

import pytest

from fleetgen.engine import PROTOCOLS, ServerLimits
from fleetgen.engine.load import Gauges, Load, parse_load
from fleetgen.monitor.status import WorkerStatus, holds_back
from workers.pacing import (
    PROBE_GROWTH,
    REPROBE_S,
    START_LIMIT,
    Pace,
    Pacer,
    beat_fields,
    held_queue,
)
from workers.settings import WorkerSettings
from workers.startup import FALLBACK_LIMIT, StartupRefused, plan_limit


def reading(held: list[int], slots: int) -> Load:
    """A server with `slots` running slots, holding what the workers hold."""
    total = sum(held)
    return Load(min(total, slots), max(0, total - slots))


def settle(pacers: list[Pacer], slots: int, supply: int, ticks: int = 40) -> list[list[int]]:
    """Each tick the workers hold min(limit, supply) (they fetch up to their limit at once) and
    read the server; the limits tick by tick."""
    history = []
    for _ in range(ticks):
        held = [min(p.limit, supply) for p in pacers]
        load = reading(held, slots)
        history.append([p.observe(load, h) for p, h in zip(pacers, held, strict=True)])
    return history


def test_one_worker_finds_the_slots_plus_a_small_queue() -> None:
    pacer = Pacer(start=16, ceiling=2048)
    history = settle([pacer], slots=256, supply=10_000)
    assert pacer.limit == 256 + held_queue(256)  # 272: every slot busy, 16 waiting
    # Doubling to the first queue: 16, 32, ... 512, within six readings (3 s).
    assert [h[0] for h in history[:6]][-1] >= 256
    assert max(h[0] for h in history) <= 512


def test_the_same_reading_twice_cuts_once() -> None:
    """The gauge lags the requests just sent: a second reading of the same excess before any
    answer comes back must not cut again (a limit of 128 on a 64-slot server went 68, 48, 32)."""
    pacer = Pacer(start=128, ceiling=2048)
    load = Load(running=64, waiting=24)
    pacer.observe(load, 88)  # the first reading cannot tell a full server from one admitting
    first = pacer.observe(load, 88)
    assert first == 88 - (24 - held_queue(64))
    assert pacer.observe(load, 88) == first


def test_after_a_dip_it_doubles_back_to_the_slots_it_has_seen() -> None:
    pacer = Pacer(start=128, ceiling=2048)
    for _ in range(2):  # the second reading: the queue did not drain into free slots
        pacer.observe(Load(64, 40), 104)  # the server's 64 slots seen
    pacer.limit = 20  # e.g. a burst of failures cut it
    grown = [pacer.observe(Load(pacer.limit, 0), pacer.limit) for _ in range(3)]
    # Doubled, then capped at the 64 slots seen plus the queue of each reading (40 running:
    # 2; 66 running: 4), never doubled past them.
    assert grown == [40, 64 + held_queue(40), 64 + held_queue(66)]


def test_two_workers_share_the_slots_without_knowing_of_each_other() -> None:
    pacers = [Pacer(16, 2048), Pacer(16, 2048)]
    settle(pacers, slots=128, supply=10_000, ticks=60)
    total = sum(p.limit for p in pacers)
    assert 128 <= total <= 128 + 2 * held_queue(128) + 2, [p.limit for p in pacers]
    assert min(p.limit for p in pacers) >= 32  # neither starves


def test_no_growth_while_the_limit_is_not_in_use_and_never_past_the_ceiling() -> None:
    idle = Pacer(16, 2048)
    settle([idle], slots=512, supply=5)  # the queue is dry: 5 prompts to hold
    assert idle.limit == 16
    capped = Pacer(16, 100)
    settle([capped], slots=512, supply=10_000)
    assert capped.limit == 100


def test_load_is_summed_over_engines_and_needs_both_gauges() -> None:
    gauges = Gauges("vllm:num_requests_running", "vllm:num_requests_waiting")
    text = ('# TYPE vllm:num_requests_running gauge\n'
            'vllm:num_requests_running{engine="0",model_name="m"} 60.0\n'
            'vllm:num_requests_running{engine="1",model_name="m"} 4.0\n'
            'vllm:num_requests_waiting{engine="0",model_name="m"} 3.0\n'
            'vllm:num_requests_waiting{engine="1",model_name="m"} 0.0\n')
    assert parse_load(text, gauges) == Load(64, 3)
    assert parse_load(text.replace("waiting", "swapped"), gauges) is None


def status_of(beat: dict[str, int | str], in_flight: int) -> WorkerStatus:
    return WorkerStatus("gpu0", in_flight=in_flight, concurrency=int(beat["concurrency"]),
                        limit_from=str(beat["limit_from"]), limit_max=int(beat["limit_max"]),
                        paced=bool(beat["paced"]),
                        engine_running=int(beat["engine_running"]),
                        engine_waiting=int(beat["engine_waiting"]),
                        engine_slots=int(beat["engine_slots"]) if beat["engine_slots"] != -1
                        else None)


def test_a_fixed_limit_in_use_on_an_engine_with_room_holds_it_back() -> None:
    fixed = beat_fields(Pace(8, "-c 8, as given", False, Load(8, 0)), 8)
    assert holds_back(status_of(fixed, in_flight=8))
    assert not holds_back(status_of(fixed, in_flight=3))  # not in use: the queue is dry
    queued = beat_fields(Pace(8, "-c 8, as given", False, Load(8, 5)), 8)
    assert not holds_back(status_of(queued, in_flight=8))  # the engine is full anyway
    growing = beat_fields(Pace(64, "found from its queue", True, Load(64, 0)), 2048)
    assert not holds_back(status_of(growing, in_flight=64))  # a paced limit grows itself
    at_ceiling = beat_fields(Pace(2048, "found from its queue", True, Load(2048, 0)), 2048)
    assert holds_back(status_of(at_ceiling, in_flight=2048))
    unread = beat_fields(Pace(8, "-c 8, as given", False, None), 8)
    assert not holds_back(status_of(unread, in_flight=8))  # nothing known of the engine
    # An engine that reports 8 slots and runs 8 is full, queue or not (-c K on SGLang).
    full = beat_fields(Pace(8, "-c 8, as given", False, Load(8, 0), slots=8), 8)
    assert not holds_back(status_of(full, in_flight=8))
    roomy = beat_fields(Pace(8, "-c 8, as given", False, Load(8, 0), slots=32), 8)
    assert holds_back(status_of(roomy, in_flight=8))
    # 8 held, 2 at the engine: the worker's own bookkeeping limits (a fast engine), not -c.
    busy_worker = beat_fields(Pace(8, "-c 8, as given", False, Load(2, 0), slots=32), 8)
    assert not holds_back(status_of(busy_worker, in_flight=8))


def settings_of(**env: str) -> WorkerSettings:
    return WorkerSettings.from_env({"FLEETGEN_REDIS_URL": "redis://127.0.0.1:1/0",
                                    "FLEETGEN_ENGINE_URL": "http://127.0.0.1:9", **env})


class Reader:
    """Stands in for a LoadReader that has read the queue once (plan_limit asks only that)."""

    gauges = Gauges("vllm:num_requests_running", "vllm:num_requests_waiting")


def test_the_plan_takes_the_reported_slots_then_the_queue_then_a_fallback() -> None:
    sglang = ServerLimits(context_length=8192, max_running_requests=7,
                          running_requests_from="internal_states")
    plan = plan_limit(PROTOCOLS["sglang"], sglang, settings_of(), None)
    assert (plan.pool, plan.limit, plan.paced, plan.slots) == (8, 8, False, 7)
    shared = plan_limit(PROTOCOLS["sglang"], sglang, settings_of(FLEETGEN_ENGINE_SHARE="2/2"),
                        None)
    assert shared.limit == 4 and "4 for this process (2 of 2)" in shared.source
    vllm = ServerLimits(context_length=4096, engine="vllm")
    paced = plan_limit(PROTOCOLS["openai"], vllm, settings_of(FLEETGEN_MAX_IN_FLIGHT="500"),
                       Reader())  # type: ignore[arg-type]
    assert (paced.pool, paced.limit, paced.paced) == (500, START_LIMIT, True)
    assert paced.source == ("vllm reports no slot count: found from its queue "
                            "(vllm:num_requests_waiting)")
    halves = [plan_limit(PROTOCOLS["openai"], vllm, settings_of(FLEETGEN_ENGINE_SHARE=f"{i}/2"),
                         Reader()) for i in (1, 2)]  # type: ignore[arg-type]
    assert [half.limit for half in halves] == [START_LIMIT // 2] * 2  # 64 together, as one
    assert halves[1].source.endswith(f"starting at {START_LIMIT // 2} for this process (2 of 2)")
    blind = plan_limit(PROTOCOLS["openai"], vllm, settings_of(), None)
    assert (blind.limit, blind.paced) == (FALLBACK_LIMIT, False) and "pass -c" in blind.source
    router = ServerLimits(context_length=4096, max_running_requests=8, servers_behind=2)
    with pytest.raises(StartupRefused, match="--enable-metrics"):
        plan_limit(PROTOCOLS["sglang"], router, settings_of(), None)


class SglangReader:
    gauges = Gauges("sglang:num_running_reqs", "sglang:num_queue_reqs",
                    "sglang:generation_tokens_total")


def test_a_slot_count_sized_from_the_token_pool_is_a_ceiling_paced_up_to() -> None:
    # The real SGLang 0.5.23 on CPU reports 4,096 (its token pool's share): K + 1 = 4097 sent
    # a whole 120-row run at once, to the first server ready, and left a second one idle.
    cpu = ServerLimits(context_length=4096, max_running_requests=4096,
                       running_requests_from="internal_states")
    plan = plan_limit(PROTOCOLS["sglang"], cpu, settings_of(),
                      SglangReader())  # type: ignore[arg-type]
    assert (plan.pool, plan.limit, plan.paced, plan.slots) == (4097, START_LIMIT, True, 4096)
    assert "SGLang's own default (2048 or more): a bound" in plan.source
    assert plan.source.endswith("up to 4097")
    # Without the token counter there is nothing to judge a step by: K + 1 as before.
    blind = plan_limit(PROTOCOLS["sglang"], cpu, settings_of(), Reader())  # type: ignore[arg-type]
    assert (blind.limit, blind.paced) == (4097, False)
    # A count below SGLang's own least default is the user's --max-running-requests: held.
    set_by_hand = ServerLimits(context_length=8192, max_running_requests=2047,
                               running_requests_from="internal_states")
    held = plan_limit(PROTOCOLS["sglang"], set_by_hand, settings_of(),
                      SglangReader())  # type: ignore[arg-type]
    assert (held.limit, held.paced) == (2048, False)
    halves = [plan_limit(PROTOCOLS["sglang"], cpu, settings_of(FLEETGEN_ENGINE_SHARE=f"{i}/2"),
                         SglangReader()) for i in (1, 2)]  # type: ignore[arg-type]
    assert [(h.pool, h.limit) for h in halves] == [(2049, START_LIMIT // 2),
                                                   (2048, START_LIMIT // 2)]


def run_against(pacer: Pacer, rate: Callable[[int], float], *, slots: int = 128,
                seconds: float = 300.0, tick_s: float = 0.5,
                noise: Callable[[], float] = lambda: 1.0) -> list[int]:
    """A server that admits up to `slots` at once and generates `rate(running)` tokens a
    second; the worker holds its whole limit (an endless supply of prompts). The limits read
    tick by tick."""
    generated, now, limits = 0.0, 0.0, []
    while now < seconds:
        held = pacer.limit
        running, waiting = min(held, slots), max(0, held - slots)
        generated += rate(running) * noise() * tick_s
        now += tick_s
        limits.append(pacer.observe(Load(running, waiting, generated), held, now))
    return limits


# bench real's vLLM on CPU (its rows, a 96-token cap, core 0): its tokens a second with a fixed
# number kept in flight, each over 45 s once 25 s had passed, measured twice on 2026-12-05 (by
# hand, then by `python -m bench real_rates`: bench/figures/real_rates.json). Lower at 4; from 8
# to 128 within 77-88 tokens/s, with no order that held in both.
CPU_RATES = [(1, 20.0), (4, 76.7), (8, 83.5), (16, 86.3), (32, 86.0), (48, 78.9), (64, 77.9),
             (96, 78.8), (128, 78.0)]
CPU_RATES_AGAIN = [(1, 20.0), (4, 72.0), (8, 86.0), (16, 83.1), (24, 81.1), (32, 78.8),
                   (48, 81.0), (64, 83.7), (96, 76.7), (128, 82.4)]


def curve(points: list[tuple[int, float]]) -> Callable[[int], float]:
    """Measured rates, joined by straight lines."""
    def rate(running: int) -> float:
        if running <= 0:
            return 0.0
        for (x0, y0), (x1, y1) in itertools.pairwise(points):
            if running <= x1:
                return y0 + (y1 - y0) * (running - x0) / (x1 - x0)
        return points[-1][1]
    return rate


cpu_like = curve(CPU_RATES)


def run_rows(limit_of: Callable[[], int], rows: int = 270, answer: int = 96,
             rate: Callable[[int], float] = cpu_like, tick_s: float = 0.5,
             seen: Callable[[Load, int, float], object] = lambda *_: None) -> float:
    """bench real's run on the model: `rows` answers of `answer` tokens each, every request
    running to its end (a lower limit only stops the refill), the server sharing its rate
    among what runs. `seen` gets each reading (the load, what is held, the time). The
    makespan."""
    left, now, generated = rows, 0.0, 0.0
    running: list[float] = []  # each request's tokens so far
    while left or running:
        while left and len(running) < limit_of():
            running.append(0.0)
            left -= 1
        share = rate(len(running)) / len(running) * tick_s
        generated += share * len(running)
        running = [r + share for r in running if r + share < answer]
        now += tick_s
        seen(Load(len(running), 0, generated), len(running), now)
    return now


@pytest.mark.parametrize("points", [CPU_RATES, CPU_RATES_AGAIN], ids=["first", "again"])
def test_on_the_measured_cpu_server_a_paced_run_is_as_fast_as_the_best_fixed_limit(
        points: list[tuple[int, float]]) -> None:
    """bench real's setting on the model of its server, with each of its two measurements:
    the best fixed limit (what the best plain client is) against the pacer from its start.
    Starting at 64, the pacer paid each step down with a whole answer's drain and took 1.059x
    on the first (bench real measured 1.075x); from 16, with the doubling undone and no step
    down that loses, 1.007x and 1.013x."""
    rate = curve(points)
    best = min(run_rows(functools.partial(int, c), rate=rate)
               for c in (8, 16, 24, 32, 48, 64, 128))
    pacer = Pacer(START_LIMIT, 2048)
    limits: list[int] = []

    def seen(load: Load, held: int, now: float) -> None:
        limits.append(pacer.observe(load, held, now))

    paced = run_rows(lambda: pacer.limit, rate=rate, seen=seen)
    assert paced <= 1.03 * best, (paced, best, sorted(set(limits)))
    assert max(limits) <= 2 * START_LIMIT  # one doubling tried, never 48 and beyond


def test_a_server_that_admits_more_than_it_runs_well_is_held_where_its_rate_peaks() -> None:
    """vLLM on CPU queues nothing at 128, so the queue alone doubled the limit to 128 and the
    run took 1.099x the best plain client (bench real). The token rate undoes the doubling to
    32 (no gain), then tries 13, which loses more than MAX_LOSS, and holds at 16."""
    pacer = Pacer(start=START_LIMIT, ceiling=2048)
    limits = run_against(pacer, cpu_like, seconds=300)
    assert max(limits) == 2 * START_LIMIT  # the doubling, undone
    assert limits[-1] == START_LIMIT
    assert min(limits) == round(START_LIMIT / PROBE_GROWTH)  # tried, lost 1.2 %, undone
    # The reprobes every REPROBE_S and more go a quarter up (20), no longer doubling.
    assert sorted(set(limits)) == [13, 16, 20, 32]


def test_each_probe_that_finds_nothing_doubles_the_hold_before_the_next() -> None:
    """A step up cannot be taken back (its requests run a whole answer's time: ~90 s on the
    CPU vLLM at a 96-token cap), so on a server where it does not pay the reprobes thin out:
    60 s, then 120, 240, 480 (bench real at the full size paid the same drain twice)."""
    pacer = Pacer(start=START_LIMIT, ceiling=2048)
    limits = run_against(pacer, cpu_like, seconds=1200)
    up = round(START_LIMIT * PROBE_GROWTH)
    # Reprobes: each time the limit leaves its hold at 16 for 20.
    starts = [i * 0.5 for i in range(1, len(limits))
              if limits[i] == up and limits[i - 1] == START_LIMIT]
    holds = [b - a for a, b in itertools.pairwise(starts)]
    assert len(starts) >= 4, starts
    assert all(later > 1.8 * earlier for earlier, later in itertools.pairwise(holds)), holds


def test_a_probe_that_pays_brings_the_hold_back_to_its_first_length() -> None:
    """The same server, then (after 500 s) one whose rate grows with the batch, as a GPU
    whose prompts got shorter: the next reprobe climbs, and the holds after it are 60 s again."""
    ticks = 0

    def changing(running: int) -> float:
        nonlocal ticks
        ticks += 1
        return cpu_like(running) if ticks * 0.5 < 500 else 2.0 * min(running, 300)

    pacer = Pacer(start=START_LIMIT, ceiling=2048)
    limits = run_against(pacer, changing, slots=1024, seconds=1500)
    assert max(limits[:1000]) == 2 * START_LIMIT
    assert max(limits) > 200, max(limits)  # climbed once the rate paid
    # Holds at the limit the climb kept: the first is one REPROBE_S again (the one before the
    # climb had reached 240 s), then they double as the reprobes find nothing.
    kept = limits[-1]
    holds = [len(list(run)) * 0.5 for value, run in itertools.groupby(limits[1000:])
             if value == kept]
    holds = [h for h in holds if h > REPROBE_S / 2]
    assert holds and REPROBE_S <= holds[0] < 1.5 * REPROBE_S, holds
    assert holds[1] > 1.8 * holds[0], holds


def test_a_step_down_is_judged_once_what_was_sent_before_has_ended() -> None:
    """Requests sent at the old limit run to their end: a rate measured while the worker still
    holds more than its new limit would be the old limit's. A server flat from 4 on."""
    pacer = Pacer(start=START_LIMIT, ceiling=2048)
    generated, now = 0.0, 0.0

    def read(in_flight: int) -> int:
        nonlocal generated, now
        generated += (80.0 if in_flight >= 4 else 20.0 * in_flight) * 0.5
        now += 0.5
        return pacer.observe(Load(in_flight, 0, generated), in_flight, now)

    for _ in range(200):  # doubled to 32, undone to a step below 16
        if read(pacer.limit) < START_LIMIT:
            break
    down = pacer.limit
    assert down == round(START_LIMIT / PROBE_GROWTH)
    # The 32 sent before are all still running: a minute of readings changes nothing.
    assert {read(2 * START_LIMIT) for _ in range(120)} == {down}
    # Once they end, the step down is measured and judged (kept: the rate is flat here).
    limits = [read(pacer.limit) for _ in range(60)]
    assert min(limits) < down, limits


def test_a_server_whose_rate_grows_with_the_batch_is_climbed_to_its_plateau() -> None:
    """A GPU below its KV cache: each sequence adds its own tokens a second up to 400 running.
    The limit doubles while a doubling pays half of itself (16 to 512), overshoots by one
    (1024: nothing gained), and steps down to the plateau."""
    pacer = Pacer(start=START_LIMIT, ceiling=2048)
    limits = run_against(pacer, lambda running: 30.0 * min(running, 400), slots=1024,
                         seconds=120)
    first_300 = next(i for i, limit in enumerate(limits) if limit >= 300) * 0.5
    assert first_300 < 30, first_300  # a few seconds a doubling
    assert 400 <= limits[-1] <= 400 * PROBE_GROWTH, limits[-1]
    assert max(limits) <= 2 * 512


def test_a_rate_with_noise_walks_the_limit_neither_up_nor_down() -> None:
    """±2 % of noise on each reading, on the CPU-like server: a step is judged against 6 % up
    and 1 % down of the best rate, each over 16 of the server's steps, so no run of lucky
    readings walks the limit out of the flat part (8 to 32) into 48 and beyond (-9 %)."""
    draws = random.Random(48)
    pacer = Pacer(start=START_LIMIT, ceiling=2048)
    limits = run_against(pacer, cpu_like, seconds=600,
                         noise=lambda: draws.uniform(0.98, 1.02))
    assert max(limits) <= 2 * START_LIMIT, max(limits)
    assert min(limits) >= 8, min(limits)
    assert 10 <= limits[-1] <= 20, limits[-1]


def test_a_queue_still_ends_the_climb_where_the_slots_are_full() -> None:
    """Rate rising to the last slot: the climb stops at the slots plus a small queue (156 on
    150 slots: 6 waiting), however the rate rose on the way."""
    pacer = Pacer(start=START_LIMIT, ceiling=2048)
    limits = run_against(pacer, lambda running: 30.0 * running, slots=150, seconds=120)
    assert 150 < limits[-1] <= 150 + held_queue(150)
    assert max(limits) <= 2 * 128  # the doubling past the slots, cut at the next reading


def test_workers_on_one_engine_hold_its_slots_between_them_while_requests_run_long() -> None:
    """Two workers on a 128-slot vLLM (bench real, --workers-per-engine 2): a cut only lowers
    a limit, the requests already sent run to their end (~30 s here), and answers of one cap
    end together. At such an end nothing waited, and each worker went back up to the server's
    whole 128 + 8: the two held 272 and the server queued 112 for 25 s (1.503x the plain
    client). Each goes back only to its part now."""
    slots, tick_s, service_s = 128, 0.5, 30.0
    pacers = [Pacer(START_LIMIT, 2048), Pacer(START_LIMIT, 2048)]
    held: list[list[list[float]]] = [[], []]  # per worker: [arrival, seconds served]
    arrivals, generated, totals = 0, 0.0, []
    for tick in range(1200):
        queue = sorted((r for mine in held for r in mine), key=lambda r: r[0])
        running = queue[:slots]  # first come, first served
        for request in running:
            request[1] += tick_s
        held = [[r for r in mine if r[1] < service_s] for mine in held]
        generated += 30.0 * len(running) * tick_s  # growing to the slots, as a GPU's
        total = sum(len(mine) for mine in held)
        # The gauges are the server's last step; the workers have refilled since (a fetch
        # takes milliseconds, a CPU step a second).
        load = Load(min(total, slots), max(0, total - slots), generated)
        for mine, pacer in zip(held, pacers, strict=True):
            while len(mine) < pacer.limit:
                arrivals += 1
                mine.append([arrivals, 0.0])
            pacer.observe(load, len(mine), tick * tick_s)
        totals.append(sum(len(mine) for mine in held))
    late = totals[240:]  # after the first two minutes
    assert max(late) <= slots + 2 * held_queue(slots) + 8, max(late)
    assert sum(late) / len(late) >= slots * 0.9, sum(late) / len(late)


def test_a_server_still_admitting_its_queue_is_not_cut() -> None:
    """vLLM takes a step's prefill budget of new requests at a time: 64 sent at once read as
    18 running and 46 waiting, then 30 and 34; the slots are not full. A queue that does not
    drain between readings is."""
    pacer = Pacer(start=64, ceiling=2048)
    pacer.observe(Load(18, 46, 0.0), 64, 0.0)
    assert pacer.observe(Load(30, 34, 10.0), 64, 0.5) == 64
    assert pacer.observe(Load(42, 22, 20.0), 64, 1.0) == 64
    assert pacer.observe(Load(42, 22, 30.0), 64, 1.5) < 64  # it stopped taking them


def test_an_engine_restarted_mid_window_is_measured_afresh() -> None:
    """A launched engine restarted by fleetgen counts its tokens from 0 again: the window open
    across the restart must not wait forever for a count below its start."""
    pacer = Pacer(start=START_LIMIT, ceiling=2048)
    # A window opens at 64 on a server that has generated a million tokens in its life.
    assert pacer.observe(Load(START_LIMIT, 0, 1_000_000.0), START_LIMIT, 0.0) == START_LIMIT
    restarted = run_against(pacer, lambda running: 30.0 * running, slots=1024, seconds=60)
    assert max(restarted) > START_LIMIT, restarted  # measured and stepped up after the restart


def test_no_window_opens_while_the_server_is_still_admitting_the_prompts_sent() -> None:
    """vLLM admits a step's prefill budget of new requests at a time, so for a few readings
    after the prompts are sent its queue gauge flickers between 0 and a few while the rate is
    still low. A window that settled in a reading of 0 there read the start low, and the next
    step up looked like a gain (bench real's first window at 64 let 80 pass). The window's
    settling starts over at each reading with requests waiting."""
    pacer = Pacer(start=START_LIMIT, ceiling=2048)

    def steady(count: int) -> float:  # the peak at 16, lower on either side
        return 80.0 * min(1.0, count / 16) - 0.5 * max(0, count - 16)

    generated, now, limits = 0.0, 0.0, []
    for tick in range(240):
        held = pacer.limit
        admitting = tick < 12
        generated += (20.0 if admitting else steady(held)) * 0.5
        now += 0.5
        waiting = 2 if admitting and tick % 2 else 0
        limits.append(pacer.observe(Load(held - waiting, waiting, generated), held, now))
    # The doubling to 32 (72 tokens/s against 80) is undone, not kept against a low start.
    assert limits[-1] == START_LIMIT, limits
    assert limits.count(2 * START_LIMIT) < 20, limits
