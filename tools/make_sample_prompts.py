"""Writes fleetgen/data/sample_prompts.jsonl: the demo's varied, deterministic prompt set.

It holds every input shape fleetgen reads (messages, ShareGPT conversations, role/content
conversations, raw prompts), extra fields to carry through, a few prompts too long for an
8,192-token context, and a few malformed lines. Run it again to regenerate the file.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

TOPICS = ["binary search", "the French revolution", "photosynthesis", "Rust lifetimes",
          "a haiku about autumn", "Kubernetes pods", "the Pythagorean theorem", "sourdough",
          "quantum entanglement", "SQL joins", "the history of jazz", "gradient descent",
          "black holes", "TCP handshakes", "Shakespeare's sonnets", "compound interest"]
ASKS = ["Explain {t} to a ten-year-old.", "Write a short essay on {t}.",
        "Give three surprising facts about {t}.", "Summarize {t} in one paragraph.",
        "What are common misconceptions about {t}?", "Write Python code related to {t}."]
CJK = ["请用三句话解释{t}。", "{t}について簡単に説明してください。", "{t}에 대해 설명해 주세요."]
SYSTEMS = ["You are a helpful assistant.", "You are a concise expert. Answer briefly.",
           "You answer in the style of a pirate."]


def ask(rng: random.Random) -> str:
    t = rng.choice(TOPICS)
    pool = CJK if rng.random() < 0.15 else ASKS
    text = rng.choice(pool).format(t=t)
    if rng.random() < 0.2:
        text += "\n\n" + " ".join(rng.choice(TOPICS) for _ in range(rng.randint(20, 200)))
    return text


def row(i: int, rng: random.Random) -> dict:
    shape = i % 5
    extra = {"source": rng.choice(["infinity-instruct", "sharegpt", "synthetic"]),
             "difficulty": rng.randint(1, 5)}
    if shape == 0:
        msgs = [{"role": "system", "content": rng.choice(SYSTEMS)},
                {"role": "user", "content": ask(rng)}]
        return {"id": f"sample-{i:04d}", "messages": msgs, **extra}
    if shape == 1:
        conv = [{"from": "human", "value": ask(rng)}, {"from": "gpt", "value": "old answer"}]
        return {"id": f"sample-{i:04d}", "conversations": conv, **extra}
    if shape == 2:
        conv = [{"role": "user", "content": ask(rng)}, {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "Now go deeper."}]
        return {"id": f"sample-{i:04d}", "conversations": conv, **extra}
    if shape == 3:
        return {"prompt": f"Question: {ask(rng)}\nAnswer:", **extra}  # id derived
    return {"id": i, "messages": [{"role": "user", "content": ask(rng)}], **extra}


def main() -> None:
    rng = random.Random(20261129)
    lines = [json.dumps(row(i, rng), ensure_ascii=False) for i in range(300)]
    too_long = " ".join(rng.choice(TOPICS) for _ in range(9000))
    for k in range(4):
        lines.insert(40 + 60 * k, json.dumps(
            {"id": f"too-long-{k}", "messages": [{"role": "user", "content": too_long}]}))
    malformed = ['{"id": "broken-json", "messages": [', '{"id": "no-prompt", "text": "hi"}',
                 '{"id": "empty-messages", "messages": []}', '["not", "an", "object"]',
                 '{"id": "bad-role", "conversations": [{"from": "alien", "value": "x"}]}',
                 '{"id": 3.5, "prompt": "float id"}']
    for k, bad in enumerate(malformed):
        lines.insert(25 + 45 * k, bad)
    lines.insert(100, "")
    out = Path(__file__).resolve().parents[1] / "fleetgen" / "data" / "sample_prompts.jsonl"
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {len(lines)} lines to {out}")


if __name__ == "__main__":
    main()
