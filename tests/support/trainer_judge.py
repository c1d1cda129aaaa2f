"""The trainers tier's judge (tests/trainers): SpecForge's and speculators' own data code,
installed by `make trainers` into .venv/trainers, run on export files by tests/trainers/judge.py
in that interpreter; and a stand-in for vLLM's render endpoint, which speculators' conversation
path asks for the chat template's ids."""

from __future__ import annotations

import json
import os
import subprocess
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from tests.support.binaries import require_binary
from tests.support.content import tokenizer

ROOT = Path(__file__).resolve().parents[2]
TRAINERS_PYTHON = ROOT / ".venv" / "trainers" / "bin" / "python"
JUDGE = ROOT / "tests" / "trainers" / "judge.py"


def trainers_python() -> str:
    return require_binary("python", str(TRAINERS_PYTHON),
                          "the trainers' environment: `make trainers` installs it")


def run_judge(jobs: list[dict[str, Any]], work: Path) -> list[dict[str, Any]]:
    """Every job in one process of the trainers' interpreter; their answers in order."""
    python = trainers_python()
    (work / "jobs.json").write_text(json.dumps(jobs))
    env = dict(os.environ, HF_HOME=str(work / "hf"), HF_HUB_OFFLINE="1",
               HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH="")
    done = subprocess.run([python, str(JUDGE), str(work / "jobs.json"),
                           str(work / "judged.json")], capture_output=True, text=True,
                          timeout=600, env=env, cwd=work)
    assert done.returncode == 0, done.stderr[-4000:]
    answers: list[dict[str, Any]] = json.loads((work / "judged.json").read_text())
    return answers


class Render(BaseHTTPRequestHandler):
    """vLLM's `/v1/chat/completions/render` as speculators calls it: the model's chat template
    applied to the messages (with the request's chat_template_kwargs and tools), then
    tokenized as vLLM tokenizes a chat prompt (no special tokens added)."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        tok = tokenizer()
        text = tok.hf.apply_chat_template(  # type: ignore[union-attr]
            body["messages"], tokenize=False,
            add_generation_prompt=bool(body.get("add_generation_prompt")),
            tools=body.get("tools"), **(body.get("chat_template_kwargs") or {}))
        ids = tok.encode_batch([text])[0]
        limit = body.get("truncate_prompt_tokens")
        answer = json.dumps({"token_ids": ids[:limit] if limit else ids}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: object) -> None:
        pass
