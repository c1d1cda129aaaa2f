"""SGLang's native /generate: its request body (single, batch, parallel samples), its answer
and its error bodies."""

from __future__ import annotations

import uuid
from typing import Any

from fleetgen.simulator import answers
from fleetgen.simulator.config import SimConfig
from fleetgen.simulator.contract import generate_contract_error
from fleetgen.simulator.request import (
    ApiError,
    Extras,
    GenerationRequest,
    InFlight,
    SamplingParams,
    ServedItem,
    bad_request,
    build_job,
    http_exception_body,
    parse_sampling,
    refuse_duplicates,
    refuse_stream,
    token_ids,
)
from fleetgen.simulator.spec import meta_info_fields, steps_for

WEIGHT_VERSION = "default"


def native_error_body(error: ApiError) -> Any:
    """Contract gate: a string; ValueError: {"error": {...}}; 5xx: an HTTPException body."""
    if error.contract:
        return {"error": error.message}
    if error.status < 500:
        return {"error": {"message": error.message}}
    return http_exception_body(error)


def parse_generate(body: Any, config: SimConfig, in_flight: InFlight) -> GenerationRequest:
    """Turn a native /generate body into checked items (400 on the first bad one)."""
    error = generate_contract_error(body)
    if error is not None:
        raise ApiError(400, error, contract=True)
    assert isinstance(body, dict)  # the contract gate refuses anything else
    refuse_stream(body)
    prompts, batch = _native_prompts(body)
    samplings = _per_prompt(body.get("sampling_params"), len(prompts), batch)
    n = samplings[0].n if samplings else 1
    if any(s.n != n for s in samplings):
        raise bad_request(
            "The parallel_sample_num should be the same for all samples in sample params."
        )
    # `_handle_parallel_sampling`: n > 1 turns even a single prompt into a batch.
    batch = batch or n > 1
    rids = _rids(body.get("rid"), len(prompts), n, batch)
    refuse_duplicates(rids, in_flight)
    return build_job(prompts, samplings, rids, batch, config, _native_extras(body))


def _native_extras(body: dict[str, Any]) -> Extras:
    """`GenerateReqInput`'s `return_logprob`, `top_logprobs_num`, `return_text_in_logprobs`
    and `require_reasoning` (types checked by the contract gate). `logprob_start_len` is left
    at -1: only output tokens are scored (`Scheduler.handle_generate_request`)."""
    wanted, top = body.get("return_logprob"), body.get("top_logprobs_num")
    if isinstance(wanted, list) or isinstance(top, list):
        raise bad_request("The simulator takes return_logprob and top_logprobs_num as single "
                          "values, not per-item lists.")
    return Extras(logprobs=int(top or 0) if wanted else None,
                  logprob_text=bool(body.get("return_text_in_logprobs")),
                  require_reasoning=bool(body.get("require_reasoning")))


def _native_prompts(body: dict[str, Any]) -> tuple[list[list[int] | str], bool]:
    input_ids, text = body.get("input_ids"), body.get("text")
    if input_ids is None and text is None:
        raise bad_request("Either text, input_ids or input_embeds should be provided.")
    if text is not None:
        if isinstance(text, str):
            return [text], False
        return list(text), True
    if isinstance(input_ids, list) and not input_ids:
        raise bad_request("input_ids cannot be empty.")
    if isinstance(input_ids, list) and all(isinstance(i, list) for i in input_ids):
        return [token_ids(ids) for ids in input_ids], True
    return [token_ids(input_ids)], False


def _per_prompt(raw: Any, count: int, batch: bool) -> list[SamplingParams]:
    if isinstance(raw, list):
        if not batch or len(raw) != count:
            raise bad_request("A list of sampling_params needs a batch of the same length.")
        return [parse_sampling(one) for one in raw]
    return [parse_sampling(raw)] * count


def _rids(raw: Any, count: int, n: int, batch: bool) -> list[str]:
    """`_normalize_rid`: a string rid of a batch is a prefix, `<rid>_<i>` per expanded item."""
    if not batch:
        return [raw if isinstance(raw, str) else uuid.uuid4().hex]
    expanded = count * n
    if raw is None:
        return [uuid.uuid4().hex for _ in range(expanded)]
    if isinstance(raw, str):
        return [f"{raw}_{i}" for i in range(expanded)]
    if len(raw) != count:
        raise bad_request(
            "The specified rids length mismatch with the batch_size for batch processing."
        )
    rids = [rid for rid in raw for _ in range(n)] if n > 1 else list(raw)
    if len(set(raw)) != len(raw):
        duplicates = sorted({rid for rid in raw if raw.count(rid) > 1}, key=raw.index)
        raise bad_request(f"Duplicate request IDs detected within the request: {duplicates}")
    return rids


def render_native(job: GenerationRequest, outcomes: list[ServedItem], config: SimConfig) -> Any:
    bodies = [_native_answer(outcome, config, job.extras) for outcome in outcomes]
    return bodies if job.batch else bodies[0]


def _native_answer(outcome: ServedItem, config: SimConfig, extras: Extras) -> dict[str, Any]:
    completion = outcome.completion
    tokens = completion.completion_tokens
    meta: dict[str, Any]
    if outcome.waiting_abort:
        # `_handle_abort_req`: no prompt_tokens, cached_tokens or num_retractions.
        meta = {
            "id": outcome.item.rid,
            "finish_reason": completion.finish_reason,
            "weight_version": WEIGHT_VERSION,
            "e2e_latency": round(outcome.e2e_latency_s, 6),
            "weight_versions": [{"version": WEIGHT_VERSION, "start": 0, "end": 0}],
            "completion_tokens": tokens,
        }
        return {"text": completion.text, "output_ids": completion.output_ids, "meta_info": meta}
    # `_handle_batch_output` (+ e2e_latency when finished).
    cached = outcome.cached_tokens
    meta = {
        "id": outcome.item.rid,
        "finish_reason": completion.finish_reason,
        "prompt_tokens": outcome.item.prompt_tokens,
        "weight_version": WEIGHT_VERSION,
        "num_retractions": outcome.num_retractions,
        **_native_logprobs(outcome, config, extras),
        "reasoning_tokens": answers.reasoning_tokens(
            completion.output_ids, config.reasoning_parser is not None,
            extras.require_reasoning),
        "completion_tokens": tokens,
        "cached_tokens": cached,
        "weight_versions": [{"version": WEIGHT_VERSION, "start": 0, "end": tokens}],
        "cached_tokens_details": {"device": cached, "host": 0} if cached else None,
        "e2e_latency": round(outcome.e2e_latency_s, 6),
        **_spec_fields(outcome, config),
    }
    answer: dict[str, Any] = {"output_ids": completion.output_ids, "meta_info": meta}
    if not config.skip_tokenizer_init:  # BatchTokenIDOutput carries no text
        answer = {"text": completion.text, **answer}
    return answer


def _spec_fields(outcome: ServedItem, config: SimConfig) -> dict[str, Any]:
    """The speculative fields a finished request gets after `e2e_latency` when the server runs
    a speculative algorithm (`_handle_batch_output` -> `_calculate_spec_decoding_metrics`)."""
    if config.speculative_algorithm is None:
        return {}
    tokens = outcome.completion.completion_tokens
    item = outcome.item
    return meta_info_fields(steps_for(config, item.key, item.prompt, tokens), tokens)


def _native_logprobs(outcome: ServedItem, config: SimConfig, extras: Extras) -> dict[str, Any]:
    """`TokenizerManager.add_logprob_to_meta_info`: `[logprob, token_id, text-or-null]` per
    output token (`detokenize_logprob_tokens`; text only with `return_text_in_logprobs` and a
    tokenizer), the top-K lists when `top_logprobs_num` > 0, and the input's, empty: with
    `logprob_start_len` -1 no input token is scored."""
    if extras.logprobs is None:
        return {}
    completion = outcome.completion
    with_text = extras.logprob_text and not config.skip_tokenizer_init
    texts = completion.token_texts() if with_text else [None] * completion.completion_tokens
    scored = answers.token_logprobs(outcome.item.key, completion.output_ids, extras.logprobs)
    fields: dict[str, Any] = {
        "input_token_logprobs": [],
        "output_token_logprobs": [[chosen, token, text] for (chosen, _), token, text
                                  in zip(scored, completion.output_ids, texts, strict=True)],
        "output_token_logprobs_length": completion.completion_tokens,
    }
    if extras.logprobs > 0:
        # The simulator has no tokenizer: a runner-up that is not a token of the answer is
        # shown by its id.
        known = dict(zip(completion.output_ids, texts, strict=True))
        fields["input_top_logprobs"] = []
        fields["output_top_logprobs"] = [
            [[value, token, known.get(token, f"<{token}>") if with_text else None]
             for value, token in top]
            for _, top in scored]
    return fields
