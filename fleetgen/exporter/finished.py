"""`--only-finished`: which answers an export leaves out, and how many for each reason.

A training set wants whole answers: SpecForge's validator (`scripts/validate_regenerated_data.py`
`validate_row`, through `scripts/conversation_validation.py` `validate_conversation`) rejects a
turn whose content is not a non-empty string, and an answer cut at its budget or inside its
reasoning teaches a drafter to stop where the model did not. vLLM speculators' RFC #584 asks
for the same filter (dropping `length` rows)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Final

# In the order the summary line names them; the first that applies is the reason.
REASONS: Final = ("reasoning_unfinished", "length", "empty")


def unfinished(record: dict[str, Any]) -> str | None:
    """Why a result is not a finished answer, or None: it stopped inside its reasoning
    (`reasoning_unfinished`, whatever its finish_reason: no answer follows the reasoning), it
    was cut at its budget (`length`), or it holds no text (`empty`, as the drainer counts it
    in summary.json: fleetgen/records/outcomes.py `quality_counts`)."""
    if record.get("reasoning_unfinished") is True:
        return "reasoning_unfinished"
    if record.get("finish_reason") == "length":
        return "length"
    if not str(record.get("completion") or "").strip():
        return "empty"
    return None


@dataclass
class Selection:
    """The results an export writes: all of them, or with `only_finished` the finished ones,
    counting the others by reason."""

    only_finished: bool = False
    left_out: Counter[str] = field(default_factory=Counter)

    def wanted(self, record: dict[str, Any]) -> bool:
        """Whether to write it (pure: a schema pass may ask as often as it likes)."""
        return not self.only_finished or unfinished(record) is None

    def admit(self, record: dict[str, Any]) -> bool:
        """Whether to write it, counting it when it is left out (once per record written)."""
        reason = unfinished(record) if self.only_finished else None
        if reason is not None:
            self.left_out[reason] += 1
        return reason is None
