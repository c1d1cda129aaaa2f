"""The probes the real vLLM server and the simulator's `--flavor vllm` both answer
(tests/real_engines/test_vllm.py), and the shape of an answer: its keys and the types of its
values, not the values (a random model's text, ids and timestamps differ)."""

from __future__ import annotations

from typing import Any

import httpx

from tests.support.vllm import MAX_MODEL_LEN, SERVED_NAME

MESSAGES = [{"role": "user", "content": "Hello there"}]
IDS = list(range(1000, 1020))

# name -> (path, body); GET when the body is None. The sizes are the server's context's.
PROBES: dict[str, tuple[str, dict[str, Any] | None]] = {
    "models": ("/v1/models", None),
    "chat with token ids": ("/v1/chat/completions", {
        "model": SERVED_NAME, "messages": MESSAGES, "max_tokens": 4, "return_token_ids": True}),
    "chat": ("/v1/chat/completions", {"model": SERVED_NAME, "messages": MESSAGES,
                                      "max_tokens": 2}),
    "completion of ids with token ids": ("/v1/completions", {
        "model": SERVED_NAME, "prompt": IDS, "max_tokens": 4, "return_token_ids": True}),
    "completion of ids": ("/v1/completions", {"model": SERVED_NAME, "prompt": IDS,
                                              "max_tokens": 2}),
    "tokenize messages": ("/tokenize", {"model": SERVED_NAME, "messages": MESSAGES}),
    "max_tokens 0": ("/v1/completions", {"model": SERVED_NAME, "prompt": IDS,
                                         "max_tokens": 0}),
    "max_tokens over the context": ("/v1/completions", {
        "model": SERVED_NAME, "prompt": IDS, "max_tokens": MAX_MODEL_LEN + 1}),
    "prompt of the context": ("/v1/completions", {
        "model": SERVED_NAME, "prompt": [11] * MAX_MODEL_LEN, "max_tokens": 1}),
    "prompt one over": ("/v1/completions", {
        "model": SERVED_NAME, "prompt": [11] * (MAX_MODEL_LEN + 1), "max_tokens": 1}),
    "prompt far over": ("/v1/completions", {
        "model": SERVED_NAME, "prompt": [11] * (MAX_MODEL_LEN + 50), "max_tokens": 1}),
    "chat prompt over": ("/v1/chat/completions", {
        "model": SERVED_NAME, "messages": [{"role": "user", "content": "the" * 1100}],
        "max_tokens": 1}),
    # 200, cut to the room left (24 tokens): finish_reason length.
    "prompt + max_tokens over the context": ("/v1/completions", {
        "model": SERVED_NAME, "prompt": [11] * (MAX_MODEL_LEN - 24), "max_tokens": 100,
        "ignore_eos": True}),
}


def probe_all(url: str) -> dict[str, tuple[int, Any]]:
    """name -> (status, JSON body) of every probe."""
    answers: dict[str, tuple[int, Any]] = {}
    with httpx.Client(base_url=url, timeout=120) as http:
        for name, (path, body) in PROBES.items():
            response = http.get(path) if body is None else http.post(path, json=body)
            try:
                answers[name] = (response.status_code, response.json())
            except ValueError:  # a 404's text
                answers[name] = (response.status_code, response.text)
    return answers


def shape(value: Any) -> Any:
    """Keys and value types, recursively; a list by the shape of its first item."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__
