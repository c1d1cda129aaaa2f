"""A row's own options (a `sampling` object, an OpenAI Batch body's options, a `json_schema`),
validated into fleetgen's names (contract.Sampling) with a reason naming the option when one
cannot be used. The run's flags are the defaults; the budget still caps `max_tokens`."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from producer.conversation import kind as _kind

MAX_N = 128  # samples of one row: more is a data-set design problem, not a sampling option


@dataclass(frozen=True)
class Options:
    sampling: dict[str, Any] = field(default_factory=dict)  # fleetgen's names (Sampling)
    max_tokens: int | None = None
    n: int | None = None
    json_schema: str | None = None  # compact JSON; from a Batch body's response_format


class OptionError(ValueError):
    """One option cannot be used; str() is the rejection reason."""


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _checked(convert: Callable[[Any], Any], ok: Callable[[Any], bool],
             rule: str) -> tuple[Callable[[Any], Any], str]:
    def check(value: Any) -> Any:
        got = convert(value)
        if got is None or not ok(got):
            raise ValueError(rule)
        return got
    return check, rule


# SGLang 0.5.23 `SamplingParams.normalize` (sampling/sampling_params.py MAX_STOP_COUNT): a 400.
MAX_STOPS = 32


def _stop(value: Any) -> list[str]:
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) \
            or len(stops) > MAX_STOPS:
        raise ValueError(f"a non-empty string or a list of at most {MAX_STOPS} of them")
    return stops


# name -> (validate and normalise, the rule a reason quotes). The ranges are SGLang's own
# (srt/sampling/sampling_params.py `verify`): a row outside them would only come back as a 400.
CHECKS: dict[str, tuple[Callable[[Any], Any], str]] = {
    "temperature": _checked(_number, lambda v: v >= 0, "a number >= 0"),
    "top_p": _checked(_number, lambda v: 0 < v <= 1, "a number in (0, 1]"),
    "top_k": _checked(_integer, lambda v: v == -1 or v >= 1, "an integer >= 1, or -1 (all)"),
    "min_p": _checked(_number, lambda v: 0 <= v <= 1, "a number in [0, 1]"),
    "repetition_penalty": _checked(_number, lambda v: 0 < v <= 2, "a number in (0, 2]"),
    "seed": _checked(_integer, lambda v: True, "an integer"),
    "stop": (_stop, f"a non-empty string or a list of at most {MAX_STOPS} of them"),
    "max_tokens": _checked(_integer, lambda v: v >= 1, "a positive integer"),
    "n": _checked(_integer, lambda v: 1 <= v <= MAX_N, f"an integer in 1..{MAX_N}"),
}
SAMPLING_NAMES = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed",
                  "stop")
# A `sampling` object takes every sampling name plus the row's cap and its number of samples.
SAMPLING_OBJECT = (*SAMPLING_NAMES, "max_tokens", "n")

# An OpenAI Batch body's options that fleetgen honours -> fleetgen's name. Both max_tokens and
# max_completion_tokens are caps (OpenAI renamed one to the other): with both, the smaller wins.
BODY_OPTIONS = {"temperature": "temperature", "top_p": "top_p", "seed": "seed", "stop": "stop",
                "max_tokens": "max_tokens", "max_completion_tokens": "max_tokens", "n": "n"}
# Accepted and not used: the servers' own model answers.
BODY_IGNORED = ("model",)
# Read by `response_format` below, not a sampling option.
BODY_STRUCTURED = "response_format"
# SGLang's own reading of response_format (srt/entrypoints/openai/serving_completions.py
# `OpenAIServingCompletion._build_sampling_params`): json_schema -> its `schema`, json_object ->
# the schema '{"type": "object"}', text -> nothing. fleetgen sends the same schema natively.
JSON_OBJECT_SCHEMA = '{"type":"object"}'

# An option at OpenAI's default asks for nothing, so it is no reason to refuse a row (null is
# the default of every option).
BODY_DEFAULTS: dict[str, Any] = {"stream": False, "logprobs": False, "frequency_penalty": 0,
                                 "presence_penalty": 0}
_LOGPROBS = "log-probabilities are asked for the whole run, with fleetgen produce --logprobs"
BODY_HINTS = {"logprobs": _LOGPROBS, "top_logprobs": _LOGPROBS,
              "stream": "results are written whole, never streamed"}


def sampling_object(value: Any) -> Options:
    """A plain row's `sampling` object: any of SAMPLING_OBJECT; null members are absent."""
    if not isinstance(value, dict):
        raise OptionError(f"bad_option: sampling must be an object, got {_kind(value)}")
    unknown = [k for k, v in value.items() if v is not None and k not in SAMPLING_OBJECT]
    if unknown:
        raise OptionError(f"unsupported_option: {_names('sampling', unknown)} not supported "
                          f"(a sampling object takes {', '.join(SAMPLING_OBJECT)})")
    return _options({k: (k, v) for k, v in value.items() if v is not None}, "sampling")


def body_options(body: Mapping[str, Any], consumed: tuple[str, ...]) -> Options:
    """An OpenAI Batch body's options (`consumed`: its messages or prompt, read elsewhere)."""
    unsupported = [k for k, v in body.items()
                   if v is not None and k not in BODY_OPTIONS and k not in BODY_IGNORED
                   and k != BODY_STRUCTURED and k not in consumed and not _is_default(k, v)]
    if unsupported:
        hints = "; ".join(dict.fromkeys(BODY_HINTS[k] for k in unsupported if k in BODY_HINTS))
        raise OptionError(f"unsupported_option: {_names('body', unsupported)} not supported"
                          + (f" ({hints})" if hints else ""))
    given = {k: (BODY_OPTIONS[k], v) for k, v in body.items()
             if k in BODY_OPTIONS and v is not None}
    options = _options(given, "body")
    schema = response_format(body.get(BODY_STRUCTURED))
    return options if schema is None else replace(options, json_schema=schema)


def response_format(value: Any) -> str | None:
    """A Batch body's `response_format` as the JSON Schema fleetgen sends (None: no constraint),
    read as SGLang reads it (JSON_OBJECT_SCHEMA above)."""
    if value is None:
        return None
    where = f"body.{BODY_STRUCTURED}"
    if not isinstance(value, dict):
        raise OptionError(f"bad_option: {where} must be an object, got {_kind(value)}")
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return JSON_OBJECT_SCHEMA
    if kind != "json_schema":
        raise OptionError(f"unsupported_option: {where}.type {_short(kind)} is not supported "
                          f"(fleetgen takes text, json_object and json_schema)")
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or spec.get("schema") is None:
        raise OptionError(f"bad_option: {where}.json_schema.schema is required for type "
                          f"json_schema")
    return json_schema(spec["schema"], f"{where}.json_schema.schema")


def _options(given: dict[str, tuple[str, Any]], where: str) -> Options:
    """`given`: the name in the row -> (fleetgen's name, value); every value checked."""
    values: dict[str, Any] = {}
    for name, (ours, value) in given.items():
        check, rule = CHECKS[ours]
        try:
            got = check(value)
        except ValueError:
            raise OptionError(f"bad_option: {where}.{name} must be {rule}, "
                              f"got {_short(value)}") from None
        # max_tokens and max_completion_tokens both given: the smaller cap wins.
        values[ours] = min(got, values[ours]) if ours == "max_tokens" and ours in values else got
    max_tokens, n = values.pop("max_tokens", None), values.pop("n", None)
    if values.get("stop") == []:
        del values["stop"]
    return Options(values, max_tokens, n)


def json_schema(value: Any, where: str = "json_schema") -> str:
    """A row's `json_schema`, an object or a JSON string holding one, as compact JSON (its
    keys in their order: a schema's property order is the order the model writes them in)."""
    schema = value
    if isinstance(value, str):
        try:
            schema = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            raise OptionError(f"bad_json_schema: {where} is not valid JSON: {exc}") from None
    if not isinstance(schema, dict):
        raise OptionError(f"bad_json_schema: {where} must be a JSON object (or a string "
                          f"holding one), got {_kind(schema)}")
    return orjson.dumps(schema).decode()


def _is_default(name: str, value: Any) -> bool:
    if name not in BODY_DEFAULTS:
        return False
    if isinstance(BODY_DEFAULTS[name], bool):
        return value is False
    return _number(value) == 0


def _names(where: str, names: list[str]) -> str:
    listed = ", ".join(f"{where}.{n}" for n in names)
    return f"{listed} {'is' if len(names) == 1 else 'are'}"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
