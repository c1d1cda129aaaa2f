"""SGLang's /generate contract gate: the closed sampling schema and its serde error strings.

Follows `api/v1/api_types.py` (`decode_GenerateRequest`, `decode_SamplingParams`,
`_unknown_field`, `_unexpected`) of SGLang 0.5.23 as called by
`srt/entrypoints/api_contract.py` `generate_contract_error`: the first violation
becomes a 400 whose body is `{"error": "<string>"}`. Top-level unknown keys are
ignored; unknown keys inside `sampling_params` are refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class ContractError(ValueError):
    """The body breaks the JSON contract; the message is serde's text."""


def unexpected(value: Any) -> str:
    """How serde names a JSON value in an error (`_unexpected`)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean `{'true' if value else 'false'}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{value}`"
    if isinstance(value, str):
        return f'string "{value}"'
    if isinstance(value, list):
        return "sequence"
    if isinstance(value, dict):
        return "map"
    return type(value).__name__


def _invalid(value: Any, expected: str) -> ContractError:
    return ContractError(f"invalid type: {unexpected(value)}, expected {expected}")


def _int(value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _invalid(value, "i64")


def _float(value: Any) -> None:
    # serde's f64 takes integers too.
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise _invalid(value, "f64")


def _bool(value: Any) -> None:
    if not isinstance(value, bool):
        raise _invalid(value, "a boolean")


def _str(value: Any) -> None:
    if not isinstance(value, str):
        raise _invalid(value, "a string")


def _seq(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise _invalid(value, "a sequence")
    return value


def _one_or_list(one: Callable[[Any], None], name: str) -> Callable[[Any], None]:
    """SGLang's `<name>` (StringOrList, ...): one value `one` accepts, or an array of them. A
    bad item is named by `one`; a bad single value by the union type."""
    def check(value: Any) -> None:
        if isinstance(value, list):
            for item in value:
                one(item)
            return
        try:
            one(value)
        except ContractError:
            raise _invalid(value, f"a value or an array of values for {name}") from None

    return check


_str_or_list = _one_or_list(_str, "StringOrList")


def _int_list(value: Any) -> None:
    for item in _seq(value):
        _int(item)


def _float_map(value: Any) -> None:
    if not isinstance(value, dict):
        raise _invalid(value, "a map")
    for item in value.values():
        _float(item)


def _str_list(value: Any) -> None:
    for item in _seq(value):
        _str(item)


def _anything(value: Any) -> None:
    return None


def _watermark(value: Any) -> None:
    _struct(value, "WatermarkRequestConfig", _WATERMARK_FIELDS)


Check = Callable[[Any], None]

# decode_SamplingParams, in its field order (the order the error message lists).
SAMPLING_FIELDS: dict[str, Check] = {
    "max_new_tokens": _int, "stop": _str_or_list, "stop_token_ids": _int_list,
    "stop_regex": _str_or_list, "temperature": _float, "top_p": _float, "top_k": _int,
    "min_p": _float, "frequency_penalty": _float, "presence_penalty": _float,
    "repetition_penalty": _float, "min_new_tokens": _int, "n": _int, "json_schema": _str,
    "regex": _str, "ebnf": _str, "structural_tag": _str, "ignore_eos": _bool,
    "skip_special_tokens": _bool, "spaces_between_special_tokens": _bool,
    "no_stop_trim": _bool, "stream_interval": _int, "logit_bias": _float_map,
    "sampling_seed": _int, "custom_params": _anything, "beam_width": _int,
    "watermark": _watermark, "choice": _str_list,
}
_WATERMARK_FIELDS: dict[str, Check] = {"enabled": _bool, "key": _str, "context_window": _int}


def unknown_field(key: str, fields: tuple[str, ...]) -> ContractError:
    """serde's `unknown_field` text (`_unknown_field`)."""
    if not fields:
        return ContractError(f"unknown field `{key}`, there are no fields")
    if len(fields) == 1:
        return ContractError(f"unknown field `{key}`, expected `{fields[0]}`")
    if len(fields) == 2:
        return ContractError(f"unknown field `{key}`, expected `{fields[0]}` or `{fields[1]}`")
    listed = ", ".join(f"`{name}`" for name in fields)
    return ContractError(f"unknown field `{key}`, expected one of {listed}")


def _struct(value: Any, name: str, fields: dict[str, Check]) -> None:
    if not isinstance(value, dict):
        raise _invalid(value, f"struct {name}")
    for key, item in value.items():
        check = fields.get(key)
        if check is None:
            raise unknown_field(key, tuple(fields))
        if item is not None:  # null means the default for every field
            check(item)


def _sampling_params_or_list(value: Any) -> None:
    if isinstance(value, list):
        for item in value:
            _struct(item, "SamplingParams", SAMPLING_FIELDS)
    elif isinstance(value, dict):
        _struct(value, "SamplingParams", SAMPLING_FIELDS)
    else:
        raise _invalid(value, "a value or an array of values for SamplingParamsOrList")


def _token_ids_or_list(value: Any) -> None:
    if not isinstance(value, list):
        raise _invalid(value, "a value or an array of values for TokenIdsOrList")
    # [] and [number, ...] are one prompt; anything else is a batch.
    if not value or (isinstance(value[0], int | float) and not isinstance(value[0], bool)):
        _int_list(value)
    else:
        for item in _seq(value):
            _int_list(item)


_bool_or_list = _one_or_list(_bool, "BoolOrList")
_int_or_list = _one_or_list(_int, "Int64OrList")


# The GenerateRequest fields the simulator reads; its other fields are not checked.
_GENERATE_FIELDS: dict[str, Check] = {
    "rid": _str_or_list, "text": _str_or_list, "input_ids": _token_ids_or_list,
    "stream": _bool, "sampling_params": _sampling_params_or_list,
    "return_logprob": _bool_or_list, "top_logprobs_num": _int_or_list,
    "return_text_in_logprobs": _bool, "require_reasoning": _bool,
}


def generate_contract_error(body: Any) -> str | None:
    """The contract violation in a /generate body, or None (`generate_contract_error`)."""
    try:
        if not isinstance(body, dict):
            raise _invalid(body, "struct GenerateRequest")
        # In body order, as the decoder walks it: the first bad key is the one reported.
        for key, value in body.items():
            check = _GENERATE_FIELDS.get(key)
            if check is not None and value is not None:
                check(value)
    except ContractError as error:
        return str(error)
    return None
