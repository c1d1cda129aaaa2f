"""`fleetgen status` on a finished run (issue 22, point 2) agrees with the drainer's summary.json
and with `fleetgen metrics`: the state is complete, the clock stopped when the run ended, and
`failed` counts the requests that finally failed, not the failures a `retry` fixed since."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import orjson
import redis

from fleetgen.local.ports import lease_port
from fleetgen.runstate.keys import RunKeys
from fleetgen.simulator.config import SimConfig
from fleetgen.simulator.server import run_in_thread
from tests.support.waiting import wait_until
from tests.support.workers import start_worker, stop

ROWS = 30
RUN = "finished"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetgen", *args], capture_output=True,
                          text=True, timeout=240, env=dict(os.environ))


def generate_with_errors(redis_url: str, tmp_path: Path, name: str, settled: str) -> None:
    """One worker, one attempt per request, against a server that fails half of them (503),
    until `settled` (a Redis condition) holds."""
    client = redis.Redis.from_url(redis_url)
    keys = RunKeys(RUN)
    checks = {"all done": lambda: client.bitcount(keys.done) == ROWS,
              "retries landed": lambda: client.scard(keys.retrying) == 0}
    with run_in_thread(SimConfig(port=0, ttft_ms=0, tpot_ms=0, health_delay_s=0,
                                 output_tokens_mean=8, error_rate=0.5, seed=len(name))) as sim:
        proc = start_worker(redis_url, sim.url, name, tmp_path / f"{name}.log", concurrency=2,
                            env={"FLEETGEN_MAX_ATTEMPTS": "1"})
        try:
            wait_until(checks[settled], 60, settled)
        finally:
            stop(proc)


def scrape_failed(redis_url: str) -> tuple[int, int]:
    """`fleetgen metrics`: (fleetgen_rows failed, fleetgen_rows_written failed) of the run."""
    lease = lease_port()
    port = lease.port
    lease.close()
    proc = subprocess.Popen([sys.executable, "-m", "fleetgen", "metrics", "--port", str(port),
                             "--redis", redis_url, "--run", RUN], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env=dict(os.environ))
    try:
        def scraped() -> str | None:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/metrics").text
            except httpx.TransportError:
                return None

        wait_until(lambda: scraped() is not None, 30, "the exporter")
        text = scraped() or ""
    finally:
        proc.terminate()
        proc.wait(timeout=30)

    def value(name: str) -> int:
        found = re.search(rf'^{name}{{outcome="failed",run="{RUN}"}} (\S+)$', text, re.M)
        assert found, text
        return int(float(found.group(1)))

    return value("fleetgen_rows_total"), value("fleetgen_rows_written_total")


def test_status_of_a_finished_run_agrees_with_the_summary(redis_url: str, tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(f'{{"id": "r{i}", "prompt": "question {i}"}}\n'
                               for i in range(ROWS)))
    produced = cli("produce", str(prompts), "--run", RUN, "--context-length", "4096",
                   "--no-wait", "--redis", redis_url)
    assert produced.returncode == 0, produced.stderr
    generate_with_errors(redis_url, tmp_path, "first", "all done")
    retried = cli("retry", "--run", RUN, "--redis", redis_url)
    assert retried.returncode == 0 and "re-enqueued" in retried.stdout, retried.stderr
    first_failures = int(retried.stdout.split(" failed row(s)")[0].rsplit(" ", 1)[1])
    generate_with_errors(redis_url, tmp_path, "again", "retries landed")

    out = tmp_path / "out"
    drained = cli("drain", "--run", RUN, "--out", str(out), "--redis", redis_url)
    assert drained.returncode == 0, drained.stderr
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert summary["complete"] is True
    # The point of the run: some failures were fixed by the retry, some still stand.
    assert 0 < summary["failed"] < first_failures, (summary["failed"], first_failures)

    print(f"\nsummary.json: done {summary['done']} failed {summary['failed']} complete "
          f"{summary['complete']} wall_s {summary['wall_s']}\n"
          + cli("status", "--run", RUN, "--redis", redis_url).stdout)
    s = orjson.loads(cli("status", "--run", RUN, "--json", "--redis", redis_url).stdout)
    assert s["state"] == "complete", s
    assert (s["done"], s["failed"], s["rejected"]) == \
        (summary["done"], summary["failed"], summary["rejected"])
    assert s["eta_s"] is None
    # The clock stopped at the end (status runs after the drainer exited, a subprocess start
    # later): the same wall time as the summary's, to status's rounding.
    assert abs(s["elapsed_s"] - summary["wall_s"]) <= 0.06, (s["elapsed_s"], summary["wall_s"])
    shown = cli("status", "--run", RUN, "--redis", redis_url).stdout
    assert f"run {RUN}  [complete]" in shown and f"failed {summary['failed']} " in shown

    # A drain again (nothing new) writes the same figures: the end is pinned.
    assert cli("drain", "--run", RUN, "--out", str(out), "--redis", redis_url).returncode == 0
    again = orjson.loads((out / "summary.json").read_bytes())
    assert (again["wall_s"], again["failed"]) == (summary["wall_s"], summary["failed"])

    assert scrape_failed(redis_url) == (summary["failed"], summary["failed"])
