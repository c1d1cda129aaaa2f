"""`fleetgen report`: a drained output directory read once, as a stream, into the figures and
distributions one self-contained HTML page shows (files only, never Redis).

Memory is flat in rows: every distribution is a count per distinct value (token counts are
bounded by the context, write times by the run's seconds), examples are a few per kind, and the
only thing that grows with the run is one bit per result slot (125 KB per million rows), which
tells a failure that a later retry turned into a result (a drainer killed before it rewrote
failures.jsonl can leave both) from a real one.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from fleetgen.drainer.acceptance import AcceptanceScan, weak_row
from fleetgen.exporter.export import refuse_drainer_files
from fleetgen.exporter.source import DrainedRun
from fleetgen.queue.contract import (
    KIND_FAILURE,
    KIND_HOLDOUT,
    KIND_REJECTED,
    KIND_RESULT,
    slot_of,
    slots_of,
)
from fleetgen.records.outcomes import quality_counts
from fleetgen.records.outdir import atomic_file

EXAMPLES = 3  # examples kept per failure or rejection kind
EXAMPLE_CHARS = 300  # of a message or reason
SAMPLES = 3  # answers shown in full-ish (plus the first truncated one)
SAMPLE_CHARS = 1500  # of a sample's prompt, reasoning and answer
HIST_BINS = 60  # at most, for token distributions
TIME_POINTS = 240  # at most, for throughput over the run
# The figures compared with summary.json (and shown side by side when they differ).
FIGURES = ("total", "done", "failed", "rejected", "holdout", "truncated", "prompt_tokens",
           "completion_tokens", "empty", "reasoning_unfinished", "json_invalid")


@dataclass
class Scan:
    """What the files hold, accumulated one record at a time (pure: no I/O)."""

    counts: Counter[str] = field(default_factory=Counter)
    completion: Counter[int] = field(default_factory=Counter)
    completion_cut: Counter[int] = field(default_factory=Counter)  # finish_reason length
    reasoning: Counter[int] = field(default_factory=Counter)
    reasoning_share: Counter[int] = field(default_factory=Counter)  # percent of the answer
    prompt_sent: Counter[int] = field(default_factory=Counter)  # results and failures
    prompt_rejected: Counter[int] = field(default_factory=Counter)  # rejected with a length
    max_tokens: Counter[int] = field(default_factory=Counter)
    finish: Counter[str] = field(default_factory=Counter)
    workers: dict[str, Counter[str]] = field(default_factory=dict)
    rows_at: Counter[int] = field(default_factory=Counter)  # outcomes per second written
    tokens_at: Counter[int] = field(default_factory=Counter)
    failures: dict[str, Counter[str]] = field(default_factory=dict)
    failure_examples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    rejections: Counter[str] = field(default_factory=Counter)
    rejection_examples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    result_slots: bytearray = field(default_factory=bytearray)
    superseded: int = 0  # failures hidden by a result of the same slot
    # A few answers to read without `head results.jsonl`: the first ones, and the first that
    # ran out of budget (what a truncated answer looks like is what one wants to see).
    samples: list[dict[str, Any]] = field(default_factory=list)
    # Speculative acceptance (fleetgen/drainer/acceptance.py), of the results that carry `spec`.
    acceptance: AcceptanceScan = field(default_factory=AcceptanceScan)

    def add_result(self, record: dict[str, Any]) -> None:
        slot = slot_of(record)
        if (slot >> 3) >= len(self.result_slots):
            self.result_slots.extend(bytes(max((slot >> 3) + 1 - len(self.result_slots),
                                               len(self.result_slots))))
        self.result_slots[slot >> 3] |= 1 << (slot & 7)
        tokens = int(record.get("completion_tokens") or 0)
        prompt = int(record.get("prompt_tokens") or 0)
        finish = str(record.get("finish_reason"))
        self.counts.update(done=1, prompt_tokens=prompt, completion_tokens=tokens,
                           truncated=int(finish == "length"), **quality_counts(record))
        self.completion[tokens] += 1
        if finish == "length":
            self.completion_cut[tokens] += 1
        self.finish[finish] += 1
        self.prompt_sent[prompt] += 1
        self.max_tokens[int(record.get("max_tokens") or 0)] += 1
        thought = record.get("reasoning_tokens")
        if isinstance(thought, int):
            self.counts["with_reasoning_tokens"] += 1
            self.reasoning[thought] += 1
            if tokens:
                self.reasoning_share[min(100, round(100 * thought / tokens))] += 1
        self._worker(record, done=1, completion_tokens=tokens, prompt_tokens=prompt)
        self._at(record, tokens)
        self.acceptance.add(record, slot)
        if len(self.samples) < SAMPLES or (finish == "length" and not any(
                x["finish_reason"] == "length" for x in self.samples)):
            self.samples.append(_sample(record))

    def has_result(self, record: dict[str, Any]) -> bool:
        slot = slot_of(record)
        return (slot >> 3) < len(self.result_slots) and \
            bool(self.result_slots[slot >> 3] & (1 << (slot & 7)))

    def add_failure(self, record: dict[str, Any]) -> None:
        if self.has_result(record):
            self.superseded += 1
            return
        error = record.get("error") or {}
        kind = str(error.get("type") or "unknown")
        status = error.get("status")
        self.counts["failed"] += 1
        self.failures.setdefault(kind, Counter())["" if status is None else str(status)] += 1
        self.prompt_sent[int(record.get("prompt_tokens") or 0)] += 1
        examples = self.failure_examples.setdefault(kind, [])
        if len(examples) < EXAMPLES:
            examples.append({"id": record.get("id"), "line": record.get("line"),
                             "status": status, "attempts": record.get("attempts"),
                             "message": _clip(str(error.get("message") or ""))})
        self._worker(record, failed=1)
        self._at(record, 0)

    def add_holdout(self, record: dict[str, Any]) -> None:
        """A held-out row: never sent, one line for all its requests (summary.json's
        `holdout` counts the requests, `holdout_rows` the lines)."""
        self.counts["holdout"] += len(slots_of(record))
        self.counts["holdout_rows"] += 1

    def add_rejected(self, record: dict[str, Any]) -> None:
        reason = str(record.get("reason") or "")
        code = reason.split(":", 1)[0].strip() or "unknown"
        self.counts["rejected"] += 1
        self.rejections[code] += 1
        if isinstance(record.get("prompt_tokens"), int):
            self.prompt_rejected[record["prompt_tokens"]] += 1
        examples = self.rejection_examples.setdefault(code, [])
        if len(examples) < EXAMPLES:
            examples.append({"id": record.get("id"), "line": record.get("line"),
                             "reason": _clip(reason)})

    def _worker(self, record: dict[str, Any], **counts: int) -> None:
        name = str(record.get("worker") or "?")
        self.workers.setdefault(name, Counter()).update(counts)

    def _at(self, record: dict[str, Any], tokens: int) -> None:
        at = record.get("finished_at")
        # An answer reused from the estimate came back during the estimate, not this run:
        # the run's throughput over time is of what it generated.
        if isinstance(at, int | float) and not record.get("reused"):
            second = int(at)
            self.rows_at[second] += 1
            self.tokens_at[second] += tokens


def _clip(text: str, chars: int = EXAMPLE_CHARS) -> str:
    return text if len(text) <= chars else text[:chars - 1] + "…"


def _sample(record: dict[str, Any]) -> dict[str, Any]:
    reasoning = record.get("reasoning")
    return {"id": record.get("id"), "line": record.get("line"),
            "prompt": _clip(_prompt_text(record), SAMPLE_CHARS),
            "reasoning": _clip(reasoning, SAMPLE_CHARS) if isinstance(reasoning, str) else None,
            "completion": _clip(str(record.get("completion") or ""), SAMPLE_CHARS),
            "finish_reason": record.get("finish_reason"),
            "completion_tokens": record.get("completion_tokens")}


def _prompt_text(record: dict[str, Any]) -> str:
    """What the answer answers: the raw prompt, or the last user turn of the conversation
    carried through from the input row."""
    if isinstance(record.get("prompt"), str):
        return str(record["prompt"])
    for name in ("messages", "conversations"):
        turns = record.get(name)
        if not isinstance(turns, list):
            continue
        for turn in reversed(turns):
            if isinstance(turn, dict) and (turn.get("role") or turn.get("from")) in (
                    "user", "human"):
                content = turn.get("content", turn.get("value"))
                if isinstance(content, list):
                    content = " ".join(str(p.get("text", "")) for p in content
                                       if isinstance(p, dict))
                return str(content or "")
    return ""


# -- reading the directory -------------------------------------------------------------------
@dataclass(frozen=True)
class Read:
    scan: Scan
    run: str
    summary: dict[str, Any] | None
    torn: dict[str, int]  # file -> bytes of a torn tail, not read
    bytes_read: int


def read_dir(path: Path, progress: Callable[[int], None] = lambda n: None,
             group_by: str | None = None) -> Read:
    """Scan the output directory: results first (so a failure they supersede is known), each
    file up to its last whole line as it was when opened (the exporter's reader, so the
    report and an export see the same records). `group_by`: a row field the acceptance is
    broken down by, besides server, thinking, turn and answer length."""
    scan = Scan(acceptance=AcceptanceScan(group_by=group_by))
    total = 0
    adders = {KIND_RESULT: scan.add_result, KIND_FAILURE: scan.add_failure,
              KIND_REJECTED: scan.add_rejected, KIND_HOLDOUT: scan.add_holdout}
    with DrainedRun(path, progress) as source:
        for kind in (KIND_RESULT, KIND_FAILURE, KIND_REJECTED, KIND_HOLDOUT):
            for record, size in source.records(kind):
                adders[kind](record)
                total += size
        return Read(scan, source.info.run, source.info.summary, dict(source.torn), total)


# -- what the page draws ---------------------------------------------------------------------
def histogram(values: Counter[int], *others: Counter[int], bins: int = HIST_BINS
              ) -> dict[str, Any]:
    """Counts per value binned on one axis shared with `others`: bin starts and one count list
    per counter; the width is a round number, so the axis reads well."""
    top = max((v for c in (values, *others) for v in c), default=0)
    width = _nice(max(top + 1, 1) / bins)
    starts = list(range(0, (top // width + 1) * width, width))

    def binned(counter: Counter[int]) -> list[int]:
        out = [0] * len(starts)
        for value, n in counter.items():
            out[max(value, 0) // width] += n
        return out

    return {"x": starts, "width": width, "y": [binned(c) for c in (values, *others)]}


def _nice(raw: float) -> int:
    """The smallest of 1, 2, 5 × 10^k at or above `raw`."""
    if raw <= 1:
        return 1
    power = 10 ** math.floor(math.log10(raw))
    return next(int(m * power) for m in (1, 2, 5, 10) if m * power >= raw)


def throughput(rows_at: Counter[int], tokens_at: Counter[int]) -> dict[str, Any] | None:
    """Rows/s and output tokens/s over the run, in at most TIME_POINTS buckets."""
    if not rows_at:
        return None
    first, last = min(rows_at), max(rows_at)
    width = max(1, math.ceil((last - first + 1) / TIME_POINTS))
    starts = list(range(first, last + 1, width))
    rows, tokens = [0] * len(starts), [0] * len(starts)
    for second, n in rows_at.items():
        rows[(second - first) // width] += n
        tokens[(second - first) // width] += tokens_at[second]
    return {"x": starts, "width_s": width, "rows": rows,
            "rows_per_s": [round(n / width, 3) for n in rows],
            "tokens_per_s": [round(n / width, 1) for n in tokens]}


def figures(scan: Scan, summary: dict[str, Any] | None) -> dict[str, int]:
    written = sum(scan.counts[kind] for kind in ("done", "failed", "rejected", "holdout"))
    total = int((summary or {}).get("total") or 0) or written
    return {"total": total, **{name: scan.counts[name] for name in FIGURES[1:]}}


def page_data(read: Read) -> dict[str, Any]:
    """Everything the report page shows, as plain JSON."""
    scan, summary = read.scan, read.summary or {}
    shown = figures(scan, read.summary)
    settings = summary.get("settings") or {}
    answers = shown["done"] + shown["failed"]
    return {
        "kind": "report",
        "run": read.run,
        "figures": shown,
        "holdout_rows": scan.counts["holdout_rows"],
        "summary": {name: summary.get(name) for name in FIGURES} if read.summary else None,
        "mismatch": [name for name in FIGURES
                     if read.summary is not None and summary.get(name) != shown[name]],
        "complete": bool(summary.get("complete")),
        "stopped": summary.get("stopped"),
        "torn": read.torn,
        "superseded": scan.superseded,
        "timing": {name: summary.get(name) for name in (
            "started_at", "finished_at", "wall_s", "rows_per_s", "completion_tokens_per_s")},
        "shares": {name: round(shown[name] / shown["done"], 4) if shown["done"] else 0.0
                   for name in ("truncated", "reasoning_unfinished", "empty", "json_invalid")}
        | {"failed": round(shown["failed"] / answers, 4) if answers else 0.0},
        "settings": settings,
        "cap": settings.get("max_output_tokens"),
        "context": settings.get("context_length"),
        "max_tokens_median": _median(scan.max_tokens),
        "completion": histogram(scan.completion, scan.completion_cut),
        "reasoning": histogram(scan.reasoning) if scan.reasoning else None,
        "reasoning_share": _share_bins(scan.reasoning_share) if scan.reasoning_share else None,
        "prompt": histogram(scan.prompt_sent, scan.prompt_rejected),
        "prompt_rejected_without_length": shown["rejected"] - sum(scan.prompt_rejected.values()),
        "finish": dict(scan.finish.most_common()),
        "workers": [{"name": name, **{k: c[k] for k in (
                        "done", "failed", "completion_tokens", "prompt_tokens")}}
                    for name, c in sorted(scan.workers.items())],
        "throughput": throughput(scan.rows_at, scan.tokens_at),
        "failures": [{"type": kind, "count": sum(by_status.values()),
                      "status": dict(by_status.most_common()),
                      "examples": scan.failure_examples[kind]}
                     for kind, by_status in sorted(scan.failures.items(),
                                                   key=lambda kv: -sum(kv[1].values()))],
        "rejections": [{"reason": code, "count": n, "examples": scan.rejection_examples[code]}
                       for code, n in scan.rejections.most_common()],
        "samples": scan.samples,
        "spec": scan.acceptance.figures(),
    }


def _share_bins(shares: Counter[int]) -> dict[str, Any]:
    """Percent of each answer's tokens that are reasoning, in 5-point bins (100 its own)."""
    starts = list(range(0, 105, 5))
    counts = [0] * len(starts)
    for percent, n in shares.items():
        counts[min(percent // 5, len(starts) - 1)] += n
    return {"x": starts, "width": 5, "y": [counts]}


def _median(counter: Counter[int]) -> int | None:
    total = sum(counter.values())
    seen = 0
    for value in sorted(counter):
        seen += counter[value]
        if 2 * seen >= total:
            return value
    return None


# -- the file --------------------------------------------------------------------------------
REPORT_NAME = "report.html"
WEAK_NAME = "weak.jsonl"


@dataclass(frozen=True)
class Built:
    out: Path
    size: int  # bytes of the HTML file
    read: Read
    data: dict[str, Any]
    weak: Path | None = None  # weak.jsonl, where the answers carried their acceptance


def build(path: Path, out: Path | None = None,
          progress: Callable[[int], None] = lambda n: None,
          group_by: str | None = None) -> Built:
    """Read `path` and write its report (default `path/report.html`) whole or not at all, as
    an export is written (a temporary name, fsync, rename); weak.jsonl beside it when the
    answers carry their speculative acceptance."""
    from fleetgen.monitor.page import render

    read = read_dir(path, progress, group_by)
    data = page_data(read)
    target = out or path / REPORT_NAME
    refuse_drainer_files(path, target)
    page = render(f"fleetgen report: {read.run}", data).encode()
    with atomic_file(target) as f:
        f.write(page)
    weak = write_weak(read.scan.acceptance, target.parent / WEAK_NAME)
    return Built(target, len(page), read, data, weak)


def write_weak(acceptance: AcceptanceScan, target: Path) -> Path | None:
    """The lowest-acceptance rows as input rows `fleetgen run` reads (their ids kept), beside
    the report, written whole or not at all; None (and no file) when no answer carried spec."""
    rows = acceptance.lowest_rows()
    if not rows:
        return None
    with atomic_file(target) as f:
        for record in rows:
            f.write(orjson.dumps(weak_row(record)) + b"\n")
    return target
