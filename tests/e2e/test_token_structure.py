"""A thinking run with `--token-ids`, through the real CLI, on each engine flavour the simulator
speaks (SGLang's native /generate, SGLang's /v1/completions, vLLM's): every answer's
`output_ids`, decoded with Qwen3.6's tokenizer, are its reasoning, `</think>`, its completion and
the end-of-turn token `<|im_end|>`, in that order; the text parts tokenized again are the same
ids (what a trainer that re-tokenizes the text gets); and the tokens export's answer part (the
ids under mask 1) is exactly those ids."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from fleetgen.local.fleet import LocalFleet
from tests.support.content import tokenizer
from tests.support.fleet import started_fleet
from tests.support.pipeline import assert_exactly_once

EOS = 248046
ROWS = 24
FLAVOURS = {
    "sglang-native": ([], {}, []),
    "sglang-v1": ([], {"FLEETGEN_ENGINE_PROTOCOL": "openai"}, ["--engine-protocol", "openai"]),
    "vllm": (["--flavor", "vllm"], {}, []),
}


@pytest.fixture(scope="module", params=list(FLAVOURS))
def flavoured(request: pytest.FixtureRequest,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, LocalFleet]]:
    sim_args, worker_env, _ = FLAVOURS[request.param]
    for fleet in started_fleet(tmp_path_factory.mktemp(f"structure-{request.param}"), gpus=1,
                               output_tokens_mean=20, sim_args=["--thinking", *sim_args],
                               worker_env=worker_env):
        yield request.param, fleet


def fleetgen(fleet: LocalFleet, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "fleetgen", *args], capture_output=True,
                          text=True, timeout=240,
                          env=dict(os.environ, FLEETGEN_REDIS_URL=fleet.redis_url))
    assert done.returncode == 0, f"{args[:2]}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
    return done.stdout


def test_every_answer_s_ids_are_reasoning_think_end_completion_and_end_of_turn(
        flavoured: tuple[str, LocalFleet], tmp_path: Path) -> None:
    flavour, fleet = flavoured
    prompts, out = tmp_path / "p.jsonl", tmp_path / "out"
    prompts.write_bytes(b"".join(orjson.dumps({"id": f"q{i}", "messages": [
        {"role": "user", "content": f"Question {i}: what is {i} x 7? données 😀"}]}) + b"\n"
        for i in range(ROWS)))
    # Room for every answer (lognormal lengths of mean 20): each ends by itself.
    fleetgen(fleet, "produce", str(prompts), "--run", f"structure-{flavour}",
             "--engine-url", fleet.engine_url(0), "--max-output-tokens", "3000",
             "--token-ids", *FLAVOURS[flavour][2])
    fleetgen(fleet, "drain", "--run", f"structure-{flavour}", "--out", str(out))
    results = assert_exactly_once(out, {f"q{i}" for i in range(ROWS)})["results"]
    tok = tokenizer()
    for r in results:
        ids: list[int] = r["output_ids"]
        assert r["finish_reason"] == "stop" and not r["reasoning_unfinished"], r["id"]
        assert r["reasoning"] and r["completion"] and ids[-1] == EOS, r["id"]
        # Qwen3.6's template opens the think block in the prompt: the answer starts inside it.
        parts = f"{r['reasoning']}\n</think>\n\n{r['completion']}"
        assert tok.decode(ids) == parts + "<|im_end|>", r["id"]
        assert tok.encode_batch([parts])[0] == ids[:-1], r["id"]
        assert len(ids) == r["completion_tokens"] and r["reasoning_tokens"] == (
            ids.index(248069) + 1)

    said = fleetgen(fleet, "export", str(out), "--format", "tokens")
    assert f"{ROWS} lines" in said, said
    lines = {x["id"]: x for x in map(orjson.loads,
                                     (out / "export.tokens.jsonl").read_bytes().splitlines())}
    for r in results:
        line = lines[r["id"]]
        answer = [t for t, m in zip(line["input_ids"], line["loss_mask"], strict=True) if m]
        assert answer == r["output_ids"] and line["input_ids"][-len(answer):] == answer
    print(f"\n{flavour}: {ROWS} answers, ids = reasoning + </think> + completion + <|im_end|>; "
          f"tokens {json.dumps(sorted(len(r['output_ids']) for r in results)[::6])}")
