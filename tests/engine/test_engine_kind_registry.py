"""A made-up engine kind, declared in this file alone and loaded through FLEETGEN_ENGINE_KINDS,
works end to end: `fleetgen doctor` takes its protocol as a choice, and `fleetgen run` detects
it, checks it, sizes its workers from it and writes every row, with no product module edited.

"toyserve" speaks a protocol of its own ("toy"): GET /toy/info says its context and slots,
POST /toy/generate takes token ids, GET /healthz is its readiness; every builtin endpoint is a
404, so no builtin kind claims it."""

from __future__ import annotations

import json
import os
import subprocess
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, ClassVar

import httpx
import orjson

from fleetgen import errors
from fleetgen.engine import kinds
from fleetgen.engine.api import PLAIN, Engine, GenerateOptions, LengthRule, ServerLimits
from fleetgen.engine.client import EngineClient
from fleetgen.engine.http import error_message, get_json, server_client
from fleetgen.records.outcomes import Generation
from tests.support.cli import fleetgen_cli
from tests.support.httpd import serving
from tests.support.pipeline import make_prompts

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = f"{__name__}:KINDS"
CONTEXT = 2048
SLOTS = 3
ANSWER_TOKENS = 5


# -- the kind, as a plug-in module declares it --------------------------------------------------
class ToyRule:
    """toyserve refuses a prompt of `context` tokens or more and a budget past the context."""

    name = "toyserve"
    refuses_excess_budget = True

    def input_limit(self, limits: ServerLimits) -> int:
        return limits.context_length

    def room(self, prompt_tokens: int, limits: ServerLimits) -> int:
        return limits.context_length - prompt_tokens

    def correction(self, error: errors.ContextLengthError, max_tokens: int) -> int | None:
        return None


RULE = ToyRule()


class ToyClient(EngineClient):
    rule: LengthRule = RULE

    def generate(self, input_ids: list[int], max_new_tokens: int, sampling: dict[str, Any],
                 rid: str, options: GenerateOptions = PLAIN) -> Generation:
        data = self._post("/toy/generate", {"ids": input_ids, "max_new": max_new_tokens})
        return Generation(text=data["text"], finish_reason=data["finish"],
                          prompt_tokens=data["prompt"], completion_tokens=len(data["ids"]),
                          cached_tokens=0, latency_s=0.0, output_ids=data["ids"])

    def refusal(self, response: httpx.Response, body: dict[str, Any]) -> errors.EngineError:
        if response.status_code == 400:
            return errors.ContextLengthError(error_message(response), 400, None, None)
        return errors.RetryableError(error_message(response), response.status_code)


def read_limits(base_url: str, api_key: str | None = None,
                timeout_s: float = 10.0) -> ServerLimits:
    with server_client(base_url, api_key=api_key, timeout_s=timeout_s) as http:
        info = get_json(http, "/toy/info")
    return ServerLimits(context_length=info["context"], engine="toyserve",
                        max_running_requests=info["slots"], model=info["model"])


class ToyProtocol:
    name = "toy"
    rule: LengthRule = RULE

    def rule_for(self, limits: ServerLimits) -> LengthRule:
        return RULE

    def connect(self, base_url: str, *, timeout_s: float, concurrency: int,
                api_key: str | None = None) -> Engine:
        return ToyClient(base_url, timeout_s=timeout_s, concurrency=concurrency,
                         api_key=api_key)

    def read_limits(self, base_url: str, *, api_key: str | None = None,
                    timeout_s: float = 10.0) -> ServerLimits:
        return read_limits(base_url, api_key, timeout_s)

    def pool_size(self, limits: ServerLimits) -> int | None:
        return kinds.pool_size(limits)


def identify(http: httpx.Client) -> str | None:
    return "/toy/info answers (toyserve)" if http.get("/toy/info").status_code == 200 else None


KINDS = (ToyProtocol(), kinds.EngineKind(
    name="toyserve", protocol="toy", rule=RULE, read_limits=read_limits, identify=identify,
    ready_paths=("/healthz",)))


# -- a stub toyserve ----------------------------------------------------------------------------
class ToyServe(BaseHTTPRequestHandler):
    generated: ClassVar[list[tuple[int, int]]] = []  # (prompt tokens, max_new) of each answer

    def do_GET(self) -> None:
        if self.path == "/toy/info":
            self._send(200, {"context": CONTEXT, "slots": SLOTS, "model": "toy-1"})
        elif self.path == "/healthz":
            self._send(200, {"ok": True})
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/toy/generate":
            self._send(404, {"error": "not found"})
            return
        prompt, wanted = len(body["ids"]), body["max_new"]
        if prompt >= CONTEXT or prompt + wanted > CONTEXT:
            self._send(400, {"error": f"{prompt} + {wanted} tokens exceed {CONTEXT}"})
            return
        ids = list(range(100, 100 + min(wanted, ANSWER_TOKENS)))
        self.generated.append((prompt, wanted))
        self._send(200, {"text": " ".join(f"t{i}" for i in ids), "ids": ids, "prompt": prompt,
                         "finish": "length" if wanted <= ANSWER_TOKENS else "stop"})

    def _send(self, status: int, body: object) -> None:
        data = orjson.dumps(body)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def plugin_env() -> dict[str, str]:
    """The variable that names this module, reaching `fleetgen` and the workers it spawns
    (this module importable from the repository's root)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "FLEETGEN_ENGINE_KINDS": PLUGIN, "PYTHONPATH": path}


def test_a_made_up_kind_is_a_choice_of_doctor_and_passes_its_checks() -> None:
    with serving(ToyServe) as url:
        done = subprocess.run(fleetgen_cli("doctor", "--engine-url", url, "--engine-protocol",
                                           "toy"), capture_output=True, text=True,
                              timeout=120, env=plugin_env())
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"refuses a {CONTEXT}-token input: 400" in done.stdout, done.stdout
    without = subprocess.run(fleetgen_cli("doctor", "--engine-url", "http://127.0.0.1:9",
                                          "--engine-protocol", "toy"), capture_output=True,
                             text=True, timeout=60, env={**os.environ,
                                                         "FLEETGEN_ENGINE_KINDS": ""})
    assert without.returncode == 2 and "invalid choice: 'toy'" in without.stderr, without


def test_fleetgen_run_against_a_made_up_kind_writes_every_row(tmp_path: Path) -> None:
    prompts, out = tmp_path / "p.jsonl", tmp_path / "out"
    ids = set(make_prompts(prompts, 40)["good"])
    ToyServe.generated.clear()
    with serving(ToyServe) as url:
        done = subprocess.run(fleetgen_cli("run", str(prompts), "--engine-url", url, "--out",
                                           str(out), "--max-output-tokens", "16"),
                              capture_output=True, text=True, timeout=300, env=plugin_env(),
                              cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [orjson.loads(line) for line in (out / "results.jsonl").read_bytes().splitlines()]
    assert {r["id"] for r in rows} == ids and len(rows) == len(ids)
    # Every budget is the kind's own rule, capped: context - prompt, at most 16.
    assert all(r["max_tokens"] == min(16, CONTEXT - r["prompt_tokens"]) for r in rows), rows[0]
    assert all(r["completion_tokens"] == ANSWER_TOKENS for r in rows)
    assert len([g for g in ToyServe.generated if g[1] == 16]) >= len(ids)
