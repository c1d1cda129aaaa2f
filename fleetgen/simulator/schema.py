"""Structured output: which JSON schemas a request may carry, and the document the model writes.

The checks are SGLang 0.5.23's (and vLLM 0.33's for `--flavor vllm`); the documents are the
simulator's own: for the schema features below it writes a document valid for the schema,
deterministic per request, and refuses a schema that uses any other feature with a 400 that
names the simulator, so a test never mistakes an unmodelled feature for a valid answer.

Modelled: `type` (object, array, string, integer, number, boolean, null, or a list of them),
`properties`, `required`, `additionalProperties`, `items`, `minItems`/`maxItems`, `enum`,
`const`, `anyOf`, `$ref` into `$defs`/`definitions`, `minimum`/`maximum` and their exclusive
forms, `minLength`/`maxLength`, and the annotations (`title`, `description`, ...).
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Iterator
from typing import Any

# SGLang 0.5.23, `constrained/json_schema_validation.py` `validate_xgrammar_json_schema`:
# keywords XGrammar 0.2 would accept and not enforce, the string formats it implements, and the
# string constraints it cannot combine; each is refused.
XGRAMMAR_IGNORED = frozenset({
    "contains", "dependentRequired", "dependentSchemas", "else", "if", "maxContains",
    "minContains", "multipleOf", "not", "then", "uniqueItems",
})
XGRAMMAR_FORMATS = frozenset({
    "date", "date-time", "duration", "email", "hostname", "ipv4", "ipv6", "json-pointer",
    "relative-json-pointer", "time", "uri", "uri-reference", "uri-template", "uuid",
})
# What the simulator writes documents for (the module docstring).
MODELLED = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
    "enum", "const", "anyOf", "$ref", "$defs", "definitions", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength", "title", "description",
    "default", "examples", "$schema", "$id", "$comment",
})
# Keywords whose value is a schema, a list of schemas, or a map of them.
_ONE = ("additionalProperties", "items", "not", "if", "then", "else", "contains",
        "propertyNames", "additionalItems", "unevaluatedItems", "unevaluatedProperties")
_LIST = ("allOf", "anyOf", "oneOf", "prefixItems")
_MAP = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")

# Below this depth objects get only their required properties and arrays their minimum, so a
# recursive `$ref` ends.
SHALLOW_DEPTH = 6
WORDS = ("alpha", "beta", "gamma", "delta", "data", "model", "answer", "value", "token", "row")


class SchemaRefused(ValueError):
    """The request's schema is refused; the message is the engine's (or the simulator's)."""


# ---------------------------------------------------------------- checks


def check_sglang(text: str) -> Any:
    """SGLang's grammar compilation (`constrained/xgrammar_backend.py` `dispatch_json`:
    `json.loads`, then `validate_xgrammar_json_schema`): a failure aborts the request with
    `Failed to compile json grammar: <reason>` (`GrammarManager.get_ready_grammar_requests`),
    a 400 (`Req.set_finish_with_abort` -> `_handle_abort_finish_reason` raises ValueError)."""
    try:
        schema = json.loads(text)
        _check_xgrammar(schema)
        check_modelled(schema)
    except (ValueError, SchemaRefused) as error:
        raise SchemaRefused(f"Failed to compile json grammar: {error}") from None
    return schema


def check_vllm(value: Any) -> Any:
    """vLLM 0.33's `structured_outputs.json` (a JSON string or an object): a string that is
    not JSON is `Invalid JSON grammar specification.` (`sampling_params.py`
    `_validate_structured_outputs`, backend `auto`); a feature XGrammar lacks falls back to
    another backend there, so only the simulator's own limits refuse the rest."""
    schema = value
    if isinstance(value, str):
        try:
            schema = json.loads(value)
        except ValueError:
            raise SchemaRefused("Invalid JSON grammar specification.") from None
    check_modelled(schema)
    return schema


def _check_xgrammar(schema: Any) -> None:
    for sub, pointer in subschemas(schema):
        ignored = sorted(XGRAMMAR_IGNORED & sub.keys())
        if ignored:
            raise SchemaRefused(f"JSON Schema at {pointer} is not supported by xgrammar: "
                                f"keyword(s) {', '.join(ignored)} would be ignored")
        if not _may_be_string(sub):
            continue
        if "format" in sub and sub["format"] not in XGRAMMAR_FORMATS:
            raise SchemaRefused(f"JSON Schema at {pointer} is not supported by xgrammar: "
                                f"string format {sub['format']!r} is not implemented")
        groups = [name for name, keys in (("format", ("format",)), ("pattern", ("pattern",)),
                                          ("minLength/maxLength", ("minLength", "maxLength")))
                  if any(key in sub for key in keys)]
        if len(groups) > 1:
            raise SchemaRefused(f"JSON Schema at {pointer} is not supported by xgrammar: "
                                f"constraints {', '.join(groups)} cannot be enforced together")


def check_modelled(schema: Any) -> None:
    """The simulator's own limit: a schema it cannot write a valid document for."""
    if not isinstance(schema, dict):
        raise SchemaRefused("JSON Schema at # is not supported by the simulator: "
                            "the schema must be a JSON object")
    for sub, pointer in subschemas(schema):
        unknown = sorted(sub.keys() - MODELLED)
        if unknown:
            raise SchemaRefused(f"JSON Schema at {pointer} is not supported by the simulator: "
                                f"keyword(s) {', '.join(unknown)}")


def _may_be_string(sub: dict[str, Any]) -> bool:
    kind = sub.get("type")
    return kind is None or kind == "string" or (isinstance(kind, list) and "string" in kind)


def subschemas(schema: Any, pointer: str = "#") -> Iterator[tuple[dict[str, Any], str]]:
    """Every schema object inside `schema` with its JSON pointer (instances, such as `enum`
    values or `default`, are not walked)."""
    if not isinstance(schema, dict):
        return
    yield schema, pointer
    for key in _ONE:
        child = schema.get(key)
        if isinstance(child, dict):
            yield from subschemas(child, f"{pointer}/{key}")
        elif key == "items" and isinstance(child, list):
            for index, item in enumerate(child):
                yield from subschemas(item, f"{pointer}/{key}/{index}")
    for key in _LIST:
        children = schema.get(key)
        if isinstance(children, list):
            for index, child in enumerate(children):
                yield from subschemas(child, f"{pointer}/{key}/{index}")
    for key in _MAP:
        children = schema.get(key)
        if isinstance(children, dict):
            for name, child in children.items():
                escaped = str(name).replace("~", "~0").replace("/", "~1")
                yield from subschemas(child, f"{pointer}/{key}/{escaped}")


# ---------------------------------------------------------------- documents


def document(schema: dict[str, Any], rng: random.Random) -> Any:
    """A document valid for `schema` (a checked one), drawn from `rng`."""
    return _value(schema, schema, rng, 0)


def _value(schema: Any, root: dict[str, Any], rng: random.Random, depth: int) -> Any:
    if not isinstance(schema, dict):
        return _string({}, rng)  # `true` or a missing schema: anything goes
    if "$ref" in schema:
        return _value(_resolve(schema["$ref"], root), root, rng, depth + 1)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return rng.choice(schema["enum"])
    if "anyOf" in schema:
        return _value(rng.choice(schema["anyOf"]), root, rng, depth + 1)
    kind = _kind(schema)
    if kind == "object":
        return _object(schema, root, rng, depth)
    if kind == "array":
        return _array(schema, root, rng, depth)
    if kind == "integer":
        return _integer(schema, rng)
    if kind == "number":
        return _number(schema, rng)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    return _string(schema, rng)


def _kind(schema: dict[str, Any]) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), kind[0] if kind else None)
    if kind is None:
        if "properties" in schema or "required" in schema:
            return "object"
        return "array" if "items" in schema else "string"
    return str(kind)


def _resolve(ref: Any, root: dict[str, Any]) -> Any:
    if not isinstance(ref, str) or not ref.startswith("#"):
        raise SchemaRefused(f"the simulator resolves only local $ref, got {ref!r}")
    target: Any = root
    for part in [p for p in ref[1:].split("/") if p]:
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(target, dict) or part not in target:
            raise SchemaRefused(f"$ref {ref!r} does not resolve")
        target = target[part]
    return target


def _object(schema: dict[str, Any], root: dict[str, Any], rng: random.Random,
            depth: int) -> dict[str, Any]:
    properties = schema.get("properties") or {}
    required = [name for name in schema.get("required") or [] if isinstance(name, str)]
    names = required if depth >= SHALLOW_DEPTH else list(properties)
    names += [name for name in required if name not in names]
    return {name: _value(properties.get(name, {}), root, rng, depth + 1) for name in names}


def _array(schema: dict[str, Any], root: dict[str, Any], rng: random.Random,
           depth: int) -> list[Any]:
    low = int(schema.get("minItems", 0))
    high = int(schema.get("maxItems", low + 3))
    count = low if depth >= SHALLOW_DEPTH else rng.randint(low, max(low, min(high, low + 3)))
    return [_value(schema.get("items", {}), root, rng, depth + 1) for _ in range(count)]


def _integer(schema: dict[str, Any], rng: random.Random) -> int:
    low = _bound(schema, "minimum", "exclusiveMinimum", 1)
    high = _bound(schema, "maximum", "exclusiveMaximum", -1)
    if low is None:
        low = 0 if high is None or high >= 0 else high - 1000
    if high is None:
        high = low + 1000
    first, last = math.ceil(low), math.floor(high)
    return rng.randint(first, max(first, last))


def _bound(schema: dict[str, Any], inclusive: str, exclusive: str, step: int) -> float | None:
    if isinstance(schema.get(exclusive), int | float) and not isinstance(
            schema.get(exclusive), bool):
        value = schema[exclusive]
        return (int(value) + step) if float(value).is_integer() else value
    value = schema.get(inclusive)
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _number(schema: dict[str, Any], rng: random.Random) -> float:
    low = schema.get("minimum", schema.get("exclusiveMinimum"))
    high = schema.get("maximum", schema.get("exclusiveMaximum"))
    low = float(low) if low is not None else (float(high) - 100.0 if high is not None else 0.0)
    high = float(high) if high is not None else low + 100.0
    value = round(rng.uniform(low, high), 3)
    if not low < value < high:  # exclusive bounds, and rounding past a bound
        value = (low + high) / 2
    return value


def _string(schema: dict[str, Any], rng: random.Random) -> str:
    low = int(schema.get("minLength", 0))
    high = int(schema.get("maxLength", max(low, 40)))
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 4)))
    while len(text) < low:
        text += " " + rng.choice(WORDS)
    return text[:high]


# ---------------------------------------------------------------- tokens

# The document's tokens: each word or punctuation mark with the whitespace before it, so the
# pieces join back to the exact text.
_PIECE = re.compile(r"\s*(?:\w+|[^\w\s])")


def dumps(doc: Any) -> str:
    return json.dumps(doc, ensure_ascii=False)


def pieces(text: str) -> list[str]:
    found = _PIECE.findall(text)
    assert "".join(found) == text, "a JSON text has no trailing whitespace"
    return found
