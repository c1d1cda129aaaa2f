"""The short table of a run's figures that `fleetgen run`, the demo and `fleetgen drain` print
at its end (every figure is in summary.json beside the output files)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def held_out(s: dict[str, Any]) -> str:
    """Held-out requests and the rows they are (holdout.jsonl's lines): a row of --n 4 or of
    four turns is four requests, and `requests` above counts requests."""
    rows = s.get("holdout_rows")
    return f"{s['holdout']} requests" + ("" if rows is None else f" ({rows} rows)")


def summary_table(s: dict[str, Any], out: Path) -> str:
    rows = [("run", s["run"]), ("requests", s["total"])]
    if s.get("input_rows") is not None:
        rows.append(("input lines", s["input_rows"]))
    rows += [("done", s["done"]),
            *([("of which reused (not sent)", s["reused"])] if s.get("reused") else []),
            ("failed", s["failed"]), ("rejected", s["rejected"]),
            *([("held out (holdout.jsonl)", held_out(s))] if s.get("holdout") else []),
            ("truncated (finish=length)", s["truncated"]),
            ("prompt tokens", s["prompt_tokens"]), ("completion tokens", s["completion_tokens"]),
            ("wall time", f"{s['wall_s']} s"), ("rows/s", s["rows_per_s"]),
            ("completion tokens/s", s["completion_tokens_per_s"]),
            ("complete", "yes" if s["complete"] else "NO")]
    if s.get("stopped"):
        rows.append(("stopped early", s["stopped"]))
    rows.append(("output", str(out)))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)
