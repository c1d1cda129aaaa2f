"""Early warning: stop feeding a run whose first answers show a wrong template or budget
(`--stop-if 'truncated>0.2' --after 500`), so a mistake costs minutes, not a night of GPUs."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from fleetgen.errors import ConfigError
from fleetgen.queue.redisconn import read_hash
from fleetgen.runstate.keys import RunKeys

# The figure a rule names -> the workers' counter it divides by the answers so far
# (workers/generate.py writes them with every outcome, in the run's stats hash).
FIGURES = {"truncated": "truncated", "empty": "empty", "unfinished": "reasoning_unfinished",
           "failed": "failed"}
_RULE = re.compile(r"^\s*([a-z_]+)\s*(>=|>)\s*([0-9.]+)\s*(%?)\s*$")
# The answers are judged before every batch and at every look at a full queue, but not more
# often than this: one HGETALL of a small hash, so at most 20 a second. Once a second let a
# fast fleet answer (and the producer send) a small set whole between two looks, so the rule
# could never stop it (issue 22).
CHECK_EVERY_S = 0.05


@dataclass(frozen=True)
class StopRule:
    figure: str
    at_least: bool  # >= rather than >
    share: float

    def __str__(self) -> str:
        return f"{self.figure}{'>=' if self.at_least else '>'}{self.share:g}"

    def broken(self, share: float) -> bool:
        return share >= self.share if self.at_least else share > self.share


def parse_rule(text: str) -> StopRule:
    """`truncated>0.2`, `empty>=5%`: a figure, a comparison, a share (a fraction or percent)."""
    match = _RULE.match(text)
    if match is None:
        raise ConfigError(f"--stop-if {text!r}: write FIGURE>SHARE, e.g. 'truncated>0.2' "
                          f"(figures: {', '.join(FIGURES)})")
    figure, op, number, percent = match.groups()
    if figure not in FIGURES:
        raise ConfigError(f"--stop-if {text!r}: unknown figure {figure!r} "
                          f"(figures: {', '.join(FIGURES)})")
    share = float(number) / (100 if percent else 1)
    if not 0 <= share <= 1:
        raise ConfigError(f"--stop-if {text!r}: the share must be in 0..1 (or 0..100%)")
    return StopRule(figure, op == ">=", share)


@dataclass(frozen=True)
class Verdict:
    rule: StopRule
    share: float
    answers: int

    def reason(self) -> str:
        return (f"{self.rule.figure} {self.share:.1%} of the first {self.answers} answers "
                f"(--stop-if {self.rule})")


class EarlyStop:
    """Judges the run's first answers, at most every CHECK_EVERY_S, once `after` are back."""

    def __init__(self, client: redis.Redis, keys: RunKeys, rules: list[StopRule],
                 after: int) -> None:
        self.redis = client
        self.keys = keys
        self.rules = rules
        self.after = after
        self.verdict: Verdict | None = None
        self._next_check = 0.0

    def triggered(self) -> bool:
        if self.verdict is not None:
            return True
        if not self.rules or time.monotonic() < self._next_check:
            return False
        self._next_check = time.monotonic() + CHECK_EVERY_S
        self.verdict = judge(read_hash(self.redis, self.keys.stats), self.rules, self.after)
        return self.verdict is not None

    def wait_for_sent(self, should_stop: Callable[[], bool]) -> None:
        """Once stopped: let what was queued or in flight before the stop finish."""
        while not should_stop() and self.redis.bitcount(self.keys.done) < self.redis.bitcount(
                self.keys.sent):
            time.sleep(0.2)


def judge(stats: dict[str, str], rules: list[StopRule], after: int) -> Verdict | None:
    """The first rule the answers so far break, once there are at least `after` of them."""
    answers = int(stats.get("done", 0) or 0) + int(stats.get("failed", 0) or 0)
    if answers < max(after, 1):
        return None
    for rule in rules:
        share = int(stats.get(FIGURES[rule.figure], 0) or 0) / answers
        if rule.broken(share):
            return Verdict(rule, share, answers)
    return None
