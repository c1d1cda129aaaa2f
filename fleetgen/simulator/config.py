"""Settings of a simulated SGLang fleet: one frozen, validated dataclass of its groups."""

from __future__ import annotations

from dataclasses import dataclass

from fleetgen.simulator.settings import (
    SPECULATIVE_ALGORITHMS,
    CapacitySettings,
    FaultSettings,
    LimitSettings,
    ModeSettings,
    ServingSettings,
    SpeculativeSettings,
    require,
)

__all__ = ["DEFAULT_DRAFT_TOKENS", "SGLANG_VERSION", "SPECULATIVE_ALGORITHMS", "SimConfig"]

# The SGLang release whose HTTP behaviour the simulator reproduces (docs/simulator.md).
SGLANG_VERSION = "0.5.23"
# speculative_hook.py `_handle_eagle_family`: an EAGLE/NEXTN server without
# --max-running-requests resolves it to 48, and /server_info reports that value.
SPECULATIVE_SLOTS = 48
# managers/utils.py `compute_num_reserved_tokens`: only `is_eagle()` keeps drafts in the
# output slots (NEXTN is EAGLE once resolved); DFlash and n-gram reserve nothing.
EAGLE_FAMILY = ("EAGLE", "EAGLE3", "NEXTN")
# What a server without --speculative-num-draft-tokens resolves it to: DFlash its block size
# (`_handle_dflash`: 16 when the draft model's config does not say), n-gram 12
# (`_handle_ngram`), EAGLE with topk 1 num_steps + 1.
DEFAULT_DRAFT_TOKENS = {"DFLASH": 16, "NGRAM": 12}


# The groups are listed last to first: a dataclass orders the fields of its bases from the
# last base on, so `SimConfig`'s fields read serving, limits, ..., faults (settings.py).
@dataclass(frozen=True)
class SimConfig(FaultSettings, CapacitySettings, ModeSettings, SpeculativeSettings,
                LimitSettings, ServingSettings):
    """What every simulated server in the fleet looks like and how it misbehaves.

    Times are those of a full-speed GPU; `speed` divides them all. Each group of settings
    (fleetgen/simulator/settings.py) holds its defaults and checks; what depends on several
    groups (the slots, the KV pool, the length limits) is worked out here.
    """

    def __post_init__(self) -> None:
        # Accept a list of pairs (the brief, JSON) but store a hashable tuple.
        windows = tuple((float(a), float(b)) for a, b in self.down_windows)
        object.__setattr__(self, "down_windows", windows)
        self._check_serving()
        self._check_limits()
        self._check_speculative()
        self._check_modes()
        self._check_capacity()
        self._check_faults()
        require(self.mamba_track_interval >= 1 and self.mamba_track_interval % self.page_size
                == 0, "mamba_track_interval", "must be a positive multiple of page_size",
                self.mamba_track_interval)

    @property
    def resolved_max_running_requests(self) -> int | None:
        """/server_info's top-level value: the CLI's, or what resolution set (EAGLE: 48)."""
        if self.max_running_requests is None and self.speculative_algorithm is not None:
            return SPECULATIVE_SLOTS
        return self.max_running_requests

    @property
    def slots_per_dp(self) -> int:
        """internal_states' effective_max_running_requests_per_dp: the limit in force."""
        resolved = self.resolved_max_running_requests
        if resolved is None:
            return self.derived_slots
        # A real server also caps this by its pool; the simulator's pool is sized
        # from the slots (max_total_num_tokens below), so the CLI value stands.
        return max(1, resolved // self.dp_size)

    @property
    def total_slots(self) -> int:
        return self.slots_per_dp * self.dp_size

    @property
    def num_reserved_tokens(self) -> int:
        """managers/utils.py `compute_num_reserved_tokens`: EAGLE keeps drafts in output slots."""
        if self.speculative_algorithm not in EAGLE_FAMILY:
            return 0
        return max(
            self.speculative_eagle_topk * self.speculative_num_steps,
            self.speculative_num_draft_tokens,
        )

    @property
    def max_total_num_tokens(self) -> int:
        """KV capacity as a server reports it; unset means it never binds before context."""
        if self.max_total_tokens is not None:
            return self.max_total_tokens
        return self.context_length * self.total_slots

    @property
    def max_req_len(self) -> int:
        """Longest prompt + completion the scheduler admits."""
        return min(self.context_length - 1, self.max_total_num_tokens - 1)

    @property
    def max_req_input_len(self) -> int:
        """Prompts of this many tokens or more are refused by the scheduler."""
        return self.max_req_len - 5

