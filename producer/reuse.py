"""Answers made before this run that it writes as its own instead of sending their rows again:
the sample of `fleetgen estimate` (docs/plan.md "The run reuses the estimate's answers").

An earlier answer stands for this run's request only if this run would have sent the same
request to the same model: the estimate's settings that shape a request or its answer equal
this run's (`MUST_MATCH`), its servers ran the same model on the same engine and protocol,
and, row by row, the same row fields, the same prompt ids and a budget that holds the answer
(`why_not`). The rest are sent as usual. Reused answers go through the run's stream like every
outcome (producer/enqueue.py `reuse`): the drainer stays the one writer of the files."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from fleetgen.engine import ServerLimits
from fleetgen.queue.contract import KIND_RESULT, TaskPayload
from fleetgen.records.outcomes import ids_digest, reused_record, split_result
from fleetgen.records.outdir import OutputDir, atomic_file
from fleetgen.settings.runoptions import flag_name
from producer.manifest import shown

# Under an estimate's --out: one directory per sample drawn (fleetgen/cli/estimate.py), each
# with its sample, its run (`RUN`) and what the run reuses it against (`PROVENANCE`).
SCRATCH = ".fleetgen-estimate"
RUN = "run"
PROVENANCE = "reuse.json"

# The settings an earlier answer must have been made with (the sample run's summary.json
# against this run's): the template and tokenizer make the prompt, the sampling, --n (each
# sample's seed) and the turn mode make the answer, and the rest make what its result line
# holds (the reasoning split, logprobs, token ids, the schema's verdict). The budget's settings
# (the cap, the context, the margin) are not here: each row's own budget is checked instead.
MUST_MATCH = ("tokenizer", "chat_template_kwargs", "sampling", "n", "turns", "reasoning",
              "logprobs", "token_ids", "json_schema")

Key = tuple[str, int | None]  # a request: the row's id, its sample (None: one sample)


def identity(protocol: str, servers: Mapping[str, ServerLimits]) -> dict[str, Any]:
    """The model the servers run, as far as they say: what an answer is only valid for."""
    return {"protocol": protocol,
            "engines": sorted({s.engine for s in servers.values()}),
            "models": sorted({s.model or "?" for s in servers.values()})}


def write_provenance(directory: Path, servers: dict[str, Any], prompts: dict[str, str]) -> None:
    """What a sample's answers are reused against: the servers that generate them and each
    sampled row's prompt ids (their digest), as the estimate rendered them."""
    with atomic_file(directory / PROVENANCE) as f:
        f.write(orjson.dumps({"servers": servers, "prompts": prompts}))


def why_not(earlier: Mapping[str, Any], digest: str | None, payload: TaskPayload) -> str | None:
    """Why an earlier answer of this request's row and sample is not this request's answer;
    None when it is. The prompt must be the same ids; the answer must be the one this budget
    would have given: one that stopped by itself within it, or one cut at exactly it."""
    if split_result(earlier).row != payload["row"]:
        return "the row changed"
    if digest != ids_digest(payload["input_ids"]):
        return "the prompt renders to other ids"
    budget, tokens = payload["max_tokens"], int(earlier["completion_tokens"])
    if earlier.get("finish_reason") == "length":
        cut_at = int(earlier["max_tokens"])
        if cut_at < budget:  # it would have gone on here: its end is unknown
            return "cut by a smaller budget than this run's"
        if cut_at > budget:
            return "longer than this run's budget"
    elif tokens > budget:
        return "longer than this run's budget"
    return None


@dataclass
class Source:
    """One estimate sample's answers, by request, with the prompt digests it was sent with."""

    where: Path  # the sample run's output directory
    answers: dict[Key, dict[str, Any]]
    prompts: dict[str, str]

    @classmethod
    def read(cls, where: Path, prompts: dict[str, str]) -> Source:
        answers: dict[Key, dict[str, Any]] = {}
        results = OutputDir(where).file(KIND_RESULT)
        for raw in results.read_bytes().splitlines() if results.exists() else ():
            record = orjson.loads(raw)
            answers[(str(record["id"]), record.get("sample"))] = record
        return cls(where, answers, prompts)


@dataclass
class EarlierAnswers:
    """The earlier answers this run may write: `split` takes a batch's payloads apart into
    those still to send and the result lines that answer the others."""

    sources: list[Source]
    taken: int = 0  # this process's: a resume's earlier ones are in the files (`reused`)
    declined: Counter[str] = field(default_factory=Counter)

    @property
    def answers(self) -> int:
        return sum(len(s.answers) for s in self.sources)

    def split(self, payloads: list[TaskPayload]) -> tuple[list[TaskPayload],
                                                           list[dict[str, Any]]]:
        send: list[TaskPayload] = []
        reused: list[dict[str, Any]] = []
        for payload in payloads:
            record = self._answer(payload)
            if record is None:
                send.append(payload)
            else:
                reused.append(record)
        self.taken += len(reused)
        return send, reused

    def _answer(self, payload: TaskPayload) -> dict[str, Any] | None:
        key = (payload["id"], payload.get("sample"))
        reasons = []
        for source in self.sources:
            earlier = source.answers.get(key)
            if earlier is None:
                continue
            reason = why_not(earlier, source.prompts.get(payload["id"]), payload)
            if reason is None:
                return reused_record(payload, earlier, str(source.where))
            reasons.append(reason)
        if reasons:
            self.declined[reasons[0]] += 1
        return None

    def declined_words(self) -> str:
        return ", ".join(f"{n} {why}" for why, n in self.declined.most_common())


@dataclass
class Found:
    """What a look for earlier answers found: the answers (None: nothing to reuse), and the
    lines that say what is reused from where, or why not."""

    reuse: EarlierAnswers | None
    notes: list[str]


@dataclass
class Candidates:
    """The samples whose settings match this run's (`candidates`), before their servers are
    compared with the run's (`served_by`): the servers are asked only if there are some."""

    samples: list[tuple[Path, dict[str, Any]]]  # each sample and its reuse.json
    notes: list[str]

    def served_by(self, servers: dict[str, Any] | None) -> Found:
        """The answers of the samples whose servers ran the model this run's run
        (`identity`), read."""
        sources, notes = [], list(self.notes)
        for sample, provenance in self.samples:
            where = sample / RUN
            then = provenance.get("servers")
            if then != servers:
                notes.append(f"the estimate's answers in {where} are not reused: they came "
                             f"from {_model(then)}, this run's servers run {_model(servers)}")
                continue
            source = Source.read(where, dict(provenance.get("prompts") or {}))
            if source.answers:
                sources.append(source)
                notes.append(f"{len(source.answers):,} answers of the estimate in {where} are "
                             "reused for the rows this run sends with the same prompt, within "
                             "their budget (not sent again)")
        return Found(EarlierAnswers(sources) if sources else None, notes)


def samples_in(directories: Iterable[Path]) -> list[Path]:
    """Every estimate sample under these directories (each an estimate's --out), newest first:
    a later estimate's answer to a request comes before an earlier one's."""
    seen: set[Path] = set()
    found = []
    for directory in directories:
        for sample in (directory / SCRATCH).glob("*"):
            if sample.resolve() not in seen and (sample / RUN).is_dir():
                seen.add(sample.resolve())
                found.append(sample)
    return sorted(found, key=lambda p: (p / RUN).stat().st_mtime, reverse=True)


def candidates(samples: list[Path], settings: Mapping[str, Any]) -> Candidates:
    """The samples made with this run's (its manifest `settings`) settings of MUST_MATCH."""
    kept, notes = [], []
    for sample in samples:
        why, provenance = _refusal(sample, settings)
        if why is None:
            kept.append((sample, provenance))
        else:
            notes.append(f"the estimate's answers in {sample / RUN} are not reused: {why}")
    return Candidates(kept, notes)


def _refusal(sample: Path, settings: Mapping[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """Why a sample's answers cannot stand for this run's (None: they may, if its servers ran
    the same model, row by row), and its reuse.json."""
    summary, provenance = None, None
    try:
        summary = OutputDir(sample / RUN).read_summary()
        provenance = orjson.loads((sample / PROVENANCE).read_bytes())
    except FileNotFoundError:
        pass  # said below, as a missing summary is
    except orjson.JSONDecodeError:
        return "its summary.json or reuse.json is damaged", {}
    if summary is None or not isinstance(provenance, dict):
        return ("it does not say how they were made (no summary.json or reuse.json: an "
                "estimate from an older fleetgen, or one stopped before its start)"), {}
    differs = settings_difference(summary.get("settings") or {}, settings)
    return differs, provenance


def settings_difference(then: Mapping[str, Any], now: Mapping[str, Any]) -> str | None:
    """The first setting of MUST_MATCH that differs, in words; None if none does."""
    for name in MUST_MATCH:
        if then.get(name) != now.get(name):
            return (f"the estimate ran with {flag_name(name)} {shown(then.get(name))}, this "
                    f"run with {shown(now.get(name))}")
    return None


def _model(servers: Any) -> str:
    if not isinstance(servers, dict):
        return "servers it did not record"
    models = ", ".join(servers.get("models") or ["?"])
    engines = "/".join(servers.get("engines") or ["?"])
    return f"{models} ({engines}, {servers.get('protocol')} protocol)"


__all__ = ["MUST_MATCH", "PROVENANCE", "RUN", "SCRATCH", "Candidates", "EarlierAnswers",
           "Found", "Source", "candidates", "identity", "samples_in", "settings_difference",
           "why_not", "write_provenance"]
