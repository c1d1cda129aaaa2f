"""Prefix affinity for first turns (producer/affinity.py `first_routes`), end to end on four
simulated servers at the product's defaults: the samples of a long prompt meet one server,
which computes the prompt once; prompts opening with the same long system prompt meet one
server too; with --no-affinity the shared queue scatters both. Next turns of `--turns all`:
tests/e2e/test_turns.py; the figures on 8 GPUs: bench/affinity.py."""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import orjson

from fleetgen.local.fleet import LocalFleet
from tests.support.content import assert_fleet_content
from tests.support.pipeline import assert_exactly_once, run_pipeline, write_jsonl

# About 400 tokens: longer than PREFIX_BLOCK (256), so a prompt is routed by its first tokens.
FILLER = " ".join(f"word{k}" for k in range(200))
SAMPLING = {"temperature": 0.8}


def _runs(fleet: LocalFleet, prompts: Path, tmp_path: Path, name: str,
          **options: Any) -> dict[str, list[dict[str, Any]]]:
    """The same input with affinity on and off: its results each, checked exactly once and
    against the simulator's answers."""
    results = {}
    for side in ("on", "off"):
        out = tmp_path / f"{name}-{side}"
        # wait: as `fleetgen produce` runs by default (it stays, and sweeps workers' queues).
        run_pipeline(fleet, prompts, f"{name}-{side}", out, affinity=side == "on", wait=True,
                     **options)
        ids = {r["id"] for r in _rows(prompts)}
        n = options.get("n", 1)
        expected = ids if n == 1 else {f"{i}#{k}" for i in ids for k in range(n)}
        data = assert_exactly_once(out, expected)
        assert assert_fleet_content(fleet, prompts, data, sampling=options.get("sampling"))
        results[side] = data["results"]
    return results


def _rows(prompts: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in prompts.read_bytes().splitlines()]


def _together(results: list[dict[str, Any]], group: Any) -> tuple[float, float]:
    """(the share of results served by their group's most frequent worker, the share of the
    prompt tokens of all but each group's one that computed its prefix (the least cached: the
    first admitted, not always the first finished) that came from the cache)."""
    groups: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for r in results:
        groups[group(r)].append(r)
    together = sum(Counter(r["worker"] for r in rs).most_common(1)[0][1]
                   for rs in groups.values())
    later = [r for rs in groups.values()
             for r in sorted(rs, key=lambda r: r["cached_tokens"])[1:]]
    cached = sum(r["cached_tokens"] for r in later) / sum(r["prompt_tokens"] for r in later)
    return together / len(results), cached


def _assert_together(runs: dict[str, list[dict[str, Any]]], group: Any, what: str,
                     cached_gain: float, cached_floor: float = 0.8) -> None:
    """With affinity, at least 0.9 of each group on one server and `cached_floor` of the later
    prompts' tokens cached; without, the shared queue scatters them."""
    (on_together, on_cached), (off_together, off_cached) = (
        _together(runs[side], group) for side in ("on", "off"))
    print(f"\n{what}: on their group's server {on_together:.2f} (off {off_together:.2f}), "
          f"later prompts cached {on_cached:.2f} (off {off_cached:.2f})")
    assert on_together >= 0.9 and on_cached >= cached_floor, (on_together, on_cached)
    assert off_together <= 0.8 and off_cached <= on_cached - cached_gain, \
        (off_together, off_cached)


def test_a_long_prompts_samples_meet_one_server(fleet4: LocalFleet, tmp_path: Path) -> None:
    prompts = write_jsonl(tmp_path / "p.jsonl", [
        {"id": f"s{i}", "messages": [{"role": "user", "content": f"Prompt {i}: {FILLER}"}]}
        for i in range(16)])
    runs = _runs(fleet4, prompts, tmp_path, "samples", n=4, sampling=SAMPLING,
                 max_output_tokens=60)
    # The simulated servers cache as Qwen3.6's hybrid model does (fleetgen/simulator/
    # prefix_cache.py `MambaRadix`): a repeated prompt is reused only up to the state its
    # prefill kept, at a multiple of 64, and at most its length - 1. These prompts are 704
    # (11 x 64) and 705 tokens: a 705-token one's later samples reuse 704; a 704-token one's
    # cannot reach the state at 704, so the second computes it all and keeps a state at 640,
    # which the last two reuse. So 0.75 of the later samples' tokens is the most any server
    # gives (measured with affinity: 0.75; a token-exact cache gave 1.00), and scattered
    # samples reach it wherever they meet their row's server (measured 0.68 without affinity;
    # 0.59-0.83 over five runs with the token-exact cache): the cache share no longer tells
    # the two apart, the share on one server does (1.00 against 0.75).
    _assert_together(runs, lambda r: r["id"], "16 prompts x 4 samples on 4 servers", 0.0,
                     cached_floor=0.7)


def test_prompts_sharing_a_long_system_prompt_meet_one_server(fleet4: LocalFleet,
                                                              tmp_path: Path) -> None:
    systems = [f"You are assistant {k}. {FILLER}" for k in range(6)]
    prompts = write_jsonl(tmp_path / "p.jsonl", [
        {"id": f"q{i}", "system": i % 6, "messages": [
            {"role": "system", "content": systems[i % 6]},
            {"role": "user", "content": f"Question {i}: what is {i} squared?"}]}
        for i in range(48)])
    runs = _runs(fleet4, prompts, tmp_path, "system", max_output_tokens=60)
    _assert_together(runs, lambda r: r["system"], "48 prompts, 6 system prompts, 4 servers",
                     0.1)
