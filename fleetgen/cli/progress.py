"""The commands' one progress bar: tqdm on stderr when shown (a terminal), nothing otherwise."""

from __future__ import annotations

import sys
from typing import Any


class Bar:
    """A tqdm bar, or a bar that draws nothing (`show` false); tqdm is imported only when
    one is drawn."""

    def __init__(self, desc: str, *, show: bool = True, unit: str = " rows",
                 unit_scale: bool = False, total: int | None = None) -> None:
        self._tqdm: Any = None
        if show:
            from tqdm import tqdm

            self._tqdm = tqdm(desc=desc, unit=unit, unit_scale=unit_scale, total=total,
                              file=sys.stderr, dynamic_ncols=True)

    def advance_to(self, n: int, total: int | None = None) -> None:
        """Show `n` done (of `total`, where it is known)."""
        if self._tqdm is not None:
            if total is not None:
                self._tqdm.total = total
            self._tqdm.update(n - self._tqdm.n)

    def add(self, n: int) -> None:
        if self._tqdm is not None:
            self._tqdm.update(n)

    def set_total(self, total: int) -> None:
        if self._tqdm is not None:
            self._tqdm.total = total
            self._tqdm.refresh()

    def close(self) -> None:
        if self._tqdm is not None:  # (a tqdm without a total refuses bool())
            self._tqdm.close()
