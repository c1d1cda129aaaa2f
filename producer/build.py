"""Building a producer from its settings: the one wiring that the CLI, the demo and the
benchmarks share (limits from the flags or the engines, the tokenizer, Redis, the enqueuer)."""

from __future__ import annotations

import logging

import redis

from fleetgen import engine
from fleetgen.engine import EngineProtocol, ServerLimits, kinds
from fleetgen.engine.preflight import combine, returns_token_ids
from fleetgen.errors import ConfigError, EngineUnreachable, PermanentError, RetryableError
from fleetgen.queue.redisconn import connect
from producer.budget import Limits
from producer.enqueue import Enqueuer
from producer.inputs import resolve_input
from producer.loop import Plan, Producer
from producer.manifest import recorded_in
from producer.request import PROBE_CHAT, RequestOptions, opens_reasoning, unwaitable_schema
from producer.settings import ProducerSettings
from producer.tokenizer import PromptTokenizer, load_tokenizer

log = logging.getLogger("fleetgen.producer")


def read_servers(s: ProducerSettings) -> tuple[EngineProtocol, dict[str, ServerLimits]]:
    """The engines' protocol, and every --engine-url's limits (none without one). A server
    that does not answer is EngineUnreachable (exit 4); one that answers without a context
    length is a ConfigError (exit 3)."""
    first = s.engine_url[0] if s.engine_url else None
    try:
        proto = engine.resolve(s.engine_protocol, first, s.engine_api_key)
    except EngineUnreachable as exc:
        raise EngineUnreachable(f"cannot read limits from {first}: {exc.message}; is the "
                                "server up? (`fleetgen doctor --engine-url URL`)") from exc
    servers = {}
    for url in s.engine_url:
        try:
            servers[url] = proto.read_limits(url, api_key=s.engine_api_key)
        except PermanentError as exc:
            raise ConfigError(f"cannot read limits from {url}: {exc.message}") from exc
        except EngineUnreachable as exc:
            raise EngineUnreachable(f"cannot read limits from {url}: {exc.message}; is the "
                                    "server up? (`fleetgen doctor --engine-url URL`)") from exc
        except RetryableError as exc:  # a timeout, a 503 while loading: not there yet either
            raise EngineUnreachable(f"cannot read limits from {url}: {exc.message}") from exc
    return proto, servers


def resolve_limits(s: ProducerSettings) -> Limits:
    """The limits every server allows: from the flags, and from each --engine-url (the smallest
    context and input limit, the largest speculative reserve win)."""
    proto, servers = read_servers(s)
    rule = proto.rule
    context, max_total, input_limit = s.context_length, None, s.max_req_input_len
    cannot_wait: str | None = None
    reserve = s.reserved_tokens
    if servers:
        rule = proto.rule_for(next(iter(servers.values())))
        fleet = combine(list(servers.values()), rule)
        if context is not None and context > fleet.context_length:
            raise ConfigError(f"--context-length {context} exceeds the server's "
                              f"{fleet.context_length}")
        context = context or fleet.context_length
        max_total = fleet.max_total_tokens
        reserve = max(reserve, fleet.reserved_tokens)
        input_limit = min(v for v in (input_limit, fleet.max_req_input_len) if v is not None)
        warn_ignored_seed(s, servers)
        cannot_wait = grammar_cannot_wait(proto, servers)
        if s.token_ids:
            check_token_ids(s, proto, servers)
    assert context is not None
    try:
        return Limits(context_length=context, max_total_tokens=max_total,
                      cap=s.max_output_tokens, margin=s.margin,
                      min_output_tokens=s.min_output_tokens, rule=rule,
                      reserved_tokens=reserve, server_input_limit=input_limit,
                      grammar_cannot_wait=cannot_wait)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def grammar_cannot_wait(proto: EngineProtocol, servers: dict[str, ServerLimits]) -> str | None:
    """Why a JSON schema's grammar could not let a thinking prompt's reasoning through on these
    servers, naming the fix; None when it can, or when no server says (each kind declares
    its own: SGLang's needs its parser and /generate; vLLM does not report its parser;
    llama.cpp is not checked). Otherwise the grammar holds from the first token: after a
    prompt that opened `<think>`, the document is written inside the reasoning and the split
    finds no answer."""
    for url, limits in servers.items():
        kind = kinds.kind_of(limits.engine)
        why = kind.grammar_cannot_wait(url, limits, proto.name) if kind else None
        if why is not None:
            return why
    return None


def check_token_ids(s: ProducerSettings, proto: EngineProtocol,
                    servers: dict[str, ServerLimits]) -> None:
    """`--token-ids`: every server must return an answer's token ids (one tiny generation
    each); one that does not is a ConfigError (exit 3) before anything is sent. Without
    --engine-url there is no server to ask: the worker then fails such an answer
    (workers/generate.py `check_token_ids`)."""
    for url, limits in servers.items():
        client = proto.connect(url, timeout_s=30.0, concurrency=1, api_key=s.engine_api_key)
        try:
            check = returns_token_ids(client)
        finally:
            client.close()
        if not check.ok:
            raise ConfigError(f"--token-ids: {url} ({limits.engine}, {proto.name} protocol) "
                              f"cannot return token ids: {check.detail}; use a server that "
                              "returns them (docs/formats.md \"Token ids\") or drop --token-ids")


def warn_ignored_seed(s: ProducerSettings, servers: dict[str, ServerLimits]) -> None:
    """SGLang applies `sampling_seed` only with --enable-deterministic-inference
    (srt/sampling/sampling_batch_info.py `SamplingBatchInfo.from_schedule_batch`); say so once."""
    if s.sampling.get("seed") is None:
        return
    ignoring = [url for url, limits in servers.items() if limits.deterministic is False]
    if ignoring:
        log.warning("--seed %s has no effect on %s: started without "
                    "--enable-deterministic-inference, SGLang ignores sampling_seed, so answers "
                    "are not reproducible", s.sampling.get("seed"), ", ".join(ignoring))


def refuse_unwaitable_schema(settings: ProducerSettings, tokenizer: PromptTokenizer,
                             limits: Limits) -> None:
    """`--json-schema` on a run whose template leaves the think block open, against servers
    whose grammar cannot wait for `</think>`: refused before anything is sent (a row's own
    schema is refused when its row comes, producer/request.py)."""
    if settings.json_schema is None or limits.grammar_cannot_wait is None:
        return
    options = RequestOptions(settings, tokenizer, limits)
    if options.split_reasoning and opens_reasoning(tokenizer.render(PROBE_CHAT)):
        raise ConfigError(unwaitable_schema("--json-schema", limits.grammar_cannot_wait))


def build_producer(settings: ProducerSettings, *, client: redis.Redis, plan: Plan,
                   tokenizer: PromptTokenizer | None = None,
                   limits: Limits | None = None) -> Producer:
    """A producer ready to run, on the run's Redis client and its Plan (the input its caller
    resolved); InputError for a bad setting or an engine that cannot be read. A tokenizer
    already loaded (benchmarks, tests) can be passed in."""
    limits = limits or resolve_limits(settings)
    tokenizer = tokenizer or load_tokenizer(
        settings.tokenizer, chat_template_kwargs=settings.chat_template_kwargs)
    refuse_unwaitable_schema(settings, tokenizer, limits)
    enqueuer = Enqueuer(client, settings.run, settings.high_water)
    return Producer(settings, tokenizer, client, enqueuer, limits, plan)


def standalone_producer(settings: ProducerSettings, *, tokenizer: PromptTokenizer | None = None,
                        limits: Limits | None = None, waits: bool = False) -> Producer:
    """A producer that is all its process does (a benchmark, a test): its input resolved and
    its Redis connected here, once (InputError for a missing input, before connecting)."""
    inputs = resolve_input(settings.input)
    assert settings.redis_url is not None, "a standalone producer connects: give its URL"
    plan = Plan(inputs, waits=waits, recorded=recorded_in(settings.out, settings.run))
    return build_producer(settings, client=connect(settings.redis_url), plan=plan,
                          tokenizer=tokenizer, limits=limits)
