"""Structured output by regex (SGLang's `regex`): the text the model writes, a deterministic match.

The simulator walks the pattern's parse tree (Python's own regex parser) and writes, per
request key, a string that `re.fullmatch`es it: literals as they are, a class's first member
or a random one, each repeat its minimum count or a few more, a branch picked at random.
Anchors, lookarounds and backreferences are not written: a pattern using them is refused with
a 400 that names the simulator, as an unmodelled JSON-schema feature is (schema.py), so a test
never mistakes an unmodelled feature for a valid answer. A pattern Python cannot parse is the
server's grammar failure: `Failed to compile regex grammar: <reason>` (constrained/
grammar_manager.py; the reason is Python's, not XGrammar's).
"""

from __future__ import annotations

import random
import re
import re._constants as sre_constants
import re._parser as sre_parse
from typing import Any

# A repeat without an upper bound writes at most this many more than its minimum.
EXTRA_REPEATS = 3
_PRINTABLE = [chr(c) for c in range(0x21, 0x7F)]
_CATEGORIES = {
    sre_constants.CATEGORY_DIGIT: "0123456789",
    sre_constants.CATEGORY_WORD: "abcdefghijklmnopqrstuvwxyz0123456789_",
    sre_constants.CATEGORY_SPACE: " ",
    sre_constants.CATEGORY_NOT_DIGIT: "abcxyz",
    sre_constants.CATEGORY_NOT_WORD: " -.",
    sre_constants.CATEGORY_NOT_SPACE: "abc123",
}


class PatternRefused(ValueError):
    """The request's regex is refused; the message is the engine's (or the simulator's)."""


def check(pattern: Any) -> str:
    """The pattern, or PatternRefused: the server's message for one that does not compile, the
    simulator's for one it does not write."""
    if not isinstance(pattern, str):
        raise PatternRefused(f"regex must be a string, got {pattern!r}.")
    try:
        tree = sre_parse.parse(pattern)
    except re.error as error:
        raise PatternRefused(f"Failed to compile regex grammar: {error}") from None
    _write(tree, random.Random(0))  # refuses what it cannot write
    return pattern


def text(pattern: str, rng: random.Random) -> str:
    """A string that fully matches `pattern`."""
    written = _write(sre_parse.parse(pattern), rng)
    if re.fullmatch(pattern, written) is None:  # a construct the walk got wrong: say so
        raise PatternRefused(f"The simulator cannot write a match for the regex {pattern!r}.")
    return written


def _write(tree: Any, rng: random.Random) -> str:
    return "".join(_item(op, value, rng) for op, value in tree)


def _item(op: Any, value: Any, rng: random.Random) -> str:
    if op is sre_constants.LITERAL:
        return chr(value)
    if op is sre_constants.ANY:
        return rng.choice("abcxyz")
    if op is sre_constants.IN:
        return _member(value, rng)
    if op in (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT, sre_constants.POSSESSIVE_REPEAT):
        low, high, sub = value
        top = low + EXTRA_REPEATS if high is sre_constants.MAXREPEAT else high
        return "".join(_write(sub, rng) for _ in range(rng.randint(low, max(low, top))))
    if op is sre_constants.SUBPATTERN:
        return _write(value[-1], rng)
    if op is sre_constants.ATOMIC_GROUP:
        return _write(value, rng)
    if op is sre_constants.BRANCH:
        return _write(rng.choice(value[1]), rng)
    if op is sre_constants.AT and value in (sre_constants.AT_BEGINNING, sre_constants.AT_END,
                                            sre_constants.AT_BEGINNING_STRING,
                                            sre_constants.AT_END_STRING):
        return ""  # the answer is the whole match: ^ and $ hold anyway
    raise PatternRefused(f"The simulator does not write matches for the regex construct "
                         f"{str(op).lower()}; use literals, classes, groups, alternation and "
                         "repeats.")


def _member(items: Any, rng: random.Random) -> str:
    """A character of a class: one its first item allows (a negated class: one it does not
    exclude)."""
    if items and items[0][0] is sre_constants.NEGATE:
        excluded = "".join(_member([item], rng) for item in items[1:]
                           if item[0] is sre_constants.LITERAL)
        allowed = [c for c in _PRINTABLE if c not in excluded and c.isalnum()]
        candidates = [c for c in allowed if re.fullmatch(_as_class(items), c)]
        if not candidates:
            raise PatternRefused("The simulator cannot write a member of a negated class.")
        return rng.choice(candidates)
    op, value = items[rng.randrange(len(items))]
    if op is sre_constants.LITERAL:
        return chr(value)
    if op is sre_constants.RANGE:
        return chr(rng.randint(value[0], value[1]))
    if op is sre_constants.CATEGORY and value in _CATEGORIES:
        return rng.choice(_CATEGORIES[value])
    raise PatternRefused(f"The simulator does not write members of the class item "
                         f"{str(op).lower()}.")


def _as_class(items: Any) -> str:
    """A negated class back as a pattern, to test candidates against."""
    parts = []
    for op, value in items[1:]:
        if op is sre_constants.LITERAL:
            parts.append(re.escape(chr(value)))
        elif op is sre_constants.RANGE:
            parts.append(f"{re.escape(chr(value[0]))}-{re.escape(chr(value[1]))}")
        elif op is sre_constants.CATEGORY:
            parts.append({sre_constants.CATEGORY_DIGIT: r"\d", sre_constants.CATEGORY_WORD: r"\w",
                          sre_constants.CATEGORY_SPACE: r"\s"}.get(value, ""))
    return f"[^{''.join(parts)}]"
