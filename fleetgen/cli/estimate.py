"""`fleetgen estimate`: the run known before it starts. Every prompt is rendered, tokenized and
budgeted as the producer would (the rejections and the prompt lengths exact), a sample
stratified by prompt length is generated on the given servers by a real `fleetgen run` into a
scratch directory under --out, and its answers are projected onto the whole input
(fleetgen/monitor/projection.py): output tokens, the share each cap would cut, wall time,
GPU-hours, output size, each with how far off it may be.

Tokenizes every prompt as `fleetgen run` does (the rejections and prompt lengths are exact),
generates a sample stratified by prompt length on the servers (a real `fleetgen run` into
--out/.fleetgen-estimate, uncapped), and projects the whole input: output tokens, the share of
answers each --cap would cut, wall time, GPU-hours and output size, with 95% intervals. A table
here, estimate.json in --out.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from array import array
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from fleetgen import exitcodes
from fleetgen.cli import run as run_command
from fleetgen.cli.flags import subcommand
from fleetgen.cli.produce import add_producer_options, settings_from
from fleetgen.cli.progress import Bar
from fleetgen.errors import ConfigError
from fleetgen.monitor.projection import BYTES_PER_ID, DIGEST_BYTES, Answer, Fleet, project
from fleetgen.queue.contract import KIND_FAILURE, KIND_RESULT
from fleetgen.records.outcomes import ids_digest
from fleetgen.records.outdir import OutputDir, atomic_file, usable_dir
from fleetgen.settings import runoptions
from producer import reuse

if TYPE_CHECKING:
    from producer.inputs import Inputs

DEFAULT_SAMPLE = 500
DEFAULT_CAPS = (2048, 4096, 8192)
STRATA = 10  # prompt-length strata (fewer for a small sample: at least MIN_PER_STRATUM each)
MIN_PER_STRATUM = 20
# `run`'s options the estimate refuses (check_args): hidden from its --help.
REFUSED = ("max_output_tokens", "holdout", "turns")
# Under --out: the sample and its run, one per sample drawn (`fleetgen run` finds them there).
SCRATCH = reuse.SCRATCH
ESTIMATE = "estimate.json"


def add_parser(sub: Any) -> None:
    p = subcommand(sub, "estimate", "what a run will cost, from a sample generated on your servers",
                   __doc__, estimate)
    p.add_argument("input", type=Path, metavar="INPUT", help="prompts, as `fleetgen run` reads")
    # The servers and how the sample's run reaches them, as `fleetgen run` takes them.
    run_command.add_fleet_options(p, "a Redis of your own for the sample's run (default: "
                                  "$FLEETGEN_REDIS_URL, else an embedded Valkey)")
    p.add_argument("--out", type=Path, default=Path("."), metavar="DIR",
                   help="where estimate.json and the sample's run go (the working directory)")
    p.add_argument("--sample", type=int, default=DEFAULT_SAMPLE, metavar="N",
                   help="input rows (prompts) to sample: each is --n requests (%(default)s)")
    p.add_argument("--sample-seed", type=int, default=0, metavar="S",
                   help="the sample's seed: the same seed draws the same rows (%(default)s)")
    p.add_argument("--cap", type=int, action="append", metavar="N",
                   help="a --max-output-tokens to show the cut share of (repeatable; default "
                   "2048, 4096, 8192)")
    p.add_argument("--gpus-per-engine", type=int, default=1, metavar="N",
                   help="GPUs behind each server, for GPU-hours (tensor parallel) (1)")
    add_producer_options(p, runoptions.RUN)
    for action in p._actions:  # run's options the estimate refuses (check_args): not offered
        if action.dest in REFUSED:
            action.help = argparse.SUPPRESS
    # What `run` reads that the estimate's sample does not use.
    # The sample's run reuses no earlier answers: its timings are what the projection reads.
    p.set_defaults(run=None, listen=None, measure_acceptance=False,
                   group_by=None, retry_failures=False, reuse_estimate="none")


@dataclass
class Survey:
    """Every row of the input as the producer would see it: the accepted ones' lines, prompt
    lengths and requests (samples), the rejections by reason."""

    rows: int = 0
    lines: array[int] = field(default_factory=lambda: array("q"))
    prompt_tokens: array[int] = field(default_factory=lambda: array("l"))
    requests: array[int] = field(default_factory=lambda: array("l"))
    rejected: Counter[str] = field(default_factory=Counter)
    # Each accepted row's prompt ids, as their digest: what `fleetgen run` checks before it
    # reuses the row's answer (producer/reuse.py).
    digests: list[str] = field(default_factory=list)


def estimate(args: argparse.Namespace) -> int:
    from producer.build import read_servers, resolve_limits
    from producer.inputs import resolve_input
    from producer.tokenizer import load_tokenizer

    # Once: InputError (one line) for a missing file or an empty glob; the survey reads it.
    inputs = resolve_input(args.input)
    check_args(args)
    from fleetgen.engine import engine_urls

    urls = engine_urls(args.engine_url)
    usable_dir(args.out)
    values = {**vars(args), "run": "estimate", "engine_url": urls, "context_length": None,
              "batch_size": args.batch_size or 512}
    settings = settings_from(argparse.Namespace(**values), None)  # no Redis: no run here
    limits = resolve_limits(settings)
    tokenizer = load_tokenizer(settings.tokenizer,
                               chat_template_kwargs=settings.chat_template_kwargs)
    survey = survey_input(settings, inputs, tokenizer, limits)
    if not survey.lines:
        raise ConfigError(f"{args.input}: no row fits the servers' budget "
                          f"({sum(survey.rejected.values())} rejected); nothing to estimate")
    chosen, sizes = draw(survey, args.sample, args.sample_seed)
    own_caps: list[int] = []
    line_of: dict[str, int] = {}
    sample_path, stratum_of = write_sample(args, settings.input, chosen, own_caps, line_of)
    run_out = sample_path.parent / reuse.RUN
    protocol, servers = read_servers(settings)
    keep_provenance(run_out, reuse.identity(protocol.name, servers), survey, line_of)
    generate_sample(args, urls, sample_path, run_out, sample_words(len(chosen),
                                                                   len(survey.lines)))
    answers, failed = read_answers(run_out, stratum_of)
    fleet = Fleet(len(urls), args.gpus_per_engine, fleet_slots(servers))
    result = project(answers, sizes, caps_for(args.cap, limits.context_length), fleet, failed)
    result = {"input": input_part(survey, args), "sample": {
        "requests": len(chosen), "answered": len(answers), "failed": failed,
        "whole_input": len(chosen) >= len(survey.lines), "own_caps": len(own_caps),
        "strata": len(sizes), "seed": args.sample_seed, "run": str(run_out)}, **result}
    with atomic_file(args.out / ESTIMATE) as f:
        f.write(orjson.dumps(result, option=orjson.OPT_INDENT_2) + b"\n")
    print(table(result))
    if own_caps:
        say(own_caps_note(own_caps, len(chosen)))
    say(f"written to {args.out / ESTIMATE}")
    say(reuse_note(len(answers), args.out))
    return exitcodes.OK


def say(text: str) -> None:
    print(f"fleetgen estimate: {text}", flush=True)


def generate_sample(args: argparse.Namespace, urls: list[str], sample_path: Path,
                    run_out: Path, what: str) -> None:
    """The sample's `fleetgen run`, unless a complete one is there: the same estimate again
    reads its answers, where it started Valkey and a worker a server to generate nothing."""
    if sample_done(run_out):
        say(f"the sample's run in {run_out} is complete: its answers are read again, nothing "
            "is generated")
        return
    say(f"generating {what} on {len(urls)} server(s) (`fleetgen run` into {run_out})")
    # The sample's run as the user would type it (what its messages quote to go on with).
    argv = ["run", str(sample_path), *(a for u in urls for a in ("--engine-url", u)),
            "--out", str(run_out)]
    hint = f"run the same `fleetgen estimate` command (same --out {args.out}) to resume it"
    code = run_command.run(argparse.Namespace(**{**vars(args), "input": sample_path,
                                                 "out": run_out, "argv": argv,
                                                 "resume_hint": hint}))
    if code != exitcodes.OK:
        raise ConfigError(f"the sample's run into {run_out} did not complete; see its "
                          "failures.jsonl, then run `fleetgen estimate` again (it resumes)")


def own_caps_note(caps: list[int], rows: int) -> str:
    """The rows' own max_tokens cut their answers in any run, whatever --max-output-tokens:
    a Batch file's `max_tokens: 200` made every cap's row read the same share, unexplained."""
    return (f"{len(caps):,} of the {rows:,} sampled rows carry their own max_tokens (from "
            f"{min(caps):,} to {max(caps):,}): their answers stop there in any run, so every "
            "cap's cut share counts them, whatever --max-output-tokens")


def reuse_note(answered: int, out: Path) -> str:
    """What `fleetgen run` does with the sample's answers: said, not left to be found."""
    where = "" if out.resolve() == Path.cwd() else f" (from another directory: " \
        f"--reuse-estimate {out})"
    return (f"`fleetgen run` on this input writes the sample's {answered:,} answers as its "
            "own, without sending their rows, where its settings leave them valid (the same "
            "template, sampling and --n, servers of the same model, an answer within its "
            f"--max-output-tokens){where}; it says what it reused, or why not")


def keep_provenance(run_out: Path, servers: dict[str, Any], survey: Survey,
                    line_of: dict[str, int]) -> None:
    """Beside the sample, once, before its run: the servers that generate its answers and its
    rows' prompt digests, which `fleetgen run` checks before it reuses them. Not written for a
    sample run already there without it (an older fleetgen's): its servers are unknown."""
    path = run_out.parent / reuse.PROVENANCE
    if path.exists() or run_out.exists():
        return
    digest_of = dict(zip(survey.lines, survey.digests, strict=True))
    prompts = {row_id: digest_of[line] for row_id, line in line_of.items()}
    reuse.write_provenance(run_out.parent, servers, prompts)


def sample_done(run_out: Path) -> bool:
    """Whether the sample's run finished with every request answered (its summary.json)."""
    try:
        summary = OutputDir(run_out).read_summary() if run_out.is_dir() else None
    except (OSError, ValueError):
        return False
    return bool(summary and summary.get("complete") and not summary.get("failed"))


def check_args(args: argparse.Namespace) -> None:
    if args.sample < 1:
        raise ConfigError(f"--sample must be at least 1, got {args.sample}")
    if args.max_output_tokens is not None:
        raise ConfigError("fleetgen estimate generates the sample uncapped, to choose the "
                          "cap: drop --max-output-tokens (--cap N adds a cap to the table)")
    if args.holdout:
        raise ConfigError("fleetgen estimate projects every row of the input; drop --holdout "
                          "(a run with --holdout F costs about (1 - F) of the estimate)")
    if args.turns == "all":
        raise ConfigError("fleetgen estimate projects --turns last runs; drop --turns all")
    if any(c < 1 for c in args.cap or ()):
        raise ConfigError("--cap must be at least 1")


def survey_input(settings: Any, inputs: Inputs, tokenizer: Any, limits: Any) -> Survey:
    """Every row rendered, tokenized and budgeted in batches, as the producer does (3,600
    prompts/s on one core: 3 minutes for 654,676, against a run of hours; exact, where a
    projection from the sample would carry its error into the rejections)."""
    from producer.dedup import SeenIds
    from producer.inputpass import add_to_batch
    from producer.prompts import Prompts
    from producer.request import Request, RequestOptions
    from producer.rows import Row, read_rows
    from producer.runner import projected_rows

    prompts = Prompts(tokenizer, limits, RequestOptions(settings, tokenizer, limits))
    # The bar's total is projected from the bytes read, as the producer's: counting the rows
    # first would be a whole extra pass over the input.
    size = inputs.size_bytes()
    survey, seen = Survey(), SeenIds()
    bar = Bar("prompts tokenized", show=sys.stderr.isatty())
    batch, samples = prompts.batch(), {}
    for item in read_rows(inputs):
        survey.rows += 1
        duplicate = not seen.add(hash(item.id))
        if isinstance(item, Row) and not duplicate:
            samples[item.line] = item.n or settings.n
        # As the producer's pass adds a row (one request: the projection multiplies by n).
        add_to_batch(batch, item, [Request(item.line, None, item.line)], duplicate)
        if survey.rows % settings.batch_size == 0:
            _tally(survey, batch, samples)
            batch, samples = prompts.batch(), {}
            bar.advance_to(survey.rows, projected_rows(survey.rows, inputs.meter.bytes_read,
                                                       size))
    _tally(survey, batch, samples)
    bar.close()
    return survey


def _tally(survey: Survey, batch: Any, samples: dict[int, int]) -> None:
    for payload in batch.payloads():
        survey.lines.append(payload["line"])
        survey.prompt_tokens.append(len(payload["input_ids"]))
        survey.requests.append(samples[payload["line"]])
        survey.digests.append(ids_digest(payload["input_ids"]))
    for record in batch.rejections:
        survey.rejected[str(record["reason"]).split(":", 1)[0]] += 1


def draw(survey: Survey, n: int, seed: int) -> tuple[dict[int, int], list[int]]:
    """The sample: the accepted rows in equal-count strata of prompt length, each sampled in
    proportion to its size (seeded). Returns each chosen line's stratum, and the requests
    (rows x samples) each stratum stands for."""
    order = sorted(range(len(survey.lines)), key=lambda i: survey.prompt_tokens[i])
    count = max(1, min(STRATA, n // MIN_PER_STRATUM, len(order)))
    rng = random.Random(seed)
    chosen: dict[int, int] = {}
    sizes: list[int] = []
    for h in range(count):
        members = order[h * len(order) // count:(h + 1) * len(order) // count]
        take = min(len(members), round(n * len(members) / len(order)))
        chosen.update((survey.lines[i], h) for i in rng.sample(members, max(take, 1)))
        sizes.append(sum(survey.requests[i] for i in members))
    return chosen, sizes


def write_sample(args: argparse.Namespace, source: Path, chosen: dict[int, int],
                 own_caps: list[int] | None = None, line_of: dict[str, int] | None = None
                 ) -> tuple[Path, dict[str, int]]:
    """The sampled rows as they were (their ids written out), in a directory named by their
    bytes and the settings: the same sample is the same run, resumed; another is a new one.
    Returns the sample's path and each sampled id's stratum (what its answer is filed by);
    `own_caps` gets the sampled rows' own max_tokens (a Batch body's, a `sampling` one's),
    `line_of` each sampled id's line in the input."""
    from producer.rows import Row, read_rows

    stratum_of: dict[str, int] = {}
    body = bytearray()
    for item in read_rows(source):
        if item.line in chosen and isinstance(item, Row):
            body += orjson.dumps({"id": item.id, **item.fields}) + b"\n"
            stratum_of[item.id] = chosen[item.line]
            if line_of is not None:
                line_of[item.id] = item.line
            if own_caps is not None and item.max_tokens is not None:
                own_caps.append(item.max_tokens)
    pinned = {o.attr: getattr(args, o.attr, None) for o in runoptions.TABLE
              if o.kept.pinned and o.flags}
    key = hashlib.blake2b(bytes(body) + json.dumps(pinned, sort_keys=True, default=str)
                          .encode(), digest_size=6).hexdigest()
    path = args.out / SCRATCH / key / "sample.jsonl"
    if not path.exists():
        with atomic_file(path) as f:
            f.write(bytes(body))
    return path, stratum_of


def read_answers(out: Path, stratum_of: dict[str, int]) -> tuple[list[Answer], int]:
    """The sample's answers from its result lines, and how many requests failed."""
    outdir = OutputDir(out)
    answers = []
    for raw in outdir.file(KIND_RESULT).read_bytes().splitlines():
        r = orjson.loads(raw)
        ids = r.get("output_ids")
        ids_bytes = (len(orjson.dumps(ids)) + DIGEST_BYTES - 2 if ids is not None
                     else BYTES_PER_ID * int(r["completion_tokens"]) + DIGEST_BYTES)
        line_bytes = len(raw) + 1 - (ids_bytes if ids is not None else 0)
        latency = float(r.get("latency_s") or 0.0)
        finished = float(r.get("finished_at") or 0.0)
        answers.append(Answer(stratum_of[str(r["id"])], int(r["completion_tokens"]),
                              r.get("finish_reason") == "length", line_bytes, ids_bytes,
                              latency, finished - latency, finished))
    failures = outdir.file(KIND_FAILURE)
    failed = failures.read_bytes().count(b"\n") if failures.exists() else 0
    return answers, failed


def fleet_slots(servers: dict[str, Any]) -> int | None:
    """The requests all the servers run at once, as they report it; None if one does not."""
    slots = [limits.max_running_requests for limits in servers.values()]
    return None if any(s is None for s in slots) else sum(s for s in slots if s is not None)


def input_part(survey: Survey, args: argparse.Namespace) -> dict[str, Any]:
    lengths = sorted(survey.prompt_tokens)

    def at(q: float) -> int:
        return lengths[min(len(lengths) - 1, int(q * len(lengths)))]

    return {"path": str(args.input), "rows": survey.rows, "accepted": len(lengths),
            "requests": sum(survey.requests), "rejected": sum(survey.rejected.values()),
            "rejected_by_reason": dict(survey.rejected.most_common()),
            "prompt_tokens": {"mean": round(sum(lengths) / len(lengths), 1), "p50": at(0.5),
                              "p90": at(0.9), "p99": at(0.99), "max": lengths[-1]}}


def sample_words(chosen: int, usable: int) -> str:
    """What the sample is: a sample, or the whole input (then the figures are no sample's:
    only the answers' own randomness is left in them)."""
    if chosen >= usable:
        return f"all {usable:,} usable rows (the sample is the whole input)"
    return f"{chosen:,} sampled rows of {usable:,}"


def caps_for(given: list[int] | None, context_length: int) -> list[int]:
    """The caps of the table: the user's, else the defaults up to the context (a cap above it
    cuts what the budget, the `none` row, cuts: 8192 on a 4,096 context says nothing)."""
    return sorted(set(given or [c for c in DEFAULT_CAPS if c <= context_length]))


def duration(hours: float | None) -> str:
    """A time for a person: 15 s, 4.2 min, 3.4 h, 1,250 h (not 0.004206)."""
    if hours is None:
        return "-"
    seconds = hours * 3600
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{hours:,.1f} h" if hours < 100 else f"{hours:,.0f} h"


def size(nbytes: float) -> str:
    """Bytes for a person: 640 B, 12.5 KB, 3.4 MB, 7.1 GB (not 0.00 GB)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:,.1f} {unit}"
    return f"{nbytes:.0f} B"


def table(e: dict[str, Any]) -> str:
    """The estimate on the terminal: the input, then one line per cap."""
    o, i, f = e["output_tokens"], e["input"], e["fleet"]
    bound = "" if f["saturated"] else "; never all: wall time a lower bound"
    lo, hi = o["mean_ci95"]
    head = [
        ("rows", f"{i['rows']:,} ({i['rejected']:,} rejected: "
                 f"{', '.join(f'{k} {v:,}' for k, v in i['rejected_by_reason'].items()) or '-'})"),
        ("prompt tokens", f"mean {i['prompt_tokens']['mean']:,.0f}, p99 "
                          f"{i['prompt_tokens']['p99']:,}, max {i['prompt_tokens']['max']:,}"),
        ("sample", f"{e['sample']['answered']} answers ({e['sample']['failed']} failed) in "
                   f"{e['sample']['strata']} prompt-length strata"),
        ("output tokens", f"mean {o['mean']:,.0f} (95% {lo:,.0f}-{hi:,.0f}), p50 {o['p50']:,}, "
                          f"p90 {o['p90']:,}, p99 {o['p99']:,}, max seen {o['max']:,}"),
        ("fleet", f"{f['gpus']} GPU(s), {f['tokens_per_s']:,.0f} tokens/s when full "
                  f"({f['slots'] or '?'} slots; the sample kept {f['sample_concurrency']} "
                  f"busy on average{bound})"),
        ("output size", f"{size(e['output_bytes']['without_token_ids'])}, "
                        f"{size(e['output_bytes']['with_token_ids'])} with --token-ids"),
    ]
    width = max(len(k) for k, _ in head)
    lines = [f"  {k:<{width}}  {v}" for k, v in head]
    lines.append(f"\n  {'--max-output-tokens':<20} {'cut':>7} {'95%':>15} {'mean out':>9} "
                 f"{'tokens':>14} {'wall time':>9} {'GPU time':>9}")
    for cap, row in e["by_cap"].items():
        low, high = row["cut_share_ci95"]
        lines.append(f"  {cap if cap != 'none' else 'none (the budget)':<20} "
                     f"{row['cut_share']:>7.1%} {f'{low:.1%}-{high:.1%}':>15} "
                     f"{row['output_tokens_mean']:>9,.0f} {row['output_tokens_total']:>14,} "
                     f"{duration(row['wall_h']):>9} {duration(row['gpu_hours']):>9}")
    return "\n".join(lines)
