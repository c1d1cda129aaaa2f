"""The exact max_tokens budget of one prompt under the length rule of the engine in front (pure)."""

from __future__ import annotations

from dataclasses import dataclass, field

from fleetgen.engine import LengthRule, ServerLimits
from fleetgen.engine.sglang import RULE as SGLANG_RULE


@dataclass(frozen=True)
class Limits:
    """What the server allows, plus the user's cap, margin and minimum output."""

    context_length: int
    max_total_tokens: int | None = None  # KV capacity from /get_server_info, if smaller
    cap: int | None = None  # --max-output-tokens; None means "as much as the context allows"
    margin: int = 0  # extra tokens kept free, e.g. for a server tokenizer that counts more
    min_output_tokens: int = 1
    rule: LengthRule = field(default=SGLANG_RULE)  # the length rule of the engine in front
    reserved_tokens: int = 0  # the engine counts these with the input (speculative decoding)
    server_input_limit: int | None = None  # the engine's own max_req_input_len, if it says
    # Why a JSON schema's grammar cannot wait for `</think>` on the servers read, with the fix
    # (producer/build.py `grammar_cannot_wait`); None: it can, or no server was read.
    grammar_cannot_wait: str | None = None

    def __post_init__(self) -> None:
        if self.context_length < 16:
            raise ValueError(f"context_length must be at least 16, got {self.context_length}")
        if self.cap is not None and self.cap < 1:
            raise ValueError(f"max_output_tokens must be at least 1, got {self.cap}")
        if self.margin < 0:
            raise ValueError(f"margin must be >= 0, got {self.margin}")
        if self.min_output_tokens < 1:
            raise ValueError(f"min_output_tokens must be >= 1, got {self.min_output_tokens}")

    @property
    def max_req_input_len(self) -> int:
        """The smallest prompt length the engine refuses."""
        return self.rule.input_limit(self.server)

    def room(self, prompt_tokens: int) -> int:
        """The largest max_tokens the engine accepts for this prompt, less the margin."""
        return self.rule.room(prompt_tokens, self.server) - self.margin

    @property
    def server(self) -> ServerLimits:
        return ServerLimits(context_length=self.context_length,
                            max_total_tokens=self.max_total_tokens,
                            max_req_input_len=self.server_input_limit,
                            reserved_tokens=self.reserved_tokens)


@dataclass(frozen=True)
class Budget:
    """Either a max_tokens to send, or the reason the prompt cannot be sent."""

    max_tokens: int
    reason: str | None = None

    @property
    def rejected(self) -> bool:
        return self.reason is not None


def budget(prompt_tokens: int, limits: Limits) -> Budget:
    """max_tokens = min(cap, room), where room keeps the request inside every SGLang rule."""
    if prompt_tokens >= limits.max_req_input_len:
        return Budget(0, (
            f"prompt_too_long: {prompt_tokens} prompt tokens; the server accepts at most "
            f"{limits.max_req_input_len - 1} (context {limits.context_length})"
        ))
    room = limits.room(prompt_tokens)
    max_tokens = room if limits.cap is None else min(limits.cap, room)
    if max_tokens < limits.min_output_tokens:
        return Budget(max(max_tokens, 0), (
            f"no_room_for_output: {prompt_tokens} prompt tokens leave {max(room, 0)} of the "
            f"{limits.context_length}-token context; --min-output-tokens is "
            f"{limits.min_output_tokens}"
        ))
    return Budget(max_tokens)
