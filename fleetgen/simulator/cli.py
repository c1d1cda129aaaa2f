"""The `fleetgen sim` command: flags, building the config, serving until signalled."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING

from fleetgen.simulator.config import DEFAULT_DRAFT_TOKENS, SPECULATIVE_ALGORITHMS, SimConfig

if TYPE_CHECKING:
    from fleetgen.simulator.server import SimFleet

EXIT_OK = 0
EXIT_CANNOT_SERVE = 1  # e.g. the port is taken
EXIT_BAD_CONFIG = 3  # a bad setting, as every fleetgen command (fleetgen/exitcodes.py)

# Listed in fleetgen/settings/envvars.py with every other variable (the simulator imports no
# product code; tests/settings/test_envvars.py checks the two agree).
API_KEY_ENV = "FLEETGEN_SIM_API_KEY"

# The command's prefill rate: a dense 27B model on one H100 (docs/simulator.md, "Prefill").
# SimConfig's own default is free prefill, the building block of the protocol tests.
PREFILL_TOKENS_PER_S = 8000.0

# The fault rates' flags and what each does to that fraction of the requests.
FAULT_RATE_FLAGS = (
    ("--error-rate", "of requests answered 500/502/503/504"),
    ("--queue-full-rate", "answered 503 'The request queue is full.'"),
    ("--hang-rate", "never answered until the client gives up"),
    ("--drop-rate", "whose connection is closed without an answer"),
    ("--json-invalid-rate", "of JSON-schema answers written invalid (deterministic per request)"),
)

logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the simulator's flags (defaults are SimConfig's) to `parser`."""
    d = SimConfig()
    serve = parser.add_argument_group("serving")
    serve.add_argument("--host", metavar="HOST", default=d.host,
                       help="interface to listen on (default %(default)s)")
    serve.add_argument("--port", metavar="PORT", type=int, default=d.port,
                       help="first port; server i listens on PORT+i, 0 picks free ports "
                            "(default %(default)s)")
    serve.add_argument("--count", metavar="N", type=int, default=d.count,
                       help="simulated servers (one per GPU) in this process (default %(default)s)")
    serve.add_argument("--model-name", metavar="NAME", default=d.model_name,
                       help="name reported by /v1/models (default %(default)s)")
    serve.add_argument("--api-key", metavar="KEY", default=None,
                       help=f"require 'Authorization: Bearer KEY' (default: ${API_KEY_ENV})")
    serve.add_argument("--drain-timeout-s", metavar="S", type=float, default=d.drain_timeout_s,
                       help="on SIGTERM, wait this long for requests in flight "
                            "(default %(default)s)")

    limits = parser.add_argument_group("limits (applied as SGLang applies them)")
    limits.add_argument("--context-length", metavar="TOKENS", type=int,
                        default=d.context_length, help="model context (default %(default)s)")
    limits.add_argument("--max-total-tokens", "--max-total-num-tokens", metavar="TOKENS",
                        type=int, default=None, dest="max_total_tokens",
                        help="KV cache capacity (default: never tighter than the context)")
    limits.add_argument("--max-running-requests", metavar="K", type=int, default=None,
                        help="running slots, as SGLang's flag: /server_info shows K at the top "
                             "level (default: not passed, top level null)")
    limits.add_argument("--derived-slots", metavar="K", type=int, default=d.derived_slots,
                        help="slots per DP rank the server derives itself when "
                             "--max-running-requests is not passed; reported only in "
                             "internal_states (default %(default)s)")
    limits.add_argument("--dp-size", metavar="N", type=int, default=d.dp_size,
                        help="data-parallel ranks: one internal_states entry each "
                             "(default %(default)s)")
    limits.add_argument("--page-size", metavar="TOKENS", type=int, default=d.page_size,
                        help="KV page size, used by the KV-memory clamp (default %(default)s)")
    limits.add_argument("--max-queued-requests", metavar="N", type=int, default=None,
                        help="waiting requests allowed; beyond them 503 (default: unbounded)")

    modes = parser.add_argument_group("server modes (as SGLang's flags)")
    modes.add_argument("--speculative-algorithm", metavar="NAME", default=None,
                       choices=SPECULATIVE_ALGORITHMS,
                       help=f"speculative decoding ({', '.join(SPECULATIVE_ALGORITHMS)}): a "
                            "finished answer's meta_info carries SGLang's spec_* fields (vLLM "
                            "flavour: /metrics counters), decoding takes one step per verify, "
                            "48 slots unless --max-running-requests is passed; the EAGLE "
                            "family reserves max(topk x steps, draft tokens) in the context "
                            "checks")
    modes.add_argument("--speculative-num-steps", metavar="N", type=int,
                       default=d.speculative_num_steps, help="(default %(default)s)")
    modes.add_argument("--speculative-eagle-topk", metavar="N", type=int,
                       default=d.speculative_eagle_topk, help="(default %(default)s)")
    modes.add_argument("--speculative-num-draft-tokens", metavar="N", type=int, default=None,
                       help="tokens a verify step checks, the bonus one included (default: "
                            f"{d.speculative_num_draft_tokens}; DFLASH "
                            f"{DEFAULT_DRAFT_TOKENS['DFLASH']}, NGRAM "
                            f"{DEFAULT_DRAFT_TOKENS['NGRAM']}, as SGLang resolves them)")
    modes.add_argument("--spec-accept-rate", metavar="R", type=float, default=d.spec_accept_rate,
                       help="share of proposed drafts this server's drafter gets right, on "
                            "average over prompts (meta_info spec_accept_rate; default "
                            "%(default)s)")
    modes.add_argument("--spec-accept-spread", metavar="S", type=float,
                       default=d.spec_accept_spread,
                       help="each prompt's rate is R x (1 + S x (u - 0.5)), u from a hash of "
                            "the prompt: the same prompts are hard on every server (default "
                            "%(default)s)")
    modes.add_argument("--per-request-spec-decode-metrics", choices=("none", "summary"),
                       default=d.per_request_spec_decode_metrics,
                       help="--flavor vllm with an algorithm: summary puts each answer's "
                            "acceptance in its metrics.speculative_decoding, as vLLM 0.32 does "
                            "(default %(default)s: the /metrics counters only)")
    modes.add_argument("--enable-deterministic-inference", action="store_true",
                       help="report that sampling_seed is honoured (the simulator always "
                            "honours it)")
    modes.add_argument("--skip-tokenizer-init", action="store_true",
                       help="answer with output_ids only, no text")
    # The command models the model fleetgen targets (Qwen3.6: its official template opens
    # the think block in every generation prompt; SGLang serves it with --reasoning-parser).
    # SimConfig's own default stays a plain model, the building block of the protocol tests.
    modes.add_argument("--thinking", action=argparse.BooleanOptionalAction, default=True,
                       help="model a thinking model served with a reasoning parser (the "
                            "default, as Qwen3.6 is served): answers begin with <think> ... "
                            "</think> (ids 248068, 248069) unless the prompt ends with the "
                            "empty think block, or inside the block the prompt opened; "
                            "--no-thinking: a model that never reasons")
    modes.add_argument("--no-reasoning-parser", action="store_true",
                       help="a thinking model served without --reasoning-parser "
                            "(/server_info reasoning_parser null): a JSON schema's grammar "
                            "applies from the first token, require_reasoning or not, and "
                            "meta_info reasoning_tokens is 0")
    modes.add_argument("--flavor", choices=("sglang", "vllm", "llama"), default=d.flavor,
                       help="sglang: SGLang 0.5.23 (native and /v1); vllm: a vLLM 0.33 server "
                            "(/v1/completions with vLLM's length rule, no native endpoints); "
                            "llama: llama.cpp's server as fleetgen reads it (/props, "
                            "/v1/completions with __verbose, /apply-template)")
    modes.add_argument("--llama-no-verbose", dest="llama_verbose", action="store_false",
                       help="--flavor llama: play a build before b9754, which answers "
                            "\"verbose\": true without __verbose (no token ids, no stop word)")
    modes.add_argument("--chat-template", metavar="FILE", default=None,
                       help="the Jinja chat template /v1/chat/completions and /tokenize render "
                            "messages with (default: Qwen3.6's official template, "
                            "producer/templates/qwen3.6-27b.chat_template.jinja)")
    modes.add_argument("--allow-auto-truncate", action="store_true",
                       help="cut a too-long input and a too-large max_new_tokens instead of "
                            "answering 400 (a server that breaks fleetgen's budget model)")
    modes.add_argument("--health-delay-s", metavar="S", type=float, default=d.health_delay_s,
                       help="time /health takes when up; SGLang's probe never answers in "
                            "under 1 s (default %(default)s)")

    timing = parser.add_argument_group("capacity model")
    timing.add_argument("--ttft-ms", metavar="MS", type=float, default=d.ttft_ms,
                        help="fixed part of the time to first token (scheduling, the first "
                             "step); the prefill of the uncached prompt tokens comes on top "
                             "(default %(default)s)")
    timing.add_argument("--prefill-tokens-per-s", metavar="RATE", type=float,
                        default=PREFILL_TOKENS_PER_S,
                        help="prefill throughput: the prompt tokens the prefix cache does not "
                             "hold take 1/RATE s each before the first token, and the running "
                             "requests' decoding waits meanwhile; 'inf': prefill is free "
                             "(default %(default)s, a 27B model on one H100; docs/simulator.md)")
    timing.add_argument("--chunked-prefill-size", metavar="TOKENS", type=int,
                        default=d.chunked_prefill_size,
                        help="tokens per prefill forward pass, as SGLang's flag (default "
                             "%(default)s, SGLang's on an 80 GB GPU; -1: no chunks)")
    timing.add_argument("--prefix-cache", choices=("hybrid", "full"), default=d.prefix_cache,
                        help="which cached prefix the server reuses: 'hybrid', Qwen3.6's "
                             "linear-attention model (SGLang: only up to a kept state, every "
                             "64 prompt tokens and 256 decoded ones; vLLM: 640-token 'align' "
                             "blocks), or 'full', a full-attention model (SGLang: token by "
                             "token; vLLM: 128-token blocks) (default %(default)s; "
                             "docs/simulator.md)")
    timing.add_argument("--mamba-track-interval", metavar="TOKENS", type=int,
                        default=d.mamba_track_interval, help="SGLang's flag: a decoding "
                        "hybrid request keeps a state this often (default %(default)s)")
    timing.add_argument("--cache-block-size", metavar="TOKENS", type=int, default=None,
                        help="--flavor vllm: vLLM's --block-size (default: 128, vLLM's on "
                             "CPU; 640 with --prefix-cache hybrid)")
    timing.add_argument("--tpot-ms", metavar="MS", type=float, default=d.tpot_ms,
                        help="time per output token (default %(default)s)")
    timing.add_argument("--slowdown", metavar="F", type=float, default=d.slowdown,
                        help="tpot is multiplied by 1 + F x running/K (default %(default)s)")
    timing.add_argument("--speed", metavar="F", type=float, default=d.speed,
                        help="relative GPU speed; 0.5 doubles every time (default %(default)s)")
    timing.add_argument("--output-tokens-mean", metavar="TOKENS", type=int,
                        default=d.output_tokens_mean,
                        help="mean natural answer length, heavy-tailed (default %(default)s)")
    timing.add_argument("--seed", metavar="S", type=int, default=d.seed,
                        help="seed of answers and faults (default %(default)s)")

    faults = parser.add_argument_group("fault injection")
    for flag, what in FAULT_RATE_FLAGS:
        faults.add_argument(flag, metavar="RATE", type=float, default=0.0,
                            help=f"fraction {what}")
    faults.add_argument("--extra-prompt-tokens", metavar="N", type=int, default=0,
                        help="count every prompt as N tokens longer than sent")
    faults.add_argument("--die-after-s", metavar="S", type=float, default=None,
                        help="crash after S seconds: close the port, cut every connection")
    faults.add_argument("--down-window", metavar="START:END", type=_down_window,
                        action="append", default=[],
                        help="answer 503 on /health and generation from START to END seconds "
                             "after start (repeatable)")


def config_from_args(args: argparse.Namespace) -> SimConfig:
    """Build the config from parsed flags; raises ValueError naming the bad field."""
    return SimConfig(
        host=args.host,
        port=args.port,
        count=args.count,
        context_length=args.context_length,
        max_total_tokens=args.max_total_tokens,
        max_running_requests=args.max_running_requests,
        derived_slots=args.derived_slots,
        dp_size=args.dp_size,
        page_size=args.page_size,
        speculative_algorithm=args.speculative_algorithm,
        speculative_num_steps=args.speculative_num_steps,
        speculative_eagle_topk=args.speculative_eagle_topk,
        speculative_num_draft_tokens=_draft_tokens(args),
        spec_accept_rate=args.spec_accept_rate,
        spec_accept_spread=args.spec_accept_spread,
        per_request_spec_decode_metrics=args.per_request_spec_decode_metrics,
        enable_deterministic_inference=args.enable_deterministic_inference,
        skip_tokenizer_init=args.skip_tokenizer_init,
        thinking=args.thinking,
        no_reasoning_parser=args.no_reasoning_parser,
        allow_auto_truncate=args.allow_auto_truncate,
        chat_template=args.chat_template,
        flavor=args.flavor,
        llama_verbose=args.llama_verbose,
        health_delay_s=args.health_delay_s,
        max_queued_requests=args.max_queued_requests,
        ttft_ms=args.ttft_ms,
        prefill_tokens_per_s=args.prefill_tokens_per_s,
        chunked_prefill_size=args.chunked_prefill_size,
        prefix_cache=args.prefix_cache,
        mamba_track_interval=args.mamba_track_interval,
        cache_block_size=args.cache_block_size,
        tpot_ms=args.tpot_ms,
        slowdown=args.slowdown,
        speed=args.speed,
        output_tokens_mean=args.output_tokens_mean,
        seed=args.seed,
        model_name=args.model_name,
        api_key=args.api_key or os.environ.get(API_KEY_ENV) or None,
        error_rate=args.error_rate,
        queue_full_rate=args.queue_full_rate,
        hang_rate=args.hang_rate,
        drop_rate=args.drop_rate,
        json_invalid_rate=args.json_invalid_rate,
        extra_prompt_tokens=args.extra_prompt_tokens,
        die_after_s=args.die_after_s,
        down_windows=tuple(args.down_window),
        drain_timeout_s=args.drain_timeout_s,
    )


def _draft_tokens(args: argparse.Namespace) -> int:
    if args.speculative_num_draft_tokens is not None:
        return int(args.speculative_num_draft_tokens)
    default = SimConfig().speculative_num_draft_tokens
    return DEFAULT_DRAFT_TOKENS.get(args.speculative_algorithm or "", default)


def main(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT, then drain; returns an exit code."""
    try:
        config = config_from_args(args)
    except ValueError as error:
        print(f"fleetgen sim: error: {error}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    try:
        return asyncio.run(serve(config))
    except OSError as error:
        print(
            f"fleetgen sim: error: cannot listen on {config.host}:{config.port}: "
            f"{error.strerror or error}. Pick another --port or stop what uses it.",
            file=sys.stderr,
        )
        return EXIT_CANNOT_SERVE


async def serve(config: SimConfig) -> int:
    """Run a fleet until the first signal; a second signal cuts the drain short."""
    from fleetgen.simulator.server import SimFleet

    fleet = SimFleet(config)
    await fleet.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    drain: asyncio.Task[bool] | None = None

    def on_signal() -> None:
        if drain is not None:
            drain.cancel()
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal)
    try:
        print(ready_line(fleet), flush=True)
        await stop.wait()
        logger.info("signal received: draining (up to %.1f s)", config.drain_timeout_s)
        drain = asyncio.ensure_future(fleet.drain())
        try:
            await drain
        except asyncio.CancelledError:
            logger.warning("second signal: stopping without waiting for in-flight requests")
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        await fleet.stop()
    return EXIT_OK


def ready_line(fleet: SimFleet) -> str:
    """The one line scripts wait for: where the servers listen and their limits."""
    servers = fleet.servers
    first, last = servers[0], servers[-1]
    if len(servers) == 1:
        where = first.url
    elif last.port - first.port == len(servers) - 1:
        where = f"{first.url}..{last.port}"
    else:
        where = ", ".join(fleet.urls)
    config = fleet.config
    return (
        f"fleetgen sim: serving {len(servers)} server(s) on {where} "
        f"(context {config.context_length}, {config.total_slots} slots)"
    )


def _down_window(text: str) -> tuple[float, float]:
    start, sep, end = text.partition(":")
    try:
        if not sep:
            raise ValueError
        return float(start), float(end)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected START:END in seconds (e.g. 10:25), got {text!r}"
        ) from None
