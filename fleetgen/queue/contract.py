"""The one contract between producer, workers, drainer and status: names, keys, message fields."""

from __future__ import annotations

from typing import Any, Final, NotRequired, TypedDict

# Celery routing. Workers must be started with `-Q fleetgen` (celery#10335: never rely on defaults).
QUEUE: Final = "fleetgen"
TASK_NAME: Final = "fleetgen.generate"
# Each worker also consumes a queue of its own, where the producer sends the next turn of a
# conversation that worker answered, so its server's prefix cache holds the history
# (docs/design.md "Prefix affinity"). Its messages carry the shared queue's routing key: one
# kombu restores (a dead worker's) goes back to the shared queue.
AFFINITY_PREFIX: Final = f"{QUEUE}.to."


def worker_queue(worker: str) -> str:
    """The queue of one worker (its Celery node name, as results name it: gpu0@host)."""
    return f"{AFFINITY_PREFIX}{worker}"

# Every Redis key fleetgen owns starts with this prefix, so one Redis can host many runs
# and `SCAN fleetgen:*` shows all of them.
PREFIX: Final = "fleetgen"

# Stream entry kinds, in field "k"; the record itself is orjson in field "d".
KIND_RESULT: Final = "result"
KIND_FAILURE: Final = "failure"
KIND_REJECTED: Final = "rejected"
# A held-out row (--holdout): never sent; its one line in holdout.jsonl is its outcome.
KIND_HOLDOUT: Final = "holdout"
KINDS: Final = (KIND_RESULT, KIND_FAILURE, KIND_REJECTED, KIND_HOLDOUT)

DRAINER_GROUP: Final = "drainer"

def worker_key(worker: str) -> str:
    """Hash a worker refreshes while alive (engine url, concurrency, health, its lease); it
    expires once a dead worker's prompts are back in the queue (fleetgen/queue/heartbeat.py)."""
    return f"{PREFIX}:worker:{worker}"


def closing_key() -> str:
    """String, the name of the run this Redis served, set once it is complete and the Redis is
    about to stop (`fleetgen run`'s and the demo's own Valkey): workers that joined from other
    hosts exit, live pages keep the end as their last state (fleetgen/queue/closing.py). No
    TTL: the Redis itself goes."""
    return f"{PREFIX}:closing"


def watcher_key(watcher: str) -> str:
    """String, `AT INTERVAL_S`: a live page's last read of the run (epoch s) and its period,
    so a closing run waits for the page to read the end. Expires after a few periods."""
    return f"{PREFIX}:watcher:{watcher}"



class Sampling(TypedDict, total=False):
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    repetition_penalty: float
    seed: int
    stop: list[str]


class TaskPayload(TypedDict):
    """The single argument of the Celery task (JSON)."""

    run: str
    line: int  # 1-based input line (or Parquet row) number; the row's identity inside a run
    id: str
    input_ids: list[int]
    max_tokens: int
    sampling: Sampling
    row: dict[str, Any]  # the input row's other fields, carried through to the output
    # With several samples per prompt (--n, or a Batch body's `n`) each sample is a task of its
    # own. `slot` is the request's bit in the run's bitmaps: requests are numbered 1.. in input
    # order as the producer reads them, so the same input and settings give the same slots.
    # Absent: one sample, and the slot is the line.
    sample: NotRequired[int]  # 0-based sample index
    slot: NotRequired[int]
    # `--turns all`: which assistant turn of the conversation this request generates (1-based)
    # and how many the conversation has. A conversation's turns take consecutive slots (per
    # sample), so turn k+1's slot is turn k's + 1. Absent: `--turns last`, one turn.
    turn: NotRequired[int]
    turns: NotRequired[int]
    # Split the answer on </think> into `reasoning` and `completion` (the engine is asked to
    # keep special tokens in the text); `think_open`: the rendered prompt itself ends inside an
    # open <think> block, so the answer starts in reasoning even without a <think> of its own.
    think: NotRequired[bool]
    think_open: NotRequired[bool]
    logprobs: NotRequired[int]  # top-K log-probabilities of every output token (0: none)
    # Keep the answer's generated token ids in the result (`output_ids`), for trainers that
    # read token ids (`fleetgen export --format tokens`); an answer without them is a failure.
    token_ids: NotRequired[bool]
    json_schema: NotRequired[str]  # a JSON Schema document, as a JSON string
    # With several input files (a directory or a glob): the row's file and its position there
    # (line, or Parquet row), copied into its outcome as into a rejection.
    file: NotRequired[str]
    position: NotRequired[int]


def slot_of(item: TaskPayload | dict[str, Any]) -> int:
    """The bit of a task payload or an outcome record in the run's bitmaps."""
    return int(item.get("slot", item["line"]))


def slots_of(record: dict[str, Any]) -> range:
    """The slots an outcome record stands for: its own, or a holdout line's every request
    (`slots` of them from its first)."""
    first = slot_of(record)
    return range(first, first + int(record.get("slots", 1)))


def request_key(item: TaskPayload | dict[str, Any]) -> str:
    """The key of one request among a run's outcomes: the id, or `id#sample` for a sample,
    and `@turn` after it for one turn of a `--turns all` conversation."""
    sample = item.get("sample")
    key = str(item["id"]) if sample is None else f"{item['id']}#{sample}"
    turn = item.get("turn")
    return key if turn is None else f"{key}@{turn}"


def blocked_by(record: dict[str, Any]) -> int:
    """The later turns of its conversation a failed turn holds back (0 for a request that is
    not one turn of several): they have no outcome while the failure stands, and count as
    settled until `fleetgen retry` turns it into a result."""
    turn, turns = record.get("turn"), record.get("turns")
    return 0 if turn is None or turns is None else max(int(turns) - int(turn), 0)
