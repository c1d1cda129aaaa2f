"""Redis restarted from an older copy of its data (a lagging replica, a backup): the same
running commands converge to every row exactly once, and rows already written are not
generated again."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from fleetgen.local.fleet import LocalFleet
from fleetgen.queue.redisconn import read_hash
from fleetgen.runstate.keys import RunKeys
from tests.support.cli import fleetgen_cli
from tests.support.content import assert_fleet_content
from tests.support.fleet import FleetFactory, copy_data, generated, restart_from, sims_of, written
from tests.support.pipeline import assert_exactly_once, make_prompts
from tests.support.waiting import wait_until

N = 300


def manifest(fleet: LocalFleet, run: str) -> dict[str, str]:
    return read_hash(redis.Redis.from_url(fleet.redis_url), RunKeys(run).manifest)


def figure(pattern: str, text: str) -> int:
    """The sum of every number the pattern captures in a command's output."""
    return sum(int(n) for n in re.findall(pattern, text))


class Run:
    """`fleetgen produce` (waiting, reconciling every second) and `fleetgen drain`, as an
    operator runs them, against one fleet."""

    def __init__(self, fleet: LocalFleet, tmp: Path, run: str) -> None:
        self.fleet, self.run = fleet, run
        self.prompts, self.out = tmp / "p.jsonl", tmp / "out"
        self.ids = set(make_prompts(self.prompts, N)["good"])
        self.logs = {name: tmp / f"{name}.log" for name in ("produce", "drain")}
        # A small high-water mark keeps the producer reading for a good part of the run.
        self.procs = {
            "produce": self._start("produce", "produce", str(self.prompts), "--run", run,
                                   "--context-length", "4096", "--reconcile-interval", "1",
                                   "--high-water", "60", "--batch-size", "10"),
            "drain": self._start("drain", "drain", "--run", run, "--out", str(self.out)),
        }

    def _start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        with self.logs[name].open("wb") as log:
            return subprocess.Popen(fleetgen_cli(*args, "--redis", self.fleet.redis_url),
                                    stdout=log, stderr=subprocess.STDOUT)

    def output(self, name: str) -> str:
        return self.logs[name].read_text(errors="replace")

    def alive(self) -> None:
        for name, proc in self.procs.items():
            assert proc.poll() is None, f"{name} exited early:\n{self.output(name)[-3000:]}"

    def wait_until(self, condition: Callable[[], bool], what: str) -> None:
        wait_until(condition, 120, what, check=self.alive)

    def finish(self) -> None:
        for name, proc in self.procs.items():
            try:
                code = proc.wait(timeout=180)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
            assert code == 0, f"{name} exited {code}:\n{self.output(name)[-4000:]}"


# Where the copy is taken: (a) while the producer is still reading (the copy has no total),
# (b) just after it has read everything (total set, much still to drain), (c) late, mid-drain.
COPY_AT: dict[str, Callable[[Run], bool]] = {
    "a-reading": lambda r: int(manifest(r.fleet, r.run).get("read", 0)) >= 40,
    "b-read": lambda r: "total" in manifest(r.fleet, r.run),
    "c-late": lambda r: written(r.out) >= N * 3 // 4,
}


@pytest.mark.parametrize("point", list(COPY_AT))
def test_restart_from_an_older_copy_converges(make_fleet: FleetFactory, tmp_path: Path,
                                              point: str) -> None:
    # ~0.75 s a row on 24 slots: a run of ~10 s, long enough to copy and restore mid-run.
    # The lease is the users' default: what the older copy lists as unacked but nobody holds
    # any more comes back when its lease lapses (60 s after the copy's time), as on a real fleet.
    fleet = make_fleet(tpot_ms=3.0)
    slots = fleet.spec.gpus * sims_of(fleet).max_running_requests
    run = Run(fleet, tmp_path, "lost")
    run.wait_until(lambda: COPY_AT[point](run), f"copy point {point}")
    at_copy = manifest(fleet, "lost")
    copy = copy_data(fleet.valkey, tmp_path / "copy")
    written_at_copy = written(run.out)
    assert written_at_copy < N * 3 // 4 + slots  # the copy is older than the run's end
    if point == "a-reading":
        assert "total" not in at_copy, at_copy

    # Later, with the producer waiting and the drainer writing, Valkey comes back older.
    run.wait_until(lambda: written(run.out) >= max(written_at_copy + 30, N * 7 // 8),
                   "more rows written since the copy")
    fleet.valkey.kill()
    served_before, in_files = generated(fleet), written(run.out)
    restart_from(fleet.valkey, copy)
    run.finish()

    data = assert_exactly_once(run.out, run.ids)
    assert assert_fleet_content(fleet, run.prompts, data) == N  # every answer, not only ids
    requeued = figure(r"(\d+) re-enqueued after loss", run.output("produce"))
    restored = figure(r"restored (\d+) done bit", run.output("drain"))
    served_after = generated(fleet) - served_before
    print(f"{point}: written at copy {written_at_copy}, at restore {in_files}; re-enqueued "
          f"{requeued}; done bits restored {restored}; completions served after the restore "
          f"{served_after} for {N - in_files} rows not yet in the files")
    # The drainer told the older Redis what the files hold ...
    assert restored > 0, run.output("drain")[-3000:]
    # ... so rows already in the files were not generated again: after the restore the
    # simulators served at most one completion per row missing from the files, plus the
    # requests in flight at the kill (finished by the engine, their outcome lost with Redis).
    assert served_after <= (N - in_files) + slots
    if point == "a-reading":
        # The copy had no total and an older queue: the producer wrote the total back, and
        # rows queued after the copy (gone with it) were found lost and enqueued again.
        assert "re-asserted total=300" in run.output("produce")
        assert requeued > 0, run.output("produce")[-3000:]
    assert manifest(fleet, "lost")["total"] == str(N)
