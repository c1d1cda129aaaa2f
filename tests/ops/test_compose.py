"""compose/: no Docker engine here, so the file is checked as data: every worker on its own
engine and GPU, unique ports, secrets only from the environment, real fleetgen flags."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from fleetgen.cli.main import build_parser
from tests.support.ops import REPO

COMPOSE = REPO / "compose" / "docker-compose.yml"
ENV_EXAMPLE = REPO / "compose" / ".env.example"
GPUS = 8
VAR = re.compile(r"\$\{(\w+)(?::?([-?])([^}]*))?\}")
SECRET_NAME = re.compile(r"PASSWORD|SECRET|(^|_)TOKEN$|API_KEY|BASIC_AUTH", re.IGNORECASE)


@pytest.fixture(scope="module")
def services() -> dict[str, dict[str, Any]]:
    data = yaml.safe_load(COMPOSE.read_text())
    return dict(data["services"])


def resolve(value: str) -> str:
    """What compose substitutes: the default where one is given, else a placeholder."""
    return VAR.sub(lambda m: m.group(3) if m.group(2) == "-" else f"<{m.group(1)}>", value)


def command(service: dict[str, Any]) -> list[str]:
    return [resolve(str(a)) for a in service["command"]]


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_compose_parses_and_has_the_whole_process_set(services: dict[str, Any]) -> None:
    expected = {"valkey", "drainer", "flower", "metrics", "produce",
                *(f"sglang{n}" for n in range(GPUS)), *(f"worker{n}" for n in range(GPUS))}
    assert set(services) == expected


def test_each_worker_points_at_its_own_engine_on_its_own_gpu(services: dict[str, Any]) -> None:
    engines = set()
    for n in range(GPUS):
        sglang, worker = services[f"sglang{n}"], services[f"worker{n}"]
        argv = command(sglang)
        port = int(flag(argv, "--port"))
        assert flag(argv, "--context-length") == "8192" and "--enable-metrics" in argv
        devices = sglang["deploy"]["resources"]["reservations"]["devices"]
        assert [d["device_ids"] for d in devices] == [[str(n)]]
        assert f":{port}/ready" in " ".join(sglang["healthcheck"]["test"])
        engine = worker["environment"]["FLEETGEN_ENGINE_URL"]
        assert engine == f"http://sglang{n}:{port}", (n, engine)
        engines.add(engine)
        celery = command(worker)
        assert celery[:6] == ["celery", "-A", "workers", "worker", "-Q", "fleetgen"]
        assert flag(celery, "-n") == f"gpu{n}@%h" and flag(celery, "-P") == "threads"
        assert worker["depends_on"][f"sglang{n}"]["condition"] == "service_healthy"
        check = worker["healthcheck"]["test"]
        assert check[:3] == ["CMD", "fleetgen", "check"] and f"gpu{n}@%h" in check
        assert worker["stop_grace_period"] == "60s"  # longer than Celery's soft shutdown
    assert len(engines) == GPUS


def test_ports_are_unique(services: dict[str, Any]) -> None:
    published: list[str] = []
    for s in services.values():
        for mapping in s.get("ports", []):
            host_ip_port = resolve(mapping).rsplit(":", 1)[0]
            published.append(host_ip_port.split(":")[-1])
    assert len(published) == len(set(published)), published
    engine_ports = [flag(command(services[f"sglang{n}"]), "--port") for n in range(GPUS)]
    assert len(set(engine_ports)) == GPUS


def test_secrets_come_from_the_environment_only(services: dict[str, Any]) -> None:
    text = COMPOSE.read_text()
    for name, s in services.items():
        for key, value in (s.get("environment") or {}).items():
            value = str(value)
            if SECRET_NAME.search(key):
                assert VAR.fullmatch(value), f"{name}.{key} is written in the file"
            password = re.match(r"rediss?://[^:/@]*:([^@]*)@", value)
            if password:
                assert VAR.fullmatch(password.group(1)), f"{name}.{key} holds a password"
        assert not any(SECRET_NAME.search(str(a)) and "=" in str(a) for a in s.get("command", []))
    assert "requirepass" not in text and "--basic-auth" not in text
    # Every required variable is documented in .env.example, whose secrets are left empty.
    example = dict(line.split("=", 1) for line in ENV_EXAMPLE.read_text().splitlines()
                   if line and not line.startswith("#"))
    required = {m.group(1) for m in VAR.finditer(text) if m.group(2) == "?"}
    assert required <= set(example), required - set(example)
    assert {k: v for k, v in example.items() if SECRET_NAME.search(k)} == {
        "REDIS_PASSWORD": "", "FLOWER_BASIC_AUTH": ""}


def test_valkey_has_aof_password_and_a_volume(services: dict[str, Any]) -> None:
    valkey = services["valkey"]
    argv = command(valkey)
    assert argv[:2] == ["fleetgen", "valkey"]  # AOF everysec + noeviction + requirepass
    assert flag(argv, "--dir") == "/data" and "valkey-data:/data" in valkey["volumes"]
    assert "REDIS_PASSWORD" in valkey["environment"]["FLEETGEN_REDIS_URL"]
    assert services["flower"]["environment"]["FLOWER_BASIC_AUTH"].startswith(
        "${FLOWER_BASIC_AUTH:?")  # compose refuses to start Flower without credentials
    assert any(v.startswith("out:") for v in services["drainer"]["volumes"])


def test_fleetgen_commands_use_real_flags(services: dict[str, Any]) -> None:
    """Every `fleetgen ...` in the file (commands and healthchecks) parses with fleetgen's
    own parser, so a renamed flag breaks this test, not a deployment."""
    parser = build_parser()
    argvs = [command(s) for s in services.values()]
    argvs += [[resolve(a) for a in s["healthcheck"]["test"][1:]] for s in services.values()
              if "healthcheck" in s]
    fleetgen = [a for a in argvs if a and a[0] == "fleetgen"]
    assert len(fleetgen) >= 5 + GPUS
    for argv in fleetgen:
        parser.parse_args(argv[1:])


def test_dockerfile_installs_the_package() -> None:
    dockerfile = (REPO / "compose" / "Dockerfile").read_text()
    for package in ("fleetgen", "producer", "workers"):
        assert f"COPY {package} ./{package}" in dockerfile
    assert "pip install ." in dockerfile and "USER fleetgen" in dockerfile
