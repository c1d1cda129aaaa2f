"""Flag values that several commands parse the same way (produce, the demo, doctor)."""

from __future__ import annotations

import json
from typing import Any

from fleetgen.base.errors import ConfigError


def json_object(text: str, what: str) -> dict[str, Any]:
    """`text` (a flag's value, named `what` in the message) as a JSON object; ConfigError,
    one line, if it is not JSON or not an object."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{what} is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ConfigError(f"{what} must be a JSON object, got {type(value).__name__}")
    return value
