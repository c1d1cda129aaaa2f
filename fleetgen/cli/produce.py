"""`fleetgen produce`: tokenize, budget and enqueue a prompt file as a run.

Read INPUT as a stream, render each row with the chat template, tokenize it once, give it an
exact max_tokens budget and enqueue it; rows that cannot fit are rejected with a reason. Running
the same command again resumes the run.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetgen import exitcodes
from fleetgen.cli.flags import json_object, option_kwargs, subcommand
from fleetgen.cli.progress import Bar
from fleetgen.cli.signals import sigterm_flag
from fleetgen.errors import ConfigError
from fleetgen.queue.contract import Sampling
from fleetgen.queue.redisconn import connect, redact, redis_url
from fleetgen.settings import envvars, runoptions

if TYPE_CHECKING:
    from producer.runner import Resume
    from producer.settings import ProducerSettings


def add_parser(sub: Any) -> None:
    p = subcommand(sub, "produce", "enqueue a prompt file as a run (resumable)", __doc__, run)
    p.add_argument("input", type=Path, metavar="INPUT",
                   help="prompts: a .jsonl file (or .jsonl.gz, .jsonl.zst), a .parquet file, "
                   "a directory of them, or a quoted glob ('data/**/*.parquet'); rows may be "
                   "OpenAI Batch request lines")
    add_producer_options(p)


def add_producer_options(p: argparse.ArgumentParser, command: str = runoptions.PRODUCE) -> None:
    """The run options' flags that `command` takes from the table (fleetgen/settings/runoptions.py),
    in its order; `run` and `demo` declare a few of their own first (their --out, ...)."""
    own = {action.dest for action in p._actions}
    for option in runoptions.flags_of(command):
        p.add_argument(*option.flags,
                       **option_kwargs(option.attr, option.argparse_kwargs(command)))
    if command != runoptions.PRODUCE:
        # What `settings_from` reads that the command neither asks nor declares itself: the
        # table's defaults (the demo's fleet is its own, with a known context and no real
        # server to read limits from). new_run: the run is recorded in --out (no --run).
        p.set_defaults(**{o.attr: o.default for o in runoptions.TABLE
                          if o.kept.setting and o.flags and command not in o.commands
                          and o.attr not in own and o.name not in ("run", "redis_url")},
                       new_run="use another --out (the run is recorded there)")


def sampling_from(args: argparse.Namespace) -> Sampling:
    values = {o.name: getattr(args, o.attr) for o in runoptions.SAMPLING_OPTIONS
              if getattr(args, o.attr, None) is not None}
    return Sampling(**values)  # type: ignore[typeddict-item]


# How a flag's value becomes its setting, where it is not the value itself.
AS_SETTING: dict[str, Callable[[Any], Any]] = {
    "engine_url": lambda urls: tuple(_engine_urls(urls or ())),
    "stop_if": tuple,
    "json_schema": lambda path: read_json_schema(path),
    "chat_template_kwargs": lambda text: json_object(text, "--chat-template-kwargs"),
}


def _engine_urls(values: Iterable[str]) -> list[str]:
    from fleetgen.engine import engine_urls

    return engine_urls(values)


def request_options_from(args: argparse.Namespace) -> dict[str, Any]:
    """Every setting of the table that the parsed flags give (with their `sampling`)."""
    values: dict[str, Any] = {"sampling": sampling_from(args)}
    for option in runoptions.TABLE:
        if option.kept.setting and option.flags and hasattr(args, option.attr) \
                and option.name != "redis_url":
            value = getattr(args, option.attr)
            values[option.name] = AS_SETTING.get(option.name, lambda v: v)(value)
    return values


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


def settings_from(args: argparse.Namespace,
                  redis_url_value: str | None) -> ProducerSettings:
    from producer.settings import ProducerSettings

    return ProducerSettings(**request_options_from(args), input=args.input,
                            redis_url=redis_url_value,
                            engine_api_key=envvars.ENGINE_API_KEY.value(),
                            **({"new_run": args.new_run} if getattr(args, "new_run", None)
                               else {}))


def run(args: argparse.Namespace) -> int:
    from producer.runner import produce

    url = redis_url(args.redis)
    settings = settings_from(args, url)
    if settings.turns == "all" and args.no_wait:
        raise ConfigError("--turns all cannot take --no-wait: the waiting producer builds "
                          "each next turn from the answers written; drop --no-wait")
    terminal = Terminal(settings.run, show_progress=sys.stderr.isatty(), redis_url=url)
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

    def __init__(self, run: str, show_progress: bool, redis_url: str | None = None) -> None:
        self.run = run
        self.show_progress = show_progress
        self._redis_url = redis_url
        self._view: Any = None  # the workers' falls and returns, while the run is waited for
        self._view_client: Any = None
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
        bar = self._bar("generated")
        bar.advance_to(rows, total)
        if self._view is None and self._redis_url is not None:
            from fleetgen.cli.runview import FleetView

            # A worker that stops beating (dead, or cut off from Valkey) and its return, said
            # where the run was started, as `fleetgen run` says them (issue 52).
            # A look never holds the producer through an outage: no retries, a short timeout.
            self._view_client = connect(self._redis_url, ping=False, timeout_s=2.0, retries=0)
            self._view = FleetView(self._view_client, self.run, [],
                                   lambda text: bar.note(f"fleetgen produce: {text}"))
        if self._view is not None:
            self._view.look()
            # No connection is kept between looks: while the producer rides out a Redis outage
            # this hook is not called, and an idle socket to a dead server would stay open.
            self._view_client.connection_pool.disconnect()

    def close(self) -> None:
        for bar in self._bars.values():
            bar.close()

    def _bar(self, desc: str) -> Bar:
        if desc not in self._bars:
            # Without a terminal, a line every 10 s: a long run is never silent.
            self._bars[desc] = Bar(desc, show=self.show_progress,
                                   lines=f"fleetgen produce: run {self.run!r}: {desc}")
        return self._bars[desc]
