"""One prompt, start to finish: call the engine, act on each error's decision
(fleetgen/engine/decision.py) and do its waiting, then emit exactly one outcome."""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from uuid import uuid4

from fleetgen import errors
from fleetgen.engine import Engine, GenerateOptions
from fleetgen.engine.decision import Action, Attempt, Decision, RetryPolicy, asks_server, decide
from fleetgen.errors import EngineGone
from fleetgen.queue.contract import KIND_FAILURE, KIND_RESULT, TaskPayload, slot_of
from fleetgen.records.outcomes import Generation, failure_record, result_counts, result_record
from workers.sink import RunPurged, Sink
from workers.state import state

log = logging.getLogger("fleetgen.worker")

# How often a prompt whose engine stopped answering asks again whether it is back.
PROBE_EVERY_S = 0.5


@dataclass(frozen=True)
class Pacing:
    """How the task waits: the sleep before a retry and between health probes, and the
    jitter's random source. Real time and a fresh source per prompt unless a test gives its
    own, so that retries take no time and draw the same jitter every run."""

    sleep: Callable[[float], None] = time.sleep
    rng: random.Random | None = None


REAL_TIME = Pacing()


def generate_one(payload: TaskPayload, engine: Engine, sink: Sink, policy: RetryPolicy, *,
                 worker: str, pacing: Pacing = REAL_TIME) -> str:
    """Returns the outcome kind ('result', 'failure', 'skipped', 'dropped'); raises
    EngineGone."""
    try:
        return _generate_one(payload, engine, sink, policy, worker=worker, pacing=pacing)
    except RunPurged:
        _count_dropped(payload)
        return "dropped"


def _count_dropped(payload: TaskPayload) -> None:
    """A task of a purged run (or of no run this Redis knows) is dropped, counted per run in
    this process and logged with the count, so a purge that missed a task is seen."""
    run = payload["run"]
    with state.lock:
        state.dropped[run] = count = state.dropped.get(run, 0) + 1
    log.warning("id=%s dropped: run %r has no manifest in this Redis (purged); %d task(s) of "
                "it dropped by this worker", payload["id"], run, count)


def _generate_one(payload: TaskPayload, engine: Engine, sink: Sink, policy: RetryPolicy, *,
                  worker: str, pacing: Pacing) -> str:
    run, slot = payload["run"], slot_of(payload)
    if sink.is_done(run, slot):
        log.info("id=%s already done, redelivery skipped", payload["id"])
        return "skipped"
    rng = pacing.rng or random.Random()
    attempt = Attempt(payload["max_tokens"])
    options = generate_options(payload)
    while True:
        attempt = attempt.called()
        try:
            gen = _call(engine, payload, attempt, options, request_id(run, slot))
            check_token_ids(gen, options)
        except errors.EngineError as exc:
            decision = _decide(exc, attempt, policy, engine, pacing, rng)
            attempt = decision.attempt
            if _again(decision, payload["id"], pacing):
                continue
            return _emit_failure(payload, exc, attempt, sink, worker)
        return _emit_result(payload, gen, attempt, sink, worker)


def _call(engine: Engine, payload: TaskPayload, attempt: Attempt, options: GenerateOptions,
          rid: str) -> Generation:
    """One engine call; whether it was answered or timed out goes to the process's silence,
    which the heartbeat carries to the engine's supervisor (workers/silence.py)."""
    try:
        gen = engine.generate(payload["input_ids"], attempt.max_tokens,
                              dict(payload["sampling"]), rid=rid, options=options)
    except errors.EngineError as exc:
        state.silence.heard(exc)
        raise
    state.silence.heard(None)
    return gen


def _decide(exc: errors.EngineError, attempt: Attempt, policy: RetryPolicy, engine: Engine,
            pacing: Pacing, rng: random.Random) -> Decision:
    """The decision on `exc`, with the one fact it needs from outside: whether the server is
    up, probed (which may wait up to policy.gone_s) only when the decision depends on it."""
    up = _engine_back(engine, policy, pacing.sleep) if asks_server(exc) else True
    return decide(exc, attempt, policy, engine.rule, server_up=up, jitter=rng.random())


def _again(decision: Decision, row_id: str, pacing: Pacing) -> bool:
    """Carry out a decision's waiting: True to call the engine again, False to write the
    failure; EngineGone to hand the prompt back (the Celery task requeues it)."""
    if decision.action is Action.HAND_BACK:
        raise EngineGone(decision.reason)
    if decision.action is Action.CORRECT:
        log.info("id=%s %s, correcting once", row_id, decision.reason)
        return True
    if decision.action is Action.RETRY:
        log.info("id=%s attempt %d failed (%s), retrying", row_id, decision.attempt.attempts,
                 decision.reason)
        pacing.sleep(decision.delay_s)
        return True
    return False


def generate_options(payload: TaskPayload) -> GenerateOptions:
    """What the payload asks of the engine beyond sampling (fleetgen/queue/contract.py).

    The grammar waits for `</think>` only when the rendered prompt leaves the think block open
    (`think_open`), as SGLang's own chat path decides it from the thinking mode
    (`entrypoints/openai/serving_chat.py`: `result.require_reasoning = thinking_mode`, from
    `_get_reasoning_from_request`, false for `enable_thinking: false`). A prompt that closed
    the block (`<think>\n\n</think>\n\n`) is answered without reasoning: a grammar told to
    wait would wait for a `</think>` that never comes and never apply. A prompt that opens
    no block at all (a raw `prompt` row) gets the grammar from the first token too: the
    answer is then a valid document without reasoning, never an unconstrained one."""
    think = bool(payload.get("think"))
    schema = payload.get("json_schema")
    opened = think and bool(payload.get("think_open"))
    return GenerateOptions(keep_special_tokens=think, logprobs=int(payload.get("logprobs") or 0),
                           json_schema=schema, reasoning_first=opened and schema is not None,
                           token_ids=bool(payload.get("token_ids")))


def check_token_ids(gen: Generation, options: GenerateOptions) -> None:
    """A run that keeps token ids never writes a result without them. The producer refuses a
    server that returns none at start (`producer/build.py`); this catches one swapped in
    behind the same URL since."""
    if not options.token_ids:
        return
    if gen.output_ids is None:
        raise errors.PermanentError("the engine returned no output token ids, which "
                                    "--token-ids needs (see docs/formats.md \"Token ids\")")
    if len(gen.output_ids) != gen.completion_tokens:
        raise errors.PermanentError(f"the engine returned {len(gen.output_ids)} output token "
                                    f"ids for {gen.completion_tokens} completion tokens")


def request_id(run: str, slot: int) -> str:
    """A rid of its own for every attempt of every delivery. SGLang refuses a rid still in
    flight (`TokenizerManager._init_req_state`), and a redelivered prompt can reach the server
    while its first delivery runs; aborts match rids by prefix (`Scheduler.abort_request`:
    `rid.startswith`), so the suffix has a fixed length: no rid is a prefix of another."""
    return f"{run}:{slot}:{uuid4().hex}"


def _engine_back(engine: Engine, policy: RetryPolicy, sleep: Callable[[float], None]) -> bool:
    """Whether the engine is up now or comes back within policy.gone_s (a blip is ridden
    out holding the prompt, as the health gate rides it out still consuming)."""
    if engine.healthy():
        return True
    for _ in range(math.ceil(policy.gone_s / PROBE_EVERY_S)):
        sleep(PROBE_EVERY_S)
        if engine.healthy():
            return True
    return False


def _recorded(kind: str, written: bool, payload: TaskPayload) -> str:
    """The outcome kind, or 'skipped' for one the sink refused as a second outcome: another
    worker answered the prompt while this one held it past its lease (frozen, cut off)."""
    if written:
        return kind
    log.warning("id=%s was answered by another worker while this one held it past its lease; "
                "this %s is dropped", payload["id"], kind)
    return "skipped"


def _emit_result(payload: TaskPayload, gen: Generation, attempt: Attempt, sink: Sink,
                 worker: str) -> str:
    record = result_record(payload, gen, max_tokens=attempt.max_tokens,
                           attempts=attempt.attempts, worker=worker)
    stats = {**result_counts(record), "retries": attempt.retries}
    return _recorded(KIND_RESULT, sink.emit(payload["run"], KIND_RESULT, slot_of(payload),
                                            record, stats), payload)


def _emit_failure(payload: TaskPayload, exc: errors.EngineError, attempt: Attempt, sink: Sink,
                  worker: str) -> str:
    log.warning("id=%s failed after %d attempt(s): %s", payload["id"], attempt.attempts,
                exc.message)
    record = failure_record(payload, exc, max_tokens=attempt.max_tokens,
                            attempts=attempt.attempts, worker=worker)
    stats = {"failed": 1, "retries": attempt.retries}
    return _recorded(KIND_FAILURE, sink.emit(payload["run"], KIND_FAILURE, slot_of(payload),
                                             record, stats, dict(payload)), payload)
