"""A simulated SGLang 0.5.23 server fleet: the real HTTP protocol, limits and errors, no GPU.

docs/simulator.md lists each modelled behaviour and the SGLang function it follows.
Choices a user of the simulator may want to know:

- `text` prompts are counted crudely: one token per word (`\\w+`) and one per
  punctuation mark; `input_ids` are counted exactly. `extra_prompt_tokens` is
  added to both before the context rules run.
- The answer to a prompt is fixed by (seed, prompt, sample index, the request's
  `sampling_seed`): its natural length is lognormal (sigma 1) with mean
  `output_tokens_mean`; a lower `max_new_tokens` gives a prefix of the same answer.
  `cached_tokens` and `num_retractions` depend on what the server served before.
- Time to first token is `ttft_ms` plus the prompt tokens the prefix cache does not hold
  over `prefill_tokens_per_s` (free in `SimConfig`, 8000 in `fleetgen sim`), and a prefill
  holds back every running request's decoding meanwhile (fleetgen/simulator/prefill.py).
  A finished request leaves its prompt and output in the cache, so a next turn hits it.
- Only non-streaming requests are served; `"stream": true` is a 400.
- `n > 1` returns n answers per prompt, grouped by prompt, each with a fresh uuid id.
- Faults hit only requests that passed validation (a 400 is never masked).
  A hung request holds no slot and a drain does not wait for it.
- "Down" (down windows, `POST /_sim/down`) answers 503 on /health, /ready and the
  generation endpoints while the port stays open; `die_after_s` closes the port
  and cuts connections instead. A drain (SIGTERM) turns /health and /ready 503
  but still serves generation, as SGLang does. "Hung" (`POST /_sim/hang`) is the
  opposite: /health and /ready answer 200 and every generation request hangs, until
  the process is restarted (a generate path wedged behind a live HTTP server).
- `fleetgen_sim_requests_total{code}` counts generation requests by status;
  `499` means the client went away first, `dropped` an injected drop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fleetgen.simulator.config import SimConfig

if TYPE_CHECKING:
    from fleetgen.simulator.server import SimFleet, SimServer, SimThread, run_in_thread

__all__ = ["SimConfig", "SimFleet", "SimServer", "SimThread", "run_in_thread"]


def __getattr__(name: str) -> Any:
    # The server pulls in aiohttp; `fleetgen --help` should not pay for that.
    if name in {"SimFleet", "SimServer", "SimThread", "run_in_thread"}:
        from fleetgen.simulator import server

        return getattr(server, name)
    raise AttributeError(f"module 'fleetgen.simulator' has no attribute {name!r}")
