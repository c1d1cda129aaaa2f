"""Secure by default: JSON-only Celery, passwords and API keys that never leak."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from fleetgen import errors
from fleetgen.engine.sglang import SGLangClient, read_limits
from fleetgen.errors import ConfigError
from fleetgen.local.ports import PortInUse, on_leased_port, says_address_in_use
from fleetgen.local.valkey import probe_valkey
from fleetgen.queue.celeryconf import make_app
from fleetgen.queue.contract import QUEUE, TASK_NAME
from fleetgen.queue.redisconn import redact, redis_url
from producer.settings import ProducerSettings
from tests.support.binaries import require_binary
from tests.support.content import assert_fleet_content
from tests.support.fleet import FleetFactory
from tests.support.pipeline import assert_exactly_once, make_prompts, run_pipeline
from tests.support.waiting import wait_until
from workers.settings import WorkerSettings

PASSWORD = "s3cr3t-Pw-7f1c"
API_KEY = "sk-test-9a8b7c"


class Boom:
    """Unpickling this creates a file: proof of code execution if it ever happens."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, ...]]:
        return (os.system, (f"touch {self.path}",))


def test_a_pickle_message_is_refused_and_runs_nothing(make_fleet: FleetFactory,
                                                      tmp_path: Path) -> None:
    fleet = make_fleet(gpus=1)
    marker = tmp_path / "pwned"
    sender = make_app(fleet.redis_url, visibility_timeout_s=60)
    sender.conf.accept_content = ["json", "pickle"]
    sender.send_task(TASK_NAME, args=[Boom(str(marker))], queue=QUEUE, serializer="pickle")
    client = redis.Redis.from_url(fleet.redis_url)
    worker = fleet.workers[0]
    wait_until(lambda: "untrusted content" in worker.log_text(), 30, "the worker to refuse it")
    wait_until(lambda: client.llen(QUEUE) == 0 and client.hlen("unacked") == 0, 30,
               "the message to be gone")
    assert not marker.exists()
    assert "pickle" in worker.log_text()
    sender.close()


def test_password_and_api_key_work_and_never_leak(make_fleet: FleetFactory,
                                                  tmp_path: Path) -> None:
    fleet = make_fleet(redis_password=PASSWORD, sim_args=["--api-key", API_KEY],
                       worker_env={"FLEETGEN_ENGINE_API_KEY": API_KEY})
    assert PASSWORD in fleet.redis_url
    prompts, out = tmp_path / "p.jsonl", tmp_path / "out"
    kinds = make_prompts(prompts, 60)
    # The producer reads the context from the engine, with the key.
    run_pipeline(fleet, prompts, "secure", out, context_length=None,
                 engine_url=fleet.engine_url(0), engine_api_key=API_KEY)
    assert_fleet_content(fleet, prompts, assert_exactly_once(out, set(kinds["good"])))

    env = {**os.environ, "FLEETGEN_REDIS_URL": fleet.redis_url}
    for args in (["status", "--run", "secure"], ["status", "--run", "secure", "--json"],
                 ["status", "--run", "nope"], ["produce", str(prompts), "--run", "x:y",
                                                "--context-length", "4096"]):
        done = subprocess.run([sys.executable, "-m", "fleetgen", *args], env=env,
                              capture_output=True, text=True, timeout=60)
        assert PASSWORD not in done.stdout + done.stderr, args
    for worker in fleet.workers:
        log = worker.log_text()
        assert log and PASSWORD not in log and API_KEY not in log
    for text in (repr(WorkerSettings.from_env({"FLEETGEN_REDIS_URL": fleet.redis_url,
                                                "FLEETGEN_ENGINE_API_KEY": API_KEY})),
                 repr(ProducerSettings(input=prompts, run="r", redis_url=fleet.redis_url,
                                       context_length=4096, engine_api_key=API_KEY)),
                 str(ProducerSettings(input=prompts, run="r", redis_url=fleet.redis_url,
                                      context_length=4096).manifest_settings())):
        assert PASSWORD not in text and API_KEY not in text

    # Without the key the engine refuses, and the client calls it a permanent error.
    assert httpx.post(fleet.engine_url(0) + "/generate", json={"input_ids": [1]}).status_code \
        == 401
    client = SGLangClient(fleet.engine_url(0), timeout_s=5, concurrency=1)
    with pytest.raises(errors.PermanentError) as info:
        client.generate([1, 2, 3], 4, {}, rid="x")
    assert info.value.status == 401
    client.close()
    assert read_limits(fleet.engine_url(0), api_key=API_KEY).context_length == 4096


def test_wrong_password_is_one_line_without_the_password(make_fleet: FleetFactory) -> None:
    fleet = make_fleet(gpus=1, redis_password=PASSWORD)
    wrong = fleet.redis_url.replace(PASSWORD, PASSWORD + "-wrong")
    done = subprocess.run([sys.executable, "-m", "fleetgen", "status", "--run", "r",
                           "--redis", wrong], capture_output=True, text=True, timeout=60)
    assert done.returncode == 4
    assert PASSWORD not in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_acl_user_url_works(make_fleet: FleetFactory) -> None:
    fleet = make_fleet(gpus=1)
    admin = redis.Redis.from_url(fleet.redis_url)
    admin.execute_command("ACL", "SETUSER", "fleet", "on", f">{PASSWORD}", "~*", "&*", "+@all")
    url = fleet.redis_url.replace("redis://", f"redis://fleet:{PASSWORD}@")
    done = subprocess.run([sys.executable, "-m", "fleetgen", "status", "--redis", url],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert redact(url) == url.replace(PASSWORD, "***")


@pytest.mark.parametrize("url", ["rediss://:pw@redis.example:6380/0",
                                 "rediss://user:pw@10.0.0.1:6380/1?ssl_cert_reqs=required"])
def test_tls_urls_are_accepted_and_redacted(url: str) -> None:
    assert redis_url(url) == url
    assert "pw" not in redact(url).replace("***", "")


def test_a_non_redis_url_is_a_config_error_naming_no_secret() -> None:
    with pytest.raises(ConfigError) as info:
        redis_url("http://user:hunter2@host:6379")
    assert "hunter2" not in str(info.value)


@pytest.fixture()
def tls_redis(tmp_path: Path) -> Iterator[str]:
    """Debian's redis-server (built with TLS, unlike the embedded Valkey) behind a test CA,
    on a leased port and checked to be this process's server."""
    server = require_binary("redis-server", why="built with TLS, unlike the embedded Valkey")
    openssl = require_binary("openssl", why="makes the test CA")
    certs = _make_certs(openssl, tmp_path)
    lease, (proc, url) = on_leased_port(
        lambda held: _start_tls_redis(server, held.port, certs, tmp_path))
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        lease.close()


def _make_certs(openssl: str, tmp_path: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1: (ca, cert, key)."""
    ca_key, ca, key, csr, cert = (tmp_path / n for n in
                                  ("ca.key", "ca.pem", "server.key", "server.csr", "server.pem"))
    ext = tmp_path / "ext.cnf"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for args in (["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out",
                  ca, "-days", "2", "-subj", "/CN=fleetgen-test-ca"],
                 ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr,
                  "-subj", "/CN=127.0.0.1"],
                 ["x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
                  "-out", cert, "-days", "2", "-extfile", ext]):
        subprocess.run([openssl, *map(str, args)], check=True, capture_output=True)
    return ca, cert, key


def _start_tls_redis(server: str, port: int, certs: tuple[Path, Path, Path],
                     tmp_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    ca, cert, key = certs
    log = tmp_path / f"redis-{port}.log"
    # --port 0: plain TCP off, so the server speaks TLS only.
    proc = subprocess.Popen([server, "--port", "0", "--tls-port", str(port), "--tls-cert-file",
                             str(cert), "--tls-key-file", str(key), "--tls-ca-cert-file",
                             str(ca), "--tls-auth-clients", "no", "--requirepass", PASSWORD,
                             "--save", "", "--appendonly", "yes", "--dir", str(tmp_path),
                             "--logfile", str(log)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = (f"rediss://:{PASSWORD}@127.0.0.1:{port}/0?ssl_cert_reqs=required"
           f"&ssl_ca_certs={ca}")
    client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)

    def check() -> None:
        if proc.poll() is not None:
            text = log.read_text(errors="replace") if log.exists() else ""
            if says_address_in_use(text):
                raise PortInUse(f"redis-server could not bind {port}")
            raise RuntimeError(f"redis-server exited with {proc.returncode}:\n{text[-2000:]}")

    try:
        wait_until(lambda: probe_valkey(client, proc.pid), 15, "redis-server with TLS",
                   check=check)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc, url


def test_a_whole_run_over_rediss(make_fleet: FleetFactory, tmp_path: Path,
                                 tls_redis: str) -> None:
    fleet = make_fleet(gpus=2, redis_url=tls_redis)
    prompts, out = tmp_path / "p.jsonl", tmp_path / "out"
    kinds = make_prompts(prompts, 80)
    run_pipeline(fleet, prompts, "tls", out)
    assert_fleet_content(fleet, prompts, assert_exactly_once(out, set(kinds["good"])))
    plain = tls_redis.replace("rediss://", "redis://").split("?")[0]
    with pytest.raises(redis.ConnectionError):  # the port speaks TLS only
        redis.Redis.from_url(plain, socket_timeout=3).ping()
    for worker in fleet.workers:
        assert PASSWORD not in worker.log_text()
