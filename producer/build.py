"""Building a producer from its settings: the one wiring that the CLI, the demo and the
benchmarks share (limits from the flag or the engine, the tokenizer, Redis, the enqueuer)."""

from __future__ import annotations

from fleetgen import engine
from fleetgen.base.errors import ConfigError, EngineError
from fleetgen.base.redisconn import connect
from producer.budget import Limits
from producer.enqueue import Enqueuer
from producer.pipeline import Producer
from producer.settings import ProducerSettings
from producer.tokenizer import PromptTokenizer, load_tokenizer


def resolve_limits(s: ProducerSettings) -> Limits:
    """The context from --context-length, else from the engine; KV capacity from the engine."""
    proto = engine.protocol()
    max_total = None
    context = s.context_length
    if s.engine_url:
        try:
            server = proto.read_limits(s.engine_url, api_key=s.engine_api_key)
        except EngineError as exc:
            raise ConfigError(f"cannot read limits from {s.engine_url}: {exc.message}") from exc
        if context is not None and context > server.context_length:
            raise ConfigError(f"--context-length {context} exceeds the server's "
                              f"{server.context_length}")
        context = context or server.context_length
        max_total = server.max_total_tokens
    assert context is not None
    try:
        return Limits(context_length=context, max_total_tokens=max_total,
                      cap=s.max_output_tokens, margin=s.margin,
                      min_output_tokens=s.min_output_tokens, rule=proto.rule)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def build_producer(settings: ProducerSettings, *, tokenizer: PromptTokenizer | None = None,
                   limits: Limits | None = None) -> Producer:
    """A producer ready to run; ConfigError for a missing input, a bad setting or an engine
    that cannot be read. A tokenizer already loaded (benchmarks, tests) can be passed in."""
    if not settings.input.exists():
        raise ConfigError(f"input file not found: {settings.input}")
    client = connect(settings.redis_url)
    limits = limits or resolve_limits(settings)
    tokenizer = tokenizer or load_tokenizer(settings.tokenizer)
    enqueuer = Enqueuer(client, settings.run, settings.high_water)
    return Producer(settings, tokenizer, client, enqueuer, limits)
