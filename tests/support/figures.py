"""Reading a bench's figures file as the smoke tests check it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson


def figures(figures_dir: Path, name: str) -> dict[str, Any]:
    data: dict[str, Any] = orjson.loads((figures_dir / f"{name}.json").read_bytes())
    # Every file says where, when, at which sizes and on which code it was measured.
    assert data["machine"]["cpus"] >= 1 and data["at"] and data["commit"]
    assert data["arguments"]
    return data
