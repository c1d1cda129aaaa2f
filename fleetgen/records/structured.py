"""Structured output (pure): whether an answer is a JSON document valid for the row's schema.

The worker checks each answer of a row that asked for a schema and writes the verdict into its
result record (`json_valid`, and `json_error` when it is not), so the drainer counts invalid
answers from the records alone, and rebuilds that count from its files on every start.
"""

from __future__ import annotations

import functools
import json
from typing import Any

# Messages are cut to this length: a record carries the reason, not a dump of the document.
MAX_ERROR_CHARS = 200


@functools.lru_cache(maxsize=64)
def _validator(schema_json: str) -> Any:
    """One compiled validator per schema text (a run usually has one; per-row schemas a few).
    jsonschema is imported here: every process imports the outcomes, few validate."""
    import jsonschema

    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def json_error(answer: str, schema_json: str) -> str | None:
    """None when `answer` is a JSON document valid for the schema, else why not (one line).
    A schema that is itself not valid JSON Schema is reported as such: the engine accepted
    it, so the answer cannot be judged."""
    from jsonschema.exceptions import SchemaError, best_match

    try:
        validator = _validator(schema_json)
    except (ValueError, SchemaError) as exc:
        return _short(f"the schema is not a valid JSON Schema: {_first_line(exc)}")
    try:
        document = json.loads(answer)
    except ValueError as exc:
        return _short(f"not JSON: {exc}")
    error = best_match(validator.iter_errors(document))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path)
    return _short(f"at /{where}: {error.message}")


def _first_line(exc: Exception) -> str:
    text = getattr(exc, "message", None) or str(exc)
    return str(text).splitlines()[0]


def _short(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS - 1] + "…"
