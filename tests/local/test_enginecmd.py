"""`--engine-cmd`'s checks and the restart policy's arithmetic, as plain functions: the launch
line, the host's GPUs and their groups, backoff and parking."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetgen.errors import ConfigError
from fleetgen.local.enginecmd import (
    EnginePolicy,
    FailureWindow,
    backoff_s,
    choose_gpus,
    gpu_groups,
    parse_engine_cmd,
    parse_gpu_list,
    visible_gpus,
)


def found(name: str) -> str | None:
    return f"/usr/bin/{name}" if name in ("python", "fleetgen") else None


def test_port_and_gpu_are_filled_in_per_engine() -> None:
    cmd = parse_engine_cmd("python -m sglang.launch_server --port {port} --log "
                           "'/logs/gpu{gpu}.log' --json '{\"a\": 1}'", which=found)
    assert cmd.argv(30001, ("2", "3")) == [
        "python", "-m", "sglang.launch_server", "--port", "30001", "--log", "/logs/gpu2,3.log",
        "--json", '{"a": 1}']


def test_a_shells_variable_prefix_is_the_engines_environment() -> None:
    # As typed for the CPU SGLang (docs/engines.md): before, the program was
    # 'SGLANG_USE_CPU_ENGINE=1', "not on PATH".
    cmd = parse_engine_cmd("SGLANG_USE_CPU_ENGINE=1 OMP_NUM_THREADS=1 LOG=/l/{gpu} python -m "
                           "sglang.launch_server --port {port}", which=found)
    assert cmd.program == "python"
    assert cmd.argv(30001, ("2",)) == ["python", "-m", "sglang.launch_server", "--port",
                                       "30001"]
    assert cmd.environment(30001, ("2",)) == {"SGLANG_USE_CPU_ENGINE": "1",
                                              "OMP_NUM_THREADS": "1", "LOG": "/l/2"}
    # `env NAME=value prog` is a program of its own, left as it is.
    plain = parse_engine_cmd("env A=1 python --port {port}", which=lambda n: f"/usr/bin/{n}")
    assert plain.program == "env" and plain.environment(1, ("0",)) == {}


@pytest.mark.parametrize(("cmd", "says"), [
    ("A=1 B=2", "sets variables but names no program"),
    ("python -m sglang.launch_server --port 30000", "must contain {port}"),
    ("", "is empty"),
    ("python 'unclosed", "does not split"),
    ("nosuchserver --port {port}", "'nosuchserver' is not on PATH"),
    ("/no/such/bin --port {port}", "'/no/such/bin' is not an executable file"),
])
def test_a_bad_launch_line_is_one_line(cmd: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        parse_engine_cmd(cmd, which=found)


def test_gpu_lists_take_ranges_and_refuse_repeats() -> None:
    assert parse_gpu_list("0-2,5") == ["0", "1", "2", "5"]
    assert parse_gpu_list("GPU-3f2a,GPU-77") == ["GPU-3f2a", "GPU-77"]
    with pytest.raises(ConfigError, match="twice"):
        parse_gpu_list("0,1,0")
    with pytest.raises(ConfigError, match="backwards"):
        parse_gpu_list("3-1")


def test_gpus_are_what_the_host_shows() -> None:
    assert choose_gpus(None, ["0", "1", "2", "3"]) == ["0", "1", "2", "3"]
    assert choose_gpus("2,3", ["0", "1", "2", "3"]) == ["2", "3"]
    with pytest.raises(ConfigError, match=r"GPU 4, 7, which this host does not have "
                                          r"\(visible: 0,1,2,3\)"):
        choose_gpus("0,4,7", ["0", "1", "2", "3"])
    with pytest.raises(ConfigError, match="no GPU is visible"):
        choose_gpus(None, None)
    with pytest.raises(ConfigError, match="shows no GPU"):
        choose_gpus("0", None)


def test_visible_gpus_come_from_cuda_visible_devices_else_dev(tmp_path: Path) -> None:
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "4,5"}, tmp_path) == ["4", "5"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, tmp_path) == []
    assert visible_gpus({}, tmp_path) is None
    for name in ("nvidia10", "nvidia2", "nvidiactl", "nvidia-uvm"):
        (tmp_path / name).touch()
    assert visible_gpus({}, tmp_path) == ["2", "10"]


def test_gpu_groups_are_consecutive_and_must_divide() -> None:
    assert gpu_groups(["0", "1", "2", "3"], 2) == [("0", "1"), ("2", "3")]
    assert gpu_groups(["0", "1"], 1) == [("0",), ("1",)]
    with pytest.raises(ConfigError, match="does not divide the 3 GPU"):
        gpu_groups(["0", "1", "2"], 2)
    with pytest.raises(ConfigError, match="at least 1"):
        gpu_groups(["0"], 0)


def test_backoff_doubles_up_to_its_cap() -> None:
    policy = EnginePolicy(backoff_base_s=1.0, backoff_cap_s=10.0)
    assert [backoff_s(n, policy) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]


def test_an_engine_is_parked_at_k_failures_within_the_window() -> None:
    window = FailureWindow(EnginePolicy(max_failures=3, window_s=100.0))
    assert window.record(0.0) == 1 and window.record(50.0) == 2
    assert not window.parked()
    assert window.record(120.0) == 2  # the first one is out of the window
    assert not window.parked()
    assert window.record(130.0) == 3
    assert window.parked()


def test_the_policy_refuses_nonsense() -> None:
    with pytest.raises(ConfigError, match="start_timeout_s must be > 0"):
        EnginePolicy(start_timeout_s=0)
    with pytest.raises(ConfigError, match="max_failures must be at least 1"):
        EnginePolicy(max_failures=0)
    assert EnginePolicy().start_timeout_s >= 1200  # a 27B model's load and graph capture
