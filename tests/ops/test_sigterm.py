"""SIGTERM stops every long-running fleetgen command within 2 s, wherever it is: waiting for
the run, blocked on the high-water mark, following the stream, riding out a Redis outage."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
import redis

from fleetgen import exitcodes
from fleetgen.local.ports import lease_port
from fleetgen.local.valkey import EmbeddedValkey
from fleetgen.queue.contract import DRAINER_GROUP, QUEUE
from fleetgen.queue.redisconn import read_hash
from fleetgen.runstate.keys import RunKeys
from tests.support.ops import VENV_BIN, venv_env
from tests.support.pipeline import make_prompts
from tests.support.waiting import wait_until

STOP_WITHIN_S = 2.0
TIMES: dict[str, float] = {}  # command state -> seconds from SIGTERM to exit (printed)


class Command:
    """A fleetgen command as a subprocess, its output in a file the test can poll."""

    def __init__(self, tmp: Path, name: str, *args: str) -> None:
        self.log = tmp / f"{name}.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen([str(VENV_BIN / "fleetgen"), *args], env=venv_env(),
                                         stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def alive(self) -> None:
        assert self.proc.poll() is None, f"exited early ({self.proc.returncode}):\n" \
            f"{self.output()[-2000:]}"

    def terminate(self, what: str) -> tuple[int, float]:
        """SIGTERM; the exit code and the seconds it took (fails past STOP_WITHIN_S)."""
        self.alive()
        sent = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=STOP_WITHIN_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"{what}: still running {STOP_WITHIN_S} s after SIGTERM:\n"
                        f"{self.output()[-2000:]}")
        took = time.monotonic() - sent
        TIMES[what] = took
        print(f"{what}: exit {code} {took:.2f} s after SIGTERM")
        assert "Traceback" not in self.output(), self.output()[-3000:]
        return code, took

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture()
def commands(tmp_path: Path) -> Iterator[Callable[..., Command]]:
    started: list[Command] = []

    def start(name: str, *args: str) -> Command:
        started.append(Command(tmp_path, name, *args))
        return started[-1]

    yield start
    for command in started:
        command.kill()


@pytest.fixture()
def own_valkey(tmp_path: Path) -> Iterator[EmbeddedValkey]:
    """A Valkey this test may kill (the session's one is shared)."""
    server = EmbeddedValkey(tmp_path / "valkey").start()
    yield server
    server.stop()


def manifest(url: str, run: str) -> dict[str, str]:
    return read_hash(redis.Redis.from_url(url), RunKeys(run).manifest)


def produce_args(prompts: Path, run: str, url: str, *extra: str) -> list[str]:
    return ["produce", str(prompts), "--run", run, "--context-length", "4096",
            "--reconcile-interval", "1", "--redis", url, *extra]


def no_connection_to(pid: int, port: int) -> bool:
    """The process holds no socket to `port` any more: it has noticed the server is gone
    and is in its reconnect loop."""
    return not any(c.raddr and c.raddr.port == port
                   for c in psutil.Process(pid).net_connections(kind="tcp"))


def test_produce_stops_while_waiting_for_the_run(commands: Callable[..., Command],
                                                 redis_url: str, tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    make_prompts(prompts, 20)
    # No workers: every row is enqueued, then the producer waits for outcomes forever.
    producer = commands("produce", *produce_args(prompts, "waits", redis_url))
    wait_until(lambda: manifest(redis_url, "waits").get("state") == "produced", 60,
               "the producer to finish reading", check=producer.alive)
    code, _ = producer.terminate("produce, waiting for the run")
    assert code == exitcodes.INTERRUPTED and "run the same command again" in producer.output()


def test_produce_stops_while_blocked_on_the_high_water_mark(
        commands: Callable[..., Command], redis_url: str, tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    make_prompts(prompts, 60)
    producer = commands("produce", *produce_args(prompts, "blocked", redis_url,
                                                 "--high-water", "5", "--batch-size", "5"))
    client = redis.Redis.from_url(redis_url)
    wait_until(lambda: client.llen(QUEUE) >= 5, 60, "the queue to reach the high-water mark",
               check=producer.alive)
    code, _ = producer.terminate("produce, blocked on the high-water mark")
    assert code == exitcodes.INTERRUPTED
    assert int(manifest(redis_url, "blocked")["read"]) < 60  # it really was blocked


def test_produce_stops_while_redis_is_unreachable(commands: Callable[..., Command],
                                                  own_valkey: EmbeddedValkey,
                                                  tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    make_prompts(prompts, 20)
    producer = commands("produce", *produce_args(prompts, "gone", own_valkey.url))
    wait_until(lambda: manifest(own_valkey.url, "gone").get("state") == "produced", 60,
               "the producer to wait for the run", check=producer.alive)
    own_valkey.kill()
    wait_until(lambda: no_connection_to(producer.proc.pid, own_valkey.port), 10,
               "the producer to notice Redis is gone")
    code, _ = producer.terminate("produce, Redis unreachable")
    assert code == exitcodes.INTERRUPTED


def drainer_ready(url: str, run: str) -> Callable[[], bool]:
    def ready() -> bool:
        try:
            groups = redis.Redis.from_url(url).xinfo_groups(RunKeys(run).stream)
        except redis.ResponseError:
            return False
        return any(g["name"] in (DRAINER_GROUP, DRAINER_GROUP.encode()) for g in groups)

    return ready


@pytest.mark.parametrize("follow", [False, True], ids=["until-complete", "follow"])
def test_drain_stops_while_waiting_for_entries(commands: Callable[..., Command], redis_url: str,
                                               tmp_path: Path, follow: bool) -> None:
    args = ["drain", "--run", "idle", "--out", str(tmp_path / "out"), "--redis", redis_url]
    drainer = commands("drain", *args, *(["--follow"] if follow else []))
    wait_until(drainer_ready(redis_url, "idle"), 30, "the drainer's consumer group",
               check=drainer.alive)
    code, _ = drainer.terminate(f"drain{' --follow' if follow else ''}, idle")
    # Stopped before the run completed: 1 (incomplete); --follow: 0, as before.
    assert code == (exitcodes.OK if follow else exitcodes.INCOMPLETE)
    assert (tmp_path / "out" / "summary.json").exists()


def test_drain_stops_while_redis_is_unreachable(commands: Callable[..., Command],
                                                own_valkey: EmbeddedValkey,
                                                tmp_path: Path) -> None:
    drainer = commands("drain", "drain", "--run", "dark", "--out", str(tmp_path / "out"),
                       "--follow", "--redis", own_valkey.url)
    wait_until(drainer_ready(own_valkey.url, "dark"), 30, "the drainer's consumer group",
               check=drainer.alive)
    own_valkey.kill()
    wait_until(lambda: no_connection_to(drainer.proc.pid, own_valkey.port), 10,
               "the drainer to notice Redis is gone")
    code, _ = drainer.terminate("drain --follow, Redis unreachable")
    # Blocked inside redis-py's reconnect backoff: the second, forced delivery ends it.
    assert code == exitcodes.INTERRUPTED


def test_status_watch_stops(commands: Callable[..., Command], redis_url: str) -> None:
    status = commands("status", "status", "--run", "nothing", "--watch", "--interval", "30",
                      "--redis", redis_url)
    wait_until(lambda: "not started yet" in status.output(), 30, "the first refresh",
               check=status.alive)
    code, _ = status.terminate("status --watch, between refreshes")
    assert code == exitcodes.OK


def test_metrics_stops(commands: Callable[..., Command], redis_url: str) -> None:
    with lease_port() as lease:
        metrics = commands("metrics", "metrics", "--port", str(lease.port), "--redis",
                           redis_url)
        wait_until(lambda: "serving http" in metrics.output(), 30, "the exporter to serve",
                   check=metrics.alive)
        code, _ = metrics.terminate("metrics, serving")
    assert code == exitcodes.OK


def test_demo_stops_and_takes_its_fleet_with_it(commands: Callable[..., Command],
                                                tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    make_prompts(prompts, 400)
    demo = commands("demo", "demo", "--gpus", "2", "--prompts", str(prompts), "--out",
                    str(tmp_path / "out"), "--slots", "4", "--tpot-ms", "5",
                    "--output-tokens-mean", "200", "--max-output-tokens", "256")
    wait_until(lambda: "watch it from another shell" in demo.output(), 120,
               "the demo's run to start", check=demo.alive)
    # The URL (its password in it) is in a file for the user, not on the terminal.
    url_file = tmp_path / "out" / ".fleetgen-demo" / "redis.url"
    assert f"FLEETGEN_REDIS_URL=$(cat {url_file})" in demo.output()
    url = url_file.read_text().strip()
    assert url.split("@")[0].count(":") == 2 and url.split("@")[0] not in demo.output()
    children = psutil.Process(demo.proc.pid).children(recursive=True)
    assert len(children) >= 4  # Valkey, the simulator, two workers
    code, _ = demo.terminate("demo, mid-run")
    assert code == exitcodes.INTERRUPTED
    alive = [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"left running: {[c.cmdline()[:3] for c in alive]}"
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(url, socket_connect_timeout=1).ping()


def teardown_module() -> None:
    if TIMES:
        print("\nSIGTERM to exit:", ", ".join(f"{k} {v:.2f} s" for k, v in TIMES.items()))
