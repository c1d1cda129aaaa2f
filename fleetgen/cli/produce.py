"""`fleetgen produce`: tokenize, budget and enqueue a prompt file as a run."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetgen.base import envvars, exitcodes
from fleetgen.base.contract import Sampling
from fleetgen.base.errors import ConfigError
from fleetgen.base.redisconn import redact, redis_url
from fleetgen.cli.flags import json_object
from fleetgen.cli.progress import Bar
from fleetgen.cli.signals import sigterm_flag
from producer.settings import MAX_LOGPROBS, setting_default

if TYPE_CHECKING:
    from producer.runner import Resume
    from producer.settings import ProducerSettings


def add_parser(sub: Any) -> None:
    p = sub.add_parser("produce", help="enqueue a prompt file as a run (resumable)",
                       description="Read INPUT as a stream, render each row with the chat "
                       "template, tokenize it once, give it an exact max_tokens budget and "
                       "enqueue it; rows that cannot fit are rejected with a reason. Running "
                       "the same command again resumes the run.")
    p.add_argument("input", type=Path, metavar="INPUT",
                   help="prompts: a .jsonl file (or .jsonl.gz, .jsonl.zst), a .parquet file, "
                   "a directory of them, or a quoted glob ('data/**/*.parquet'); rows may be "
                   "OpenAI Batch request lines")
    add_producer_options(p)
    p.set_defaults(handler=run)


def add_producer_options(p: argparse.ArgumentParser, *, demo: bool = False) -> None:
    if not demo:
        p.add_argument("--run", required=True, help="run name (resume with the same name)")
        p.add_argument("--redis", metavar="URL", help="Redis URL (default: $FLEETGEN_REDIS_URL)")
        p.add_argument("--context-length", type=int, metavar="N",
                       help="the servers' context length in tokens")
        p.add_argument("--engine-url", metavar="URL", action="append",
                       help="read the limits from this server (/v1/models, /server_info): "
                       "context, input limit, speculative reserve. Repeat it for every server "
                       "of the fleet: the smallest limits win")
        p.add_argument("--engine-protocol", choices=("sglang", "openai"), metavar="NAME",
                       default=envvars.ENGINE_PROTOCOL.value(),
                       help="sglang (native /generate) or openai (/v1/completions: vLLM, "
                       "llama.cpp); picks the length rule. Default: $FLEETGEN_ENGINE_PROTOCOL, "
                       "else detected from the --engine-url server, else sglang")
        p.add_argument("--reserved-tokens", type=int, default=setting_default("reserved_tokens"),
                       metavar="N",
                       help="tokens the servers count with every input, for --context-length "
                       "without --engine-url: SGLang's speculative reserve, max(eagle_topk x "
                       "num_steps, num_draft_tokens) with EAGLE (%(default)s)")
        p.add_argument("--max-req-input-len", type=int, metavar="N",
                       help="the servers' own input limit (/server_info max_req_input_len), "
                       "for --context-length without --engine-url (default: derived from the "
                       "context)")
        p.add_argument("--no-wait", action="store_true",
                       help="exit once every row is enqueued, instead of waiting until every "
                       "row has an outcome and re-enqueueing rows lost to a Redis crash")
        p.add_argument("--reconcile-interval", type=float, default=30.0, metavar="S",
                       help="seconds between checks for lost rows while waiting (30)")
        p.add_argument("--out", type=Path, metavar="DIR",
                       help="with --turns all: the drainer's output directory (`fleetgen "
                       "drain --out DIR`), where each next turn's history is read from")
    p.add_argument("--turns", choices=("last", "all"), default=setting_default("turns"),
                   help="last: regenerate each conversation's last assistant turn (default); "
                   "all: every assistant turn in order, each from the answers this run wrote "
                   "before it (the input's own answers are discarded); one result per turn")
    p.add_argument("--no-affinity", dest="affinity", action="store_false",
                   help="with --turns all: send each next turn to any server, not preferably "
                   "to the one that answered the turn before and holds its history in cache")
    p.add_argument("--tokenizer", default=setting_default("tokenizer"), metavar="PATH|qwen3.6",
                   help="a local Hugging Face tokenizer directory, or qwen3.6 (built offline; "
                   "default)")
    p.add_argument("--max-output-tokens", type=int, default=setting_default("max_output_tokens"),
                   metavar="N",
                   help="cap on max_tokens (default: whatever the context leaves)")
    p.add_argument("--min-output-tokens", type=int, default=setting_default("min_output_tokens"),
                   metavar="N", help="reject a prompt that leaves fewer output tokens than "
                   "this (%(default)s)")
    p.add_argument("--margin", type=int, default=setting_default("margin"), metavar="N",
                   help="tokens kept free below the context, for a server tokenizer that "
                   "counts more (%(default)s)")
    p.add_argument("--temperature", type=float, metavar="T")
    p.add_argument("--top-p", type=float, metavar="P")
    p.add_argument("--top-k", type=int, metavar="K")
    p.add_argument("--min-p", type=float, metavar="P")
    p.add_argument("--repetition-penalty", type=float, metavar="R")
    p.add_argument("--seed", type=int, metavar="N",
                   help="sampling seed (SGLang's sampling_seed); honoured only by servers "
                   "started with --enable-deterministic-inference")
    p.add_argument("--stop", action="append", metavar="TEXT", help="a stop string (repeatable)")
    p.add_argument("--n", type=int, default=setting_default("n"), metavar="N",
                   help="samples per prompt, each its own request with its own seed; one "
                   "output row per (id, sample) (%(default)s)")
    p.add_argument("--logprobs", type=int, default=setting_default("logprobs"), metavar="K",
                   help="store the top-K log-probabilities of every output token "
                   f"(0..{MAX_LOGPROBS}; %(default)s)")
    p.add_argument("--token-ids", action="store_true",
                   help="keep every answer's generated token ids in its result line "
                   "(`output_ids`, about 7 bytes per token), for `fleetgen export --format "
                   "tokens` (drafter trainers); a server that cannot return them is refused "
                   "at start")
    p.add_argument("--json-schema", type=Path, metavar="FILE",
                   help="a JSON Schema every answer must follow (structured output); the "
                   "drainer counts answers that do not validate")
    p.add_argument("--chat-template-kwargs", metavar="JSON",
                   default=json.dumps(setting_default("chat_template_kwargs")),
                   help='options for the chat template, e.g. \'{"enable_thinking": false}\' '
                   "(the budget counts the template as rendered)")
    p.add_argument("--reasoning", choices=("auto", "split", "off"),
                   default=setting_default("reasoning"),
                   help="split each answer on </think> into `reasoning` and `completion`: "
                   "auto (when </think> is one token of the tokenizer), split, off")
    p.add_argument("--stop-if", action="append", default=list(setting_default("stop_if")),
                   metavar="RULE",
                   help="stop feeding the queue once the first --after answers break RULE, "
                   "e.g. 'truncated>0.2', 'empty>=5%%', 'unfinished>0.1' (reasoning that ran "
                   "out of budget), 'failed>0.05'; what is queued finishes, then exit 1 with "
                   "the reason (repeatable)")
    p.add_argument("--after", type=int, default=setting_default("stop_after"), metavar="N",
                   dest="stop_after",
                   help="answers to wait for before judging --stop-if (%(default)s)")
    p.add_argument("--ignore-stop", action="store_true",
                   help="go on with a run that --stop-if stopped")
    p.add_argument("--high-water", type=int, default=setting_default("high_water"), metavar="N",
                   help="most queued prompts (default: 2x the fleet's concurrency, at least 512)")
    # The demo's None: its own choice, smaller with --stop-if (fleetgen/cli/demo.py).
    batch = setting_default("batch_size")
    p.add_argument("--batch-size", type=int, default=None if demo else batch, metavar="N",
                   help=f"rows tokenized and enqueued together ({batch}"
                   + (", 16 with --stop-if)" if demo else ")"))
    if demo:
        # What `settings_from` reads that the demo does not ask: its fleet is its own, with a
        # known context and no real server to read limits from.
        # new_run: the demo's (and run's) run is recorded in its --out; the demo has no --run.
        p.set_defaults(**{name: setting_default(name) for name in (
            "engine_url", "reserved_tokens", "max_req_input_len", "engine_protocol")},
            new_run="use another --out (the run is recorded there)")


def sampling_from(args: argparse.Namespace) -> Sampling:
    names = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed", "stop")
    values = {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}
    return Sampling(**values)  # type: ignore[typeddict-item]


def request_options_from(args: argparse.Namespace) -> dict[str, Any]:
    """The per-request options of the flags: samples, log-probabilities, schema, template."""
    return {"n": args.n, "logprobs": args.logprobs, "token_ids": args.token_ids,
            "reasoning": args.reasoning,
            "stop_if": tuple(args.stop_if), "stop_after": args.stop_after,
            "turns": args.turns, "out": getattr(args, "out", None), "affinity": args.affinity,
            "ignore_stop": args.ignore_stop,
            "json_schema": read_json_schema(args.json_schema),
            "chat_template_kwargs": json_object(args.chat_template_kwargs,
                                                "--chat-template-kwargs")}


def read_json_schema(path: Path | None) -> str | None:
    """The schema file as compact JSON (engines take it as a string); ConfigError if it is not
    a JSON object or not a valid JSON Schema."""
    if path is None:
        return None
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"--json-schema: cannot read {path}: {exc.strerror}") from exc
    schema = json_object(text, f"--json-schema {path}")
    import jsonschema

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ConfigError(f"--json-schema {path} is not a valid JSON Schema: "
                          f"{exc.message}") from exc
    return json.dumps(schema, separators=(",", ":"), ensure_ascii=False)


def settings_from(args: argparse.Namespace, redis_url_value: str) -> ProducerSettings:
    from producer.settings import ProducerSettings

    return ProducerSettings(**request_options_from(args),
        input=args.input, run=args.run, redis_url=redis_url_value, tokenizer=args.tokenizer,
        context_length=args.context_length, engine_url=tuple(args.engine_url or ()),
        reserved_tokens=args.reserved_tokens, max_req_input_len=args.max_req_input_len,
        engine_protocol=args.engine_protocol,
        engine_api_key=envvars.ENGINE_API_KEY.value(),
        max_output_tokens=args.max_output_tokens, min_output_tokens=args.min_output_tokens,
        margin=args.margin, sampling=sampling_from(args), high_water=args.high_water,
        batch_size=args.batch_size,
        **({"new_run": args.new_run} if getattr(args, "new_run", None) else {}))


def run(args: argparse.Namespace) -> int:
    from producer.runner import produce

    url = redis_url(args.redis)
    settings = settings_from(args, url)
    if settings.turns == "all" and args.no_wait:
        raise ConfigError("--turns all cannot take --no-wait: the waiting producer builds "
                          "each next turn from the answers written; drop --no-wait")
    terminal = Terminal(settings.run, show_progress=sys.stderr.isatty())
    report = produce(settings, wait=not args.no_wait,
                     reconcile_interval_s=args.reconcile_interval, hooks=terminal)
    if terminal.stopped():
        # Stopped, not finished: main says "interrupted; run the same command again to
        # resume" and exits 130, so no script takes a stopped producer for a finished run.
        raise KeyboardInterrupt
    if report.stopped is not None:
        print(f"fleetgen produce: run {settings.run!r} stopped early: {report.stopped}; "
              f"what was queued before the stop has finished ({report.enqueued} sent by this "
              f"command). Fix the settings and start a new --run, or run the same command "
              f"with --ignore-stop to go on.", file=sys.stderr)
        return exitcodes.INCOMPLETE
    print(f"fleetgen produce: run {settings.run!r} on {redact(url)}: {report.read} rows read, "
          f"{report.enqueued} enqueued, {report.rejected} rejected, {report.skipped} already "
          f"done or in flight, {report.requeued} re-enqueued after loss "
          f"({report.elapsed_s:.1f} s)")
    return exitcodes.OK


class Terminal:
    """`fleetgen produce` on a terminal (the producer's Hooks): the resume messages, the
    progress bars (on a tty), and SIGTERM."""

    def __init__(self, run: str, show_progress: bool) -> None:
        self.run = run
        self.show_progress = show_progress
        self._bars: dict[str, Bar] = {}
        self._stop: Callable[[], bool] | None = None

    def resuming(self, resume: Resume) -> None:
        if resume.grown_from is not None:
            print(f"fleetgen produce: run {self.run!r} is complete, but its input has changed "
                  f"since ({resume.grown_from:,} bytes then, {resume.size_bytes:,} now): "
                  "reading it again; rows already done are skipped")
        elif resume.complete:
            print(f"fleetgen produce: run {self.run!r} is already complete; nothing to do "
                  "(use a new --run name to generate again)")

    def stop_flag(self) -> Callable[[], bool]:
        # Within a second either way; a call blocked on Redis is interrupted (sigterm_flag).
        self._stop = sigterm_flag()
        return self._stop

    def stopped(self) -> bool:
        return self._stop is not None and self._stop()

    def read(self, rows: int, total: int) -> None:
        self._bar("read").advance_to(rows, total)

    def generated(self, rows: int, total: int) -> None:
        self._bar("generated").advance_to(rows, total)

    def close(self) -> None:
        for bar in self._bars.values():
            bar.close()

    def _bar(self, desc: str) -> Bar:
        if desc not in self._bars:
            # Without a terminal, a line a minute: a long run is never silent.
            self._bars[desc] = Bar(desc, show=self.show_progress,
                                   lines=f"fleetgen produce: run {self.run!r}: {desc}")
        return self._bars[desc]
