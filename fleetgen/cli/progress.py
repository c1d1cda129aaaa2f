"""The commands' one progress display: a tqdm bar on stderr on a terminal (count, rate, ETA),
and where no bar is drawn (a log file, a CI job, `2> log`), a line every 10 s if asked."""

from __future__ import annotations

import sys
import time
from typing import Any

# Where no bar is drawn, a line this often: a minute left a stalled run looking alive too long.
LINE_EVERY_S = 10.0


class Bar:
    """A tqdm bar, or (`show` false) nothing, or with `lines` (what to say before the count)
    a line every LINE_EVERY_S on stderr: `{lines} N/TOTAL rows, R rows/s, ETA T`. tqdm is
    imported only when drawn."""

    def __init__(self, desc: str, *, show: bool = True, unit: str = " rows",
                 unit_scale: bool = False, total: int | None = None,
                 lines: str | None = None) -> None:
        self._tqdm: Any = None
        self._line: MinuteLine | None = None
        if show:
            from tqdm import tqdm

            self._tqdm = tqdm(desc=desc, unit=unit, unit_scale=unit_scale, total=total,
                              file=sys.stderr, dynamic_ncols=True)
        elif lines:
            self._line = MinuteLine(lines, unit.strip() or "rows", total, LINE_EVERY_S)

    def advance_to(self, n: int, total: int | None = None) -> None:
        """Show `n` done (of `total`, where it is known)."""
        if self._tqdm is not None:
            if total is not None:
                self._tqdm.total = total
            self._tqdm.update(n - self._tqdm.n)
        elif self._line is not None:
            self._line.at(n, total)

    def add(self, n: int) -> None:
        if self._tqdm is not None:
            self._tqdm.update(n)
        elif self._line is not None:
            self._line.at(self._line.n + n, None)

    def set_total(self, total: int) -> None:
        if self._tqdm is not None:
            self._tqdm.total = total
            self._tqdm.refresh()
        elif self._line is not None:
            self._line.total = total

    def postfix(self, text: str) -> None:
        """A figure after the bar's own (the engines up)."""
        if self._tqdm is not None:
            self._tqdm.set_postfix_str(text, refresh=False)

    def note(self, text: str) -> None:
        """A line on stdout above the bar (tqdm's own way: the bar is redrawn below it)."""
        if self._tqdm is not None:
            self._tqdm.write(text, file=sys.stdout)
            sys.stdout.flush()
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self._tqdm is not None:  # (a tqdm without a total refuses bool())
            self._tqdm.close()


class MinuteLine:
    """Where no bar is drawn: the count, the rate since the first figure (a resumed run's
    rows done before do not make it look fast) and the ETA, every `every_s`."""

    def __init__(self, desc: str, unit: str, total: int | None, every_s: float) -> None:
        self.desc, self.unit, self.total, self.every_s = desc, unit, total, every_s
        self.n = 0
        self._first: tuple[float, int] | None = None
        self._due = time.monotonic() + every_s

    def at(self, n: int, total: int | None) -> None:
        now = time.monotonic()
        self.n = n
        self.total = total if total is not None else self.total
        if self._first is None:
            self._first = (now, n)
        if now < self._due:
            return
        self._due = now + self.every_s
        print(self.line(now), file=sys.stderr, flush=True)

    def line(self, now: float) -> str:
        since, n0 = self._first or (now, self.n)
        rate = (self.n - n0) / max(now - since, 1e-9)
        of = f"/{self.total:,}" if self.total is not None else ""
        left = None if self.total is None or rate <= 0 else max(self.total - self.n, 0) / rate
        return f"{self.desc} {self.n:,}{of} {self.unit}, {rate:,.1f} {self.unit}/s, " \
               f"ETA {'-' if left is None else duration(left)}"


def duration(seconds: float) -> str:
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"
