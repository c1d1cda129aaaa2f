"""A documented setting (its name, type, default and help, declared once) and the one renderer
of a table of them as Markdown: the row type and the docs table of both fleetgen/settings/envvars.py
and fleetgen/settings/runoptions.py."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Any, Generic, TypeVar

S = TypeVar("S", bound="Setting")


@dataclass(frozen=True)
class Setting:
    name: str
    kind: str  # its type as the docs name it (seconds, integer, URL, path, ...)
    help: str  # what it does, as the docs (and, for a flag, --help) say it
    default: Any
    _: KW_ONLY
    default_text: str | None = None  # the docs' default where `default` does not say it
    secret: bool = False  # hidden from repr and logs, stored redacted

    def shown_default(self) -> str:
        """The default as the docs table writes it."""
        if self.default_text is not None:
            return self.default_text
        return self.default_words()

    def default_words(self) -> str:
        return str(self.default)


@dataclass(frozen=True)
class Column(Generic[S]):
    """A column of a docs table: its title, and its cell for one setting (as Markdown)."""

    title: str
    cell: Callable[[S], str]


def markdown(columns: Sequence[Column[S]], rows: Sequence[S]) -> str:
    """The table of `rows`, one line each, under a header of `columns`' titles."""
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(cells) + " |"

    lines = [line([c.title for c in columns]), line(["---"] * len(columns)),
             *(line([c.cell(row) for c in columns]) for row in rows)]
    return "\n".join(lines) + "\n"


def escaped(text: str) -> str:
    """`text` as a table cell: `|` would end it."""
    return text.replace("|", "\\|")


def escaped_tags(text: str) -> str:
    """`text` as a cell that may hold `<`: a Markdown viewer takes `</think>` for a tag and
    shows nothing."""
    return escaped(text).replace("<", "&lt;")
