"""Speculative acceptance from result records (pure): the pooled and per-request figures of a
set of answers, broken down by server, by a row field, by thinking, by turn and by answer
length, the lowest rows, and the regenerable rows `weak.jsonl` holds; what the drainer's
summary and `fleetgen report` both compute, each from the files alone.

Pooled: Σ completion tokens / Σ verify steps over the answers that report their steps, as
SpecForge's benchmarker pools (`benchmarks/benchmarker/utils.py`); the per-request mean
(`specforge/benchmarks/sglang.py`) beside it.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from fleetgen.records.outcomes import split_result

# The `spec` object of a result (fleetgen/engine/sglang.py `parse_spec`,
# fleetgen/engine/speculation.py `parse_vllm_spec`): verify_ct always, the rest where the
# server gives them; `tokens` (vLLM) what the verify steps produced, where that is not the
# completion tokens.
SPEC_KEYS: Final = ("verify_ct", "tokens", "accept_length", "accept_rate", "correct_drafts",
                    "proposed_drafts", "histogram")
NOTE: Final = (
    "accept_length pools every answer that reports its verify steps: sum of completion tokens "
    "/ sum of verify steps, so each verify step weighs the same, as the drafter's speed-up "
    "does. accept_length_mean averages each answer's own ratio: a 20-token answer weighs as "
    "much as a 4,000-token one, and short answers' ratios are noisy (the prefill's token is "
    "in every ratio). They differ whenever acceptance varies with answer length, and can "
    "order two drafters differently (vLLM #42508): compare drafters on the pooled figure.")
LOWEST_ROWS: Final = 20
LOWEST_GROUPS: Final = 5
# A group smaller than this is left out of the lowest groups: its figure is noise.
MIN_GROUP: Final = 5
# Answer-length buckets (completion tokens): where acceptance often moves.
LENGTH_EDGES: Final = (256, 1024, 4096)


def steps_of(record: Mapping[str, Any]) -> tuple[int, int, float] | None:
    """(tokens, verify steps, the answer's own accept length) of a result, or None when it
    carries no usable `spec`. The tokens are the verify steps' own where the spec says (vLLM:
    steps + accepted drafts, so the pooled figure is its 1 + accepted / steps), else the
    completion tokens (SGLang's accept length, the prefill's token included)."""
    spec = record.get("spec")
    if not isinstance(spec, dict):
        return None
    if _zero(spec.get("verify_ct")) and _zero(spec.get("tokens")):
        return 0, 0, 1.0  # vLLM speculated but verified no draft: one token a forward pass
    verify_ct = spec.get("verify_ct")
    tokens = spec["tokens"] if _count(spec.get("tokens")) else record.get("completion_tokens")
    if not (isinstance(verify_ct, int) and isinstance(tokens, int)
            and _count(verify_ct) and _count(tokens)):
        return None
    own = spec.get("accept_length")
    if isinstance(own, bool) or not isinstance(own, int | float):
        own = tokens / verify_ct
    return tokens, verify_ct, float(own)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _zero(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value == 0


@dataclass
class Pool:
    """The acceptance of a set of answers, added one result at a time."""

    requests: int = 0
    completion_tokens: int = 0  # the tokens of the pooled figure (steps_of): vLLM's steps' own
    verify_ct: int = 0
    own_lengths: float = 0.0  # Σ of each answer's accept length, for the per-request mean
    correct_drafts: int = 0
    proposed_drafts: int = 0

    def add(self, record: Mapping[str, Any]) -> bool:
        steps = steps_of(record)
        if steps is None:
            return False
        tokens, verify_ct, own = steps
        self.requests += 1
        self.completion_tokens += tokens
        self.verify_ct += verify_ct
        self.own_lengths += own
        spec = record["spec"]
        correct, proposed = spec.get("correct_drafts"), spec.get("proposed_drafts")
        if isinstance(correct, int) and _count(proposed):
            self.correct_drafts += correct
            self.proposed_drafts += proposed
        return True

    @property
    def accept_length(self) -> float | None:
        """Σ tokens / Σ verify steps; 1.0 for answers that verified no draft at all (vLLM's
        figure for them), None for no answer."""
        if self.verify_ct:
            return self.completion_tokens / self.verify_ct
        return 1.0 if self.requests else None

    def figures(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "accept_length": _round(self.accept_length),
            "accept_length_mean": _round(self.own_lengths / self.requests
                                         if self.requests else None),
            "accept_rate": _round(self.correct_drafts / self.proposed_drafts
                                  if self.proposed_drafts else None),
            "completion_tokens": self.completion_tokens,
            "verify_ct": self.verify_ct,
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


@dataclass
class CounterSessions:
    """vLLM's acceptance, from the `spec_counters` results carry (fleetgen/engine/speculation.py
    CounterDeltas): each worker session's counters only grow, so its latest reading (the one
    with the most drafts) is its whole; the run is the sum of its sessions."""

    latest: dict[tuple[str, float], tuple[int, int, int]] = field(default_factory=dict)

    def add(self, record: Mapping[str, Any]) -> None:
        counters = record.get("spec_counters")
        if not isinstance(counters, dict):
            return
        values = [counters.get(k) for k in ("drafts", "draft_tokens", "accepted")]
        since = counters.get("since")
        if not all(isinstance(v, int) for v in values) or not isinstance(since, int | float):
            return
        key = (str(record.get("worker") or "?"), float(since))
        drafts, draft_tokens, accepted = (int(v) for v in values)  # type: ignore[arg-type]
        if drafts >= self.latest.get(key, (-1, 0, 0))[0]:
            self.latest[key] = (drafts, draft_tokens, accepted)

    def figures(self) -> dict[str, Any] | None:
        if not self.latest:
            return None
        by_worker: dict[str, list[int]] = {}
        for (worker, _), values in self.latest.items():
            sums = by_worker.setdefault(worker, [0, 0, 0])
            for i, value in enumerate(values):
                sums[i] += value
        total = [sum(v[i] for v in by_worker.values()) for i in range(3)]
        return {**_counter_figures(total), "sessions": len(self.latest),
                "by_worker": {w: _counter_figures(by_worker[w]) for w in sorted(by_worker)}}


def _counter_figures(sums: list[int]) -> dict[str, Any]:
    drafts, draft_tokens, accepted = sums
    # vLLM's own mean acceptance length (SpecDecodingProm): 1 + accepted / drafts.
    return {"accept_length": _round(1 + accepted / drafts if drafts else None),
            "accept_rate": _round(accepted / draft_tokens if draft_tokens else None),
            "drafts": drafts, "draft_tokens": draft_tokens, "accepted": accepted}


def pooled_summary(pool: Pool, by_worker: Mapping[str, Pool], done: int,
                   counters: CounterSessions | None = None) -> dict[str, Any]:
    """summary.json's `spec`: the pooled figure, the mean beside it, the answers without one,
    and each worker's (one per server under `fleetgen run`); `vllm`, from the counters of
    servers that report acceptance only as counters (vLLM without per-request metrics)."""
    vllm = counters.figures() if counters is not None else None
    return {**pool.figures(), "without_spec": done - pool.requests,
            "by_worker": {name: by_worker[name].figures() for name in sorted(by_worker)},
            **({"vllm": vllm} if vllm else {}), "note": NOTE}


# -- the breakdowns ---------------------------------------------------------------------------
def thinking_of(record: Mapping[str, Any]) -> str:
    """on / off: whether the answer reasoned (its reasoning tokens, where the run split them;
    else the row's `chat_template_kwargs.enable_thinking`); unknown when neither says."""
    thought = record.get("reasoning_tokens")
    if isinstance(thought, int) and not isinstance(thought, bool):
        return "on" if thought > 0 else "off"
    kwargs = split_result(record).row.get("chat_template_kwargs")
    flag = kwargs.get("enable_thinking") if isinstance(kwargs, dict) else None
    return "unknown" if not isinstance(flag, bool) else ("on" if flag else "off")


def length_bucket(record: Mapping[str, Any]) -> str:
    tokens = int(record.get("completion_tokens") or 0)
    low = 0
    for edge in LENGTH_EDGES:
        if tokens < edge:
            return f"{low}-{edge - 1}"
        low = edge
    return f"{low}+"


NO_FIELD: Final = "(none)"
FIELDS_KEPT: Final = 50  # row field names remembered, to name them when --group-by finds none


def field_of(name: str) -> Callable[[Mapping[str, Any]], str]:
    """The row's own field `name` as a group (a list or object as its JSON-ish text); dots
    name a nested field (`meta.src`). A value with spaces at either end is quoted: `code` and
    `code ` are two groups and must not print alike."""
    def key(record: Mapping[str, Any]) -> str:
        value: Any = split_result(record).row
        for part in name.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is None:
            return NO_FIELD
        text = str(value)
        return repr(text) if text != text.strip() else text
    return key


def server_of(record: Mapping[str, Any]) -> str:
    """The worker that answered: under `fleetgen run`, gpuN is the N-th --engine-url."""
    return str(record.get("worker") or "?")


DIMENSIONS: Final[dict[str, Callable[[Mapping[str, Any]], str]]] = {
    "server": server_of,
    "thinking": thinking_of,
    "turn": lambda r: str(r.get("turn", "-")),
    "answer_length": length_bucket,
}
# How the breakdowns compare: with two drafters in one run, which rows a server got is the
# shared queue's doing, so a group pooled across servers measures where its rows landed as
# much as the prompts; each group is then a cell of a server x group table.
WITHIN_SERVER: Final = "within each server (server x group: each server's own drafter)"
ONE_SERVER: Final = "one server: every group on the same drafter"


@dataclass(order=True)
class _Low:
    """A heap entry: the highest of the kept lowest rows on top (negated length)."""

    neg_length: float
    slot: int
    record: dict[str, Any] = field(compare=False)


@dataclass
class LowestRows:
    """One server's LOWEST_ROWS answers of the lowest accept length, one per id: the samples
    (`--n`) and turns (`--turns all`) of one prompt are one input row again in weak.jsonl."""

    heap: list[_Low] = field(default_factory=list)
    by_id: dict[Any, _Low] = field(default_factory=dict)

    def add(self, entry: _Low) -> None:
        row_id = entry.record.get("id")
        held = self.by_id.get(row_id)
        if held is not None:
            if entry > held:  # a lower answer of an id already kept replaces it
                self.heap[self.heap.index(held)] = entry
                heapq.heapify(self.heap)
                self.by_id[row_id] = entry
            return
        if len(self.heap) >= LOWEST_ROWS:
            if not entry > self.heap[0]:
                return
            del self.by_id[heapq.heappop(self.heap).record.get("id")]
        heapq.heappush(self.heap, entry)
        self.by_id[row_id] = entry

    def ordered(self) -> list[dict[str, Any]]:
        return [low.record for low in sorted(self.heap, reverse=True)]


@dataclass
class AcceptanceScan:
    """The report's acceptance: overall, by each dimension (and the user's `group_by` row
    field) within each server, and the lowest answers, lowest within their server."""

    group_by: str | None = None
    pool: Pool = field(default_factory=Pool)
    # dimension -> (server, group) -> the pool of that cell
    groups: dict[str, dict[tuple[str, str], Pool]] = field(default_factory=dict)
    counters: CounterSessions = field(default_factory=CounterSessions)
    without_spec: int = 0  # answers with no acceptance (a server that does not speculate)
    fields: set[str] = field(default_factory=set)  # the rows' own field names, FIELDS_KEPT
    _lowest: dict[str, LowestRows] = field(default_factory=dict)

    def add(self, record: dict[str, Any], slot: int) -> None:
        self.counters.add(record)
        if len(self.fields) < FIELDS_KEPT:
            self.fields.update(list(split_result(record).row)[:FIELDS_KEPT])
        if not self.pool.add(record):
            self.without_spec += 1
            return
        server = server_of(record)
        for name, key in self._dimensions().items():
            cell = ("", key(record)) if name == "server" else (server, key(record))
            self.groups.setdefault(name, {}).setdefault(cell, Pool()).add(record)
        steps = steps_of(record)
        assert steps is not None
        self._lowest.setdefault(server, LowestRows()).add(_Low(-steps[2], -slot, record))

    def _dimensions(self) -> dict[str, Callable[[Mapping[str, Any]], str]]:
        if self.group_by is None:
            return DIMENSIONS
        return {**DIMENSIONS, f"field:{self.group_by}": field_of(self.group_by)}

    def lowest_rows(self) -> list[dict[str, Any]]:
        """The lowest answers, each ranked within its own server (one drafter's lowest are
        not another's), taken rank by rank across the servers: every server's lowest, then
        every server's second lowest, ...; one answer per id, LOWEST_ROWS in all."""
        ranked = [rows.ordered() for _, rows in sorted(self._lowest.items())]
        picked: list[dict[str, Any]] = []
        seen: set[Any] = set()
        for rank in range(LOWEST_ROWS):
            for rows in ranked:
                if rank < len(rows) and rows[rank].get("id") not in seen:
                    seen.add(rows[rank].get("id"))
                    picked.append(rows[rank])
        return picked[:LOWEST_ROWS]

    @property
    def servers(self) -> int:
        return len(self._lowest)

    def figures(self) -> dict[str, Any] | None:
        vllm = self.counters.figures()
        if not self.pool.requests:
            return None if vllm is None else {**self.pool.figures(), "vllm": vllm,
                                              "breakdowns": {}, "lowest_groups": [],
                                              "lowest_rows": [], "note": NOTE}
        breakdowns = {name: self._breakdown(cells) for name, cells in self.groups.items()}
        return {
            **self.pool.figures(),
            "note": NOTE,
            "group_by": self.group_by,
            "compared": WITHIN_SERVER if self.servers > 1 else ONE_SERVER,
            "without_spec": self.without_spec,
            **self._group_by_found(breakdowns),
            "breakdowns": breakdowns,
            "lowest_groups": lowest_groups(breakdowns),
            "lowest_rows": [_row_line(r) for r in self.lowest_rows()],
            **({"vllm": vllm} if vllm else {}),
        }

    def _group_by_found(self, breakdowns: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
        """Where no answered row has the --group-by field (a typo, a nested field named
        without its dots): say so, with the fields the rows have."""
        groups = breakdowns.get(f"field:{self.group_by}")
        if not groups or any(g["group"] != NO_FIELD for g in groups):
            return {}
        return {"group_by_missing": sorted(self.fields)}

    def _breakdown(self, cells: dict[tuple[str, str], Pool]) -> list[dict[str, Any]]:
        """A breakdown's groups, lowest first within each server (the server's name on each
        group when the run had several: a server x group table)."""
        several = self.servers > 1
        groups = [{**({"server": server} if several and server else {}), "group": key,
                   **pool.figures()} for (server, key), pool in cells.items()]
        return sorted(groups, key=lambda g: (g.get("server", ""), g["accept_length"],
                                             g["group"]))


def lowest_groups(breakdowns: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The LOWEST_GROUPS lowest groups of at least MIN_GROUP answers of each server (a
    breakdown of one group says nothing), ranked within it."""
    by_server: dict[str, list[dict[str, Any]]] = {}
    for name, groups in breakdowns.items():
        if len({g["group"] for g in groups}) < 2:
            continue
        for g in groups:
            if g["requests"] >= MIN_GROUP:
                by_server.setdefault(g.get("server", ""), []).append({"by": name, **g})
    return [g for server in sorted(by_server) for g in sorted(
        by_server[server], key=lambda g: g["accept_length"])[:LOWEST_GROUPS]]


def _row_line(record: Mapping[str, Any]) -> dict[str, Any]:
    steps = steps_of(record)
    assert steps is not None
    return {"id": record.get("id"), "line": record.get("line"), "worker": record.get("worker"),
            "turn": record.get("turn"), "completion_tokens": record.get("completion_tokens"),
            "verify_ct": steps[1],
            "accept_length": round(steps[2], 4)}


def weak_row(record: Mapping[str, Any]) -> dict[str, Any]:
    """A lowest answer's input row again, as `fleetgen run` reads it: its id and the row's own
    fields (the prompt, its sampling and template options), none of fleetgen's."""
    return {"id": record.get("id"), **split_result(record).row}
