"""llama.cpp's OpenAI answer says which stop word ended it only in `__verbose`, which the server
adds when the request says `verbose`: fleetgen asks for it whenever stop strings are sent, not
only with token ids (before, a llama.cpp answer ended by a stop string read as ended by EOS).
Against the simulator's `--flavor llama` over HTTP."""

from __future__ import annotations

from fleetgen.engine.openai import LLAMA_CPP, PROTOCOL, completion_body
from tests.support.sim import StartSim


def test_stop_strings_ask_llama_cpp_for_verbose() -> None:
    assert completion_body([1], 4, {"stop": ["END"]}, None, engine=LLAMA_CPP)["verbose"] is True
    assert "verbose" not in completion_body([1], 4, {}, None, engine=LLAMA_CPP)
    assert "verbose" not in completion_body([1], 4, {"stop": ["END"]}, None)  # vLLM's


def test_the_stop_word_that_ended_a_llama_answer_is_read(start_sim: StartSim) -> None:
    sim = start_sim(flavor="llama", context_length=4096, output_tokens_mean=40)
    client = PROTOCOL.connect(sim.url, timeout_s=30, concurrency=1)
    try:
        free = client.generate([11] * 8, 40, {}, "free")
        word = free.text.split()[2]
        stopped = client.generate([11] * 8, 40, {"stop": [word]}, "stopped")
    finally:
        client.close()
    assert stopped.stop_matched == word
    assert stopped.text == free.text[:free.text.index(word)]
