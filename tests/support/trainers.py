"""Loading an export as training pipelines load it: Hugging Face `datasets` in a child process,
offline, with a cache of the test's own. (The drafter trainers' own loaders judge the exports
in tests/trainers, with their real code: tests/support/trainer_judge.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson

LOAD = """
import json, sys
from datasets import load_dataset

kind, path = sys.argv[1], sys.argv[2]
ds = load_dataset(kind, data_files=path, split="train")
print(json.dumps({"rows": ds.num_rows, "columns": ds.column_names,
                  "first": ds[0], "last": ds[-1]}, default=str))
"""


def load_dataset(kind: str, path: Path, cache: Path) -> dict[str, Any]:
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1",
               HF_HOME=str(cache / "hf"), HF_DATASETS_CACHE=str(cache / "datasets"))
    done = subprocess.run([sys.executable, "-c", LOAD, kind, str(path)], capture_output=True,
                          text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded: dict[str, Any] = orjson.loads(done.stdout.splitlines()[-1])
    return loaded
