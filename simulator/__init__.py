"""A simulated SGLang server fleet: the real HTTP protocol, limits and errors, no GPU.

Choices a user of the simulator may want to know:

- `text` prompts are counted crudely: one token per word (`\\w+`) and one per
  punctuation mark; `input_ids` are counted exactly. `extra_prompt_tokens` is
  added to both before the context rules run.
- The answer to a prompt is fixed by (seed, prompt, sample index): its natural
  length is lognormal (sigma 1) with mean `output_tokens_mean`; a lower
  `max_new_tokens` gives a prefix of the same answer.
- Only non-streaming requests are served; `"stream": true` is a 400.
- `n > 1` returns n answers per prompt, grouped by prompt, with ids `<rid>-<i>`.
- Faults hit only requests that passed validation (a 400 is never masked).
  A hung request holds no slot and a drain does not wait for it.
- "Down" (down windows, `POST /_sim/down`) answers 503 on /health and the
  generation endpoints while the port stays open; `die_after_s` closes the port
  and cuts connections instead.
- `fleetgen_sim_requests_total{code}` counts generation requests by status;
  `499` means the client went away first, `dropped` an injected drop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from simulator.config import SimConfig

if TYPE_CHECKING:
    from simulator.server import SimFleet, SimServer, SimThread, run_in_thread

__all__ = ["SimConfig", "SimFleet", "SimServer", "SimThread", "run_in_thread"]


def __getattr__(name: str) -> Any:
    # The server pulls in aiohttp; `fleetgen --help` should not pay for that.
    if name in {"SimFleet", "SimServer", "SimThread", "run_in_thread"}:
        from simulator import server

        return getattr(server, name)
    raise AttributeError(f"module 'simulator' has no attribute {name!r}")
