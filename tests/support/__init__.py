"""What the tests share, and only that: no test module imports another test module or a
conftest (tests/layout/test_test_imports.py). Conftests declare fixtures built from these.

- waiting: `wait_until`, the one poll-with-a-deadline (fails with AssertionError).
- binaries: `require_binary`, a skip on a developer's machine, a failure under FLEETGEN_CI=1.
- sim: simulated servers in this process (`StartSim`, the `start_sim` fixture's type) and HTTP
  shortcuts.
- fleet: local fleets (`started_fleet`, `FleetFactory`), the simulators' counters, Valkey data
  copies for the loss tests, lines written.
- pipeline: prompt files, producer and drainer in this process, the exactly-once check.
- content: every result is what the simulator answers for its input; turns: the same per turn.
- workers: one real Celery worker process; held: what workers hold, read from Redis.
- cli: `fleetgen` as a child process; outdir: output directories written by hand and read.
- simproc: `fleetgen sim` in a process of its own, on a port it keeps when started again;
  disk: a small tmpfs grown in place, and the file-size limit, for the full-disk tests.
- specforge, trainers: the trainers' own rules and loaders; llama: a real llama-server;
  vllm: a real vLLM server, vllm_probes: the probes it and `--flavor vllm` both answer;
  engine_proc: what the two servers' processes share (leased port, log, readiness wait);
  ops: the venv's executables and Prometheus scrapes.
- tiers: the folders of the fleet tier (tests/conftest.py marks by them).
"""
