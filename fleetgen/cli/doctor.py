"""`fleetgen doctor`: a read-only pre-flight of the real fleet before a long run: what fleetgen
will assume about each server, and whether each server keeps the length rule the budget needs.

It sends three small requests per server: one tiny generation, and two that a server keeping
SGLang's rules refuses before any prefill (`TokenizerManager._validate_one_request`, the
scheduler's `validate_input_length`). Then it renders three probe conversations through the
server's own chat path and through fleetgen's tokenizer and compares them
(`fleetgen/engine/template.py`). Nothing is written anywhere.

For each --engine-url: prints what fleetgen will assume (context, input limit, speculative
reserve, running requests and the worker's -c, determinism, model, skip_tokenizer_init); checks
readiness; sends one tiny generation; and sends two requests the server must refuse before
generating (an input at the budget's input limit, a budget one token past the context); then
renders three probe chats (a user turn, the same with enable_thinking false, a system prompt and
a history with reasoning_content) through the server's chat path and through --tokenizer, and
compares the tokens. Exit 0: all agree; 1: a server disagrees with the budget model or the chat
template; 3: a server does not report its context (or a bad --tokenizer); 4: a server is
unreachable or not ready.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

from fleetgen import engine, errors, exitcodes
from fleetgen.cli.flags import engine_protocol_option, json_object, subcommand
from fleetgen.engine import EngineProtocol, ServerLimits, kinds
from fleetgen.engine.health import State, probe_url
from fleetgen.engine.load import gauges_of
from fleetgen.engine.preflight import (
    Check,
    combine,
    fleet_disagreements,
    refuses_long_input,
    refuses_past_total,
    tiny_generation,
)
from fleetgen.engine.sglang import servers_behind
from fleetgen.engine.template import (
    ChatRenderer,
    Comparison,
    compare_templates,
    reasoning_line,
    template_check,
)
from fleetgen.settings import envvars
from fleetgen.settings.runoptions import DEFAULT_TOKENIZER

# The server contradicts the budget model: a run would get 400s, truncated prompts or no text.
DISAGREES = 1


@dataclass
class ServerReport:
    """One server: what fleetgen assumes about it, and the checks."""

    url: str
    limits: ServerLimits | None = None
    input_limit: int | None = None
    concurrency: int | None = None  # the `-c` to give its worker
    checks: list[Check] = field(default_factory=list)
    template: list[Comparison] = field(default_factory=list)
    code: int = exitcodes.OK  # the worst outcome: UNAVAILABLE > CONFIG > DISAGREES > OK


def add_parser(sub: Any) -> None:
    p = subcommand(sub, "doctor", "check the fleet before a long run: limits, readiness, "
                   "length rules", __doc__, run)
    p.add_argument("--engine-url", action="append", required=True, metavar="URL",
                   help="a server of the fleet (repeat for each, or a comma list; "
                   "http://HOST:30000-30007 for a range of ports)")
    engine_protocol_option(p)
    p.add_argument("--timeout-s", type=float, default=60.0, metavar="S",
                   help="per request; the tiny generation may wait in a busy server's queue (60)")
    p.add_argument("--tokenizer", default=DEFAULT_TOKENIZER, metavar=f"PATH|{DEFAULT_TOKENIZER}",
                   help="the run's tokenizer, whose chat template is compared with the "
                   f"server's (default {DEFAULT_TOKENIZER})")
    p.add_argument("--chat-template-kwargs", metavar="JSON", default="{}",
                   help="the run's template options, e.g. '{\"enable_thinking\": false}'; the "
                   "probes' own go over them")
    p.add_argument("--token-ids", action="store_true",
                   help="the run keeps answers' token ids: a server must be able to return "
                   "them (llama.cpp: its `__verbose`)")
    p.add_argument("--stop", action="append", metavar="TEXT",
                   help="the run's stop strings: a server must say which one ended an answer "
                   "(llama.cpp: its `__verbose`)")
    p.add_argument("--json", action="store_true", help="print one JSON document instead")


@dataclass
class TemplateCheck:
    """fleetgen's side of the template check: the run's tokenizer (loaded once, when a server
    is ready for it) and template options."""

    load: Callable[[], ChatRenderer]
    run_kwargs: dict[str, Any]
    _renderer: ChatRenderer | None = None

    @property
    def renderer(self) -> ChatRenderer:
        if self._renderer is None:
            self._renderer = self.load()
        return self._renderer


def needs_of(token_ids: bool, stop: Any) -> tuple[str, ...]:
    """The run's options that read what only some servers return, as their flags."""
    return (("--token-ids",) if token_ids else ()) + (("--stop",) if stop else ())


def examine(url: str, proto: EngineProtocol, timeout_s: float, api_key: str | None,
            template: TemplateCheck | None = None, needs: tuple[str, ...] = ()) -> ServerReport:
    report = ServerReport(url)
    ready = probe_url(url, timeout_s=min(timeout_s, 10.0), api_key=api_key)
    if ready.state is State.REFUSED:  # nothing else can be learnt: one line
        report.checks.append(Check("unreachable", False, ready.detail))
        report.code = exitcodes.UNAVAILABLE
        return report
    report.checks.append(Check("ready", ready.ready, ready.detail))
    try:
        limits = proto.read_limits(url, api_key=api_key, timeout_s=timeout_s)
    except errors.PermanentError as exc:
        report.checks.append(Check("limits", False, exc.message))
        report.code = exitcodes.CONFIG
        return report
    except errors.EngineError as exc:
        report.checks.append(Check("limits", False, f"unreachable: {exc.message}"))
        report.code = exitcodes.UNAVAILABLE
        return report
    report.limits = limits
    report.input_limit = proto.rule_for(limits).input_limit(limits)
    report.concurrency = proto.pool_size(limits)
    if not ready.ready:
        report.code = exitcodes.UNAVAILABLE
        return report
    report.checks += probe_rules(url, proto, limits, timeout_s, api_key, needs)
    if template is not None:
        renderer = template.renderer
        report.template = compare_templates(url, limits, renderer, template.run_kwargs,
                                            api_key=api_key, timeout_s=timeout_s)
        report.checks += [template_check(c, renderer) for c in report.template]
    if not all(c.ok for c in report.checks):
        report.code = DISAGREES
    return report


def probe_rules(url: str, proto: EngineProtocol, limits: ServerLimits, timeout_s: float,
                api_key: str | None, needs: tuple[str, ...] = ()) -> list[Check]:
    checks = []
    if limits.skip_tokenizer_init:
        checks.append(Check("text", False, "started with --skip-tokenizer-init: answers carry "
                            "output ids and no text; restart it without that flag"))
    kind = kinds.kind_of(limits.engine)
    client = proto.connect(url, timeout_s=timeout_s, concurrency=1, api_key=api_key)
    try:
        checks.append(tiny_generation(client))
        if kind is not None:  # what only this kind's answers can lack (llama.cpp's __verbose)
            checks += kind.client_checks(client, needs)
        rule = proto.rule_for(limits)
        long_input = refuses_long_input(client, limits, rule)
        checks.append(long_input)
        # A server that truncated the long input would also truncate a too-large budget, and
        # then generate a whole context: skip that probe, the verdict is in. An engine whose
        # rule cuts a too-large budget by design has nothing to confirm there.
        if long_input.ok and rule.refuses_excess_budget:
            checks.append(refuses_past_total(client, limits))
    finally:
        client.close()
    # The kind's own checks by URL (vLLM: whether answers carry their acceptance).
    return checks + (kind.server_checks(url, api_key, timeout_s) if kind is not None else [])


def exit_code(reports: list[ServerReport], fleet_checks: list[Check]) -> int:
    codes = {r.code for r in reports}
    for code in (exitcodes.UNAVAILABLE, exitcodes.CONFIG, DISAGREES):
        if code in codes:
            return code
    return DISAGREES if fleet_checks else exitcodes.OK


def run(args: argparse.Namespace) -> int:
    urls = engine.engine_urls(args.engine_url)
    reports, fleet_checks, code = check_fleet(urls, args.engine_protocol, args.timeout_s,
                                              args.tokenizer, args.chat_template_kwargs,
                                              needs_of(args.token_ids, args.stop))
    known = [r.limits for r in reports if r.limits is not None]
    proto = _protocol(args.engine_protocol, urls[0])
    assumed = combine(known, proto.rule_for(known[0])) if known else None
    if args.json:
        print(render_json(reports, fleet_checks, assumed, code))
    else:
        print(render_text(reports, fleet_checks, assumed, code))
    return code


def check_fleet(engine_urls: list[str], engine_protocol: str | None, timeout_s: float,
                tokenizer: str, chat_template_kwargs: str | None,
                needs: tuple[str, ...] = (),
                ) -> tuple[list[ServerReport], list[Check], int]:
    """Every server's report, the checks across them, and the exit code (`fleetgen run`
    stops on anything but OK before it starts a process)."""
    api_key = envvars.ENGINE_API_KEY.value()
    engine_urls = engine.engine_urls(engine_urls)
    proto = _protocol(engine_protocol, engine_urls[0])
    urls = expand_routers(engine_urls, api_key)
    # Read as produce reads it, so doctor checks the run's own options.
    template = TemplateCheck(lambda: _load_renderer(tokenizer), json_object(
        chat_template_kwargs or "{}", "--chat-template-kwargs"))
    reports = [examine(url, proto, timeout_s, api_key, template, needs) for url in urls]
    fleet_checks = fleet_disagreements({r.url: r.limits for r in reports
                                        if r.limits is not None})
    return reports, fleet_checks, exit_code(reports, fleet_checks)


def _protocol(name: str | None, url: str) -> EngineProtocol:
    try:
        return engine.resolve(name, url, envvars.ENGINE_API_KEY.value())
    except errors.EngineError:  # unreachable: each server's report says so
        return engine.protocol(name or engine.DEFAULT_PROTOCOL)


@functools.lru_cache(maxsize=2)
def _load_renderer(spec: str) -> ChatRenderer:
    # Cached: loading takes seconds, and tests (and a long-lived caller) run doctor repeatedly.
    from producer.tokenizer import load_tokenizer

    return load_tokenizer(spec)


def expand_routers(urls: list[str], api_key: str | None) -> list[str]:
    """An SGLang router passes each request to one of its servers, so a probe through it
    checks whichever it picked: examine the servers it lists instead, each on its own."""
    expanded: list[str] = []
    for url in urls:
        try:
            behind = servers_behind(url, api_key=api_key)
        except errors.EngineError:
            behind = []  # not a router, or not answering: examine() reports it
        if behind:
            print(f"{url} is an SGLang router; examining the {len(behind)} server(s) behind it")
        expanded += behind or [url]
    return expanded


# -- output -----------------------------------------------------------------------------------
COLUMNS = ("server", "model", "context", "input limit", "reserve", "running", "-c",
           "deterministic", "text")


def _yes_no(value: bool | None) -> str:
    return "?" if value is None else ("yes" if value else "no")


def _concurrency(size: int | None, limits: ServerLimits) -> str:
    """The worker's -c: the slots + 1 where they are reported, else "paced" where the worker
    finds it from the engine's queue (workers/pacing.py), else "?"."""
    if size:
        return str(size)
    return "paced" if gauges_of(limits.engine) is not None else "?"


def _row(r: ServerReport) -> tuple[str, ...]:
    s = r.limits
    if s is None:
        return (r.url, *("-" for _ in COLUMNS[1:]))
    return (r.url, s.model or "?", str(s.context_length), str(r.input_limit),
            str(s.reserved_tokens), str(s.max_running_requests or "?"),
            _concurrency(r.concurrency, s), _yes_no(s.deterministic),
            _yes_no(not s.skip_tokenizer_init))


def table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
                     .rstrip() for row in rows)


def render_text(reports: list[ServerReport], fleet_checks: list[Check],
                assumed: ServerLimits | None, code: int) -> str:
    lines = [table([COLUMNS, *(_row(r) for r in reports)]), ""]
    if assumed is not None:
        lines.append(f"the producer budgets for: context {assumed.context_length}, input limit "
                     f"{assumed.max_req_input_len}, reserve {assumed.reserved_tokens} "
                     f"(the smallest limits of {len([r for r in reports if r.limits])} "
                     "server(s))")
        if assumed.deterministic is not True:
            lines.append("note: --seed is not honoured (no --enable-deterministic-inference); "
                         "answers are not reproducible")
    lines += [f"note: {r.url} {line}" for r in reports if r.limits is not None
              for line in [reasoning_line(r.limits)] if line]
    lines += [f"{c.line()[:4]} {r.url} {c.name}: {c.detail}" for r in reports for c in r.checks]
    lines += [c.line() for c in fleet_checks]
    lines.append(VERDICTS[code])
    return "\n".join(lines)


VERDICTS = {
    exitcodes.OK: "verdict: ok, the fleet agrees with fleetgen's budget model and chat "
                  "template",
    DISAGREES: "verdict: FAIL, a server disagrees with fleetgen's budget model or chat "
               "template (exit 1)",
    exitcodes.CONFIG: "verdict: FAIL, a server does not report its context length; pass "
                      "--context-length to produce (exit 3)",
    exitcodes.UNAVAILABLE: "verdict: FAIL, a server is unreachable or not ready (exit 4)",
}


def render_json(reports: list[ServerReport], fleet_checks: list[Check],
                assumed: ServerLimits | None, code: int) -> str:
    doc = {
        "servers": [{
            "url": r.url,
            "limits": asdict(r.limits) if r.limits else None,
            "input_limit": r.input_limit,
            "concurrency": r.concurrency,
            "checks": [asdict(c) for c in r.checks],
            "template": [asdict(c) for c in r.template],
            "exit_code": r.code,
        } for r in reports],
        "fleet_checks": [asdict(c) for c in fleet_checks],
        "assumed": asdict(assumed) if assumed else None,
        "exit_code": code,
    }
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode()
