"""What every engine client shares (fleetgen/engine/client.py), held to the same behaviour for
each protocol over real HTTP: the API key on generations, a refusal read as the engine's own
error, readiness by the quick probe, and a server that is gone told apart from one that
refuses."""

from __future__ import annotations

import pytest

from fleetgen import errors
from fleetgen.engine import PROTOCOLS
from tests.support.sim import StartSim

KEY = "sk-test-key"


# Each protocol against each simulated engine that speaks it (SGLang has both).
@pytest.mark.parametrize(("name", "flavor"), [("sglang", "sglang"), ("openai", "sglang"),
                                              ("openai", "vllm"), ("openai", "llama")])
def test_every_client_sends_the_key_reads_refusals_and_tells_gone_apart(
        name: str, flavor: str, start_sim: StartSim) -> None:
    protocol = PROTOCOLS[name]
    # The key is required on generations: an answer at all shows the client sent it.
    sim = start_sim(context_length=64, flavor=flavor, api_key=KEY)
    client = protocol.connect(sim.url, timeout_s=10, concurrency=2, api_key=KEY)
    try:
        gen = client.generate([1, 2, 3, 4], 3, {}, rid="r:1:ab")
        assert (gen.prompt_tokens, gen.completion_tokens) == (4, 3)
        assert client.healthy()
        with pytest.raises(errors.ContextLengthError) as info:
            client.generate(list(range(1, 65)), 1, {}, rid="r:2:ab")
        assert info.value.server_prompt_tokens == 64
        sim.stop()
        with pytest.raises(errors.EngineUnreachable):
            client.generate([1, 2, 3, 4], 3, {}, rid="r:3:ab")
        assert not client.healthy()
    finally:
        client.close()
