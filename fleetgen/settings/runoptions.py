"""Every run option, once: its setting, type, default, flags and help, whether the manifest pins
it and whether summary.json keeps it.

`fleetgen produce`'s flags (and those `fleetgen run` and `fleetgen demo` share with it) are
made from `TABLE` (fleetgen/cli/produce.py `add_producer_options`), `ProducerSettings` takes
its defaults from it (producer/settings.py), the resume check pins `PINNED`
(producer/manifest.py), the drainer copies `SUMMARY_SETTINGS` into summary.json
(fleetgen/drainer/bookkeeping.py), and docs/options.md is generated from it by
tools/options_table.py (tests/settings/test_runoptions.py fails when the two differ). A new
option is one entry here, one field of `ProducerSettings`, and the code that uses it. An entry
is a fleetgen/settings/table.py `Setting` (as an environment variable is) with its `Flag`
(how a command line gives it) and where the run keeps it (`Kept`).

`run` and `demo` declare a few flags of their own where theirs mean more than produce's: the
servers to start a worker for (`--engine-url`), the output directory (`--out`), the simulated
servers' context (the demo's `--context-length`), their own Redis (`run --redis`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from fleetgen.settings import envvars
from fleetgen.settings.envvars import EnvVar
from fleetgen.settings.table import Column, Setting, escaped_tags, markdown

PRODUCE: Final = "produce"
RUN: Final = "run"
DEMO: Final = "demo"
COMMANDS: Final = (PRODUCE, RUN, DEMO)
EVERY: Final = frozenset(COMMANDS)
PRODUCE_ONLY: Final = frozenset({PRODUCE})

# The tokenizer a run uses unless told otherwise (built offline: producer/qwen_build.py).
DEFAULT_TOKENIZER: Final = "qwen3.6"
MAX_LOGPROBS: Final = 20  # OpenAI's top_logprobs limit; vLLM's default max_logprobs is 20
SAMPLING: Final = "sampling"  # the setting the sampling flags fill, one key each


@dataclass(frozen=True)
class Flag:
    """How a command line gives an option: its flags and how argparse reads them."""

    names: tuple[str, ...]
    dest: str | None = None
    type: Callable[[str], Any] | None = None
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    action: str | None = None
    required: bool = False
    env: EnvVar[Any] | None = None  # the flag's default is this variable's value
    # Per command, what differs from the entry in its flag (the demo's own --batch-size).
    per_command: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def kwargs(self, help: str, default: Any) -> dict[str, Any]:
        """What `add_argument` takes (but what differs per command), `default` the setting's."""
        kwargs: dict[str, Any] = {"help": help}
        if self.action is not None:
            kwargs["action"] = self.action
        if self.dest is not None:
            kwargs["dest"] = self.dest
        for name in ("type", "metavar", "choices"):
            if getattr(self, name) is not None:
                kwargs[name] = getattr(self, name)
        if self.required:
            kwargs["required"] = True
        if self.action not in ("store_true", "store_false") and not self.required:
            kwargs["default"] = default
        return kwargs


@dataclass(frozen=True)
class Kept:
    """Where a run keeps a setting. `pinned`: a resumed run may not change it (kept in the
    manifest and checked at every resume). `summary`: copied into summary.json's settings: how
    the files' rows were made, for an export long after `fleetgen purge`, and what a rerun of a
    finished run (its Redis state gone) is held to (every pinned setting but the file list);
    never a URL or anything that may hold a secret."""

    pinned: bool = False
    summary: bool = False
    stored: bool = False  # kept in the manifest's settings though not pinned (pinned ones are)
    key: str | None = None  # its key in the manifest's settings, where it is not the name
    into: str | None = None  # one key of another setting (a sampling option)
    setting: bool = True  # a ProducerSettings field (else an argument of the command alone)


PINNED_IN_SUMMARY: Final = Kept(pinned=True, summary=True)
NOT_A_SETTING: Final = Kept(setting=False)


@dataclass(frozen=True)
class RunOption(Setting):
    """A run option: `name` is its setting (its ProducerSettings field, its key in the
    manifest's settings), `help` --help's text (`%(default)s` is the default) and the docs'
    line, `default` None where it is unset."""

    default: Any = None
    flag: Flag | None = None  # None: not a flag (the input, what fleetgen finds itself)
    commands: frozenset[str] = EVERY  # the commands whose parser takes the flag from here
    kept: Kept = Kept()

    @property
    def flags(self) -> tuple[str, ...]:
        return () if self.flag is None else self.flag.names

    @property
    def stored_as(self) -> str:
        return self.kept.key or self.name

    @property
    def attr(self) -> str:
        """The flag's attribute in the parsed arguments."""
        dest = None if self.flag is None else self.flag.dest
        return dest or self.name

    def default_words(self) -> str:
        if self.default is None:
            return "unset"
        if isinstance(self.default, bool):
            return "on" if self.default else "off"
        if isinstance(self.default, (tuple, list)) and not self.default:
            return "none"
        if isinstance(self.default, dict):
            return "{}" if not self.default else str(self.default)
        return str(self.default)

    def doc(self) -> str:
        """The help as the docs show it: the default written out, `%%` as `%`."""
        given = self.shown_default() if self.default is None else self.default
        return self.help % {"default": given}

    def argparse_kwargs(self, command: str) -> dict[str, Any]:
        """What `add_argument` takes for this flag in `command`'s parser."""
        if self.flag is None:
            raise KeyError(f"{self.name} is no flag")
        kwargs = self.flag.kwargs(self.help, self.flag_default())
        kwargs.update(self.flag.per_command.get(command, {}))
        return kwargs

    def flag_default(self) -> Any:
        """The default as the flag gives it: what the setting is made from."""
        if self.flag is not None and self.flag.env is not None:
            return self.flag.env.value()
        if self.flag is not None and self.flag.action == "append":
            return None if self.default is None else list(self.default)
        if self.kind == "JSON":
            return json.dumps(self.default)
        return self.default


def _sampling(name: str, kind: str, type_: Callable[[str], Any] | None, metavar: str,
              help: str = "", **more: Any) -> RunOption:
    flag = Flag(("--" + name.replace("_", "-"),), type=type_, metavar=metavar, **more)
    return RunOption(name, kind, help or f"sampling {name} (the server's default)", flag=flag,
                     kept=Kept(into=SAMPLING, setting=False))


TABLE: tuple[RunOption, ...] = (
    # -- what the run is: its name, its input, its Redis ------------------------------------
    RunOption("input", "path", "the prompts (the positional INPUT): a file, a directory or a "
              "quoted glob (the demo's is --prompts)", commands=frozenset({PRODUCE, RUN}),
              kept=PINNED_IN_SUMMARY, default_text="required"),
    RunOption("files", "list", "the input's files as the producer resolved them (fleetgen "
              "writes it: a resume must read the same)", commands=frozenset(),
              kept=Kept(pinned=True, setting=False), default_text="found"),
    RunOption("run", "text", "run name (resume with the same name)",
              flag=Flag(("--run",), required=True), commands=PRODUCE_ONLY, default_text="required"),
    RunOption("redis_url", "URL", "Redis URL (default: $FLEETGEN_REDIS_URL)",
              flag=Flag(("--redis",), dest="redis", metavar="URL"), commands=PRODUCE_ONLY,
              kept=Kept(stored=True, key="redis"), default_text="$FLEETGEN_REDIS_URL", secret=True),
    # -- the servers' limits: where the budget comes from -----------------------------------
    RunOption("context_length", "integer", "the servers' context length in tokens",
              flag=Flag(("--context-length",), type=int, metavar="N"), commands=PRODUCE_ONLY,
              kept=PINNED_IN_SUMMARY, default_text="read from --engine-url"),
    RunOption("engine_url", "URL, repeatable", "read the limits from this server "
              "(/v1/models, /server_info): context, input limit, speculative reserve. Repeat "
              "it for every server of the fleet (or give a comma list, or "
              "http://HOST:30000-30007 for a range of ports): the smallest limits win", default=(),
              flag=Flag(("--engine-url",), metavar="URL", action="append"), commands=PRODUCE_ONLY,
              kept=Kept(stored=True)),
    # Its choices are the engine registry's (fleetgen/engine/kinds.py), which this floor
    # cannot import: the CLI gives them (fleetgen/cli/engineflags.py `protocol_choices`).
    RunOption("engine_protocol", "protocol name", "sglang (native /generate) or openai "
              "(/v1/completions: vLLM, llama.cpp), or a registered plug-in's; picks the length "
              "rule. Default: $FLEETGEN_ENGINE_PROTOCOL, else detected from the --engine-url "
              "server, else sglang",
              flag=Flag(("--engine-protocol",), metavar="NAME", env=envvars.ENGINE_PROTOCOL),
              commands=PRODUCE_ONLY, kept=Kept(stored=True),
              default_text="$FLEETGEN_ENGINE_PROTOCOL, else detected"),
    RunOption("reserved_tokens", "integer", "tokens the servers count with every input, for "
              "--context-length without --engine-url: SGLang's speculative reserve, "
              "max(eagle_topk x num_steps, num_draft_tokens) with EAGLE (%(default)s)", default=0,
              flag=Flag(("--reserved-tokens",), type=int, metavar="N"), commands=PRODUCE_ONLY,
              kept=PINNED_IN_SUMMARY),
    RunOption("max_req_input_len", "integer", "the servers' own input limit (/server_info "
              "max_req_input_len), for --context-length without --engine-url (default: "
              "derived from the context)",
              flag=Flag(("--max-req-input-len",), type=int, metavar="N"), commands=PRODUCE_ONLY,
              kept=PINNED_IN_SUMMARY, default_text="derived from the context"),
    # -- how `fleetgen produce` runs --------------------------------------------------------
    RunOption("no_wait", "flag", "exit once every row is enqueued, instead of waiting until "
              "every row has an outcome and re-enqueueing rows lost to a Redis crash",
              default=False, flag=Flag(("--no-wait",), action="store_true"), commands=PRODUCE_ONLY,
              kept=NOT_A_SETTING),
    RunOption("reconcile_interval", "seconds", "seconds between checks for lost rows while "
              "waiting (30)", default=30.0,
              flag=Flag(("--reconcile-interval",), type=float, metavar="S"), commands=PRODUCE_ONLY,
              kept=NOT_A_SETTING, default_text="30"),
    RunOption("out", "path", "with --turns all: the drainer's output directory (`fleetgen "
              "drain --out DIR`), where each next turn's history is read from",
              flag=Flag(("--out",), type=Path, metavar="DIR"), commands=PRODUCE_ONLY),
    # -- what a row becomes -----------------------------------------------------------------
    RunOption("turns", "last|all", "last: regenerate each conversation's last assistant turn "
              "(default); all: every assistant turn in order, each from the answers this run "
              "wrote before it (the input's own answers are discarded); one result per turn",
              default="last", flag=Flag(("--turns",), choices=("last", "all")),
              kept=PINNED_IN_SUMMARY),
    RunOption("affinity", "flag", "no prefix affinity: a row's samples, prompts that share "
              "a system prompt and (with --turns all) each next turn go to any server, not "
              "preferably to the one that holds their prefix in cache", default=True,
              flag=Flag(("--no-affinity",), dest="affinity", action="store_false")),
    RunOption("tokenizer", "PATH|qwen3.6", "a local Hugging Face tokenizer directory, or "
              f"{DEFAULT_TOKENIZER} (built offline; default)", default=DEFAULT_TOKENIZER,
              flag=Flag(("--tokenizer",), metavar=f"PATH|{DEFAULT_TOKENIZER}"),
              kept=PINNED_IN_SUMMARY),
    RunOption("max_output_tokens", "integer", "cap on max_tokens (default: whatever the "
              "context leaves)", flag=Flag(("--max-output-tokens",), type=int, metavar="N"),
              kept=PINNED_IN_SUMMARY, default_text="whatever the context leaves"),
    RunOption("min_output_tokens", "integer", "reject a prompt that leaves fewer output tokens "
              "than this (%(default)s)", default=16,
              flag=Flag(("--min-output-tokens",), type=int, metavar="N"), kept=PINNED_IN_SUMMARY),
    RunOption("margin", "integer", "tokens kept free below the context, for a server "
              "tokenizer that counts more (%(default)s)", default=0,
              flag=Flag(("--margin",), type=int, metavar="N"), kept=PINNED_IN_SUMMARY),
    RunOption(SAMPLING, "options", "the sampling flags below, one key each (a row's own "
              "`sampling` goes over them)", default={}, commands=frozenset(),
              kept=PINNED_IN_SUMMARY, default_text="the server's"),
    _sampling("temperature", "number", float, "T"),
    _sampling("top_p", "number", float, "P"),
    _sampling("top_k", "integer", int, "K"),
    _sampling("min_p", "number", float, "P"),
    _sampling("repetition_penalty", "number", float, "R"),
    _sampling("seed", "integer", int, "N", "sampling seed (SGLang's sampling_seed); honoured "
              "only by servers started with --enable-deterministic-inference"),
    _sampling("stop", "text, repeatable", None, "TEXT", "a stop string (repeatable)",
              action="append"),
    RunOption("n", "integer", "samples per prompt, each its own request with its own seed; one "
              "output row per (id, sample) (%(default)s)", default=1,
              flag=Flag(("--n",), type=int, metavar="N"), kept=PINNED_IN_SUMMARY),
    RunOption("holdout", "fraction", "hold this share of the rows out of the run: chosen by "
              "a hash of each row's id (the same rows on every resume and every machine), "
              "written as they were to holdout.jsonl in the output directory and never sent, "
              "for measuring a drafter on prompts it never trained on (%(default)s: none)",
              default=0.0, flag=Flag(("--holdout",), type=float, metavar="FRACTION"),
              kept=PINNED_IN_SUMMARY),
    RunOption("logprobs", "integer", "store the top-K log-probabilities of every output token "
              f"(0..{MAX_LOGPROBS}; %(default)s)", default=0,
              flag=Flag(("--logprobs",), type=int, metavar="K"), kept=PINNED_IN_SUMMARY),
    RunOption("token_ids", "flag", "keep every answer's generated token ids in its result line "
              "(`output_ids`, about 7 bytes per token), for `fleetgen export --format "
              "tokens` (drafter trainers); a server that cannot return them is refused at "
              "start", default=False, flag=Flag(("--token-ids",), action="store_true"),
              kept=PINNED_IN_SUMMARY),
    RunOption("json_schema", "file", "a JSON Schema every answer must follow (structured "
              "output); the drainer counts answers that do not validate",
              flag=Flag(("--json-schema",), type=Path, metavar="FILE"), kept=PINNED_IN_SUMMARY),
    RunOption("chat_template_kwargs", "JSON", "options for the chat template, e.g. "
              "'{\"enable_thinking\": false}' (the budget counts the template as rendered)",
              default={}, flag=Flag(("--chat-template-kwargs",), metavar="JSON"),
              kept=PINNED_IN_SUMMARY),
    RunOption("reasoning", "auto|split|off", "split each answer on </think> into `reasoning` "
              "and `completion`: auto (when </think> is one token of the tokenizer), split, "
              "off", default="auto", flag=Flag(("--reasoning",), choices=("auto", "split", "off")),
              kept=PINNED_IN_SUMMARY),
    # -- early stop -------------------------------------------------------------------------
    RunOption("stop_if", "rule, repeatable", "stop feeding the queue once the first --after "
              "answers break RULE, e.g. 'truncated>0.2', 'empty>=5%%', 'unfinished>0.1' "
              "(reasoning that ran out of budget), 'failed>0.05'; what is queued finishes, "
              "then exit 1 with the reason (repeatable)", default=(),
              flag=Flag(("--stop-if",), metavar="RULE", action="append")),
    RunOption("stop_after", "integer", "answers to wait for before judging --stop-if "
              "(%(default)s)", default=500,
              flag=Flag(("--after",), dest="stop_after", type=int, metavar="N")),
    RunOption("ignore_stop", "flag", "go on with a run that --stop-if stopped", default=False,
              flag=Flag(("--ignore-stop",), action="store_true")),
    # -- the queue ---------------------------------------------------------------------------
    RunOption("high_water", "integer", "most queued prompts (default: 2x the fleet's "
              "concurrency, at least 512)", flag=Flag(("--high-water",), type=int, metavar="N"),
              default_text="2x the fleet's concurrency, at least 512"),
    # None in run and demo: they pick their own unless given (the demo 16 with --stop-if, so
    # that a rule is judged while most of its small set is unsent: fleetgen/cli/demo.py).
    RunOption("batch_size", "integer", "rows tokenized and enqueued together (%(default)s)",
              default=512, default_text="512 (the demo: 16 with --stop-if)",
              flag=Flag(("--batch-size",), type=int, metavar="N", per_command={
                  RUN: {"default": None, "help": "rows tokenized and enqueued together (512)"},
                  DEMO: {"default": None, "help": "rows tokenized and enqueued together (512, "
                         "16 with --stop-if)"}})),
)

BY_NAME: Final = {option.name: option for option in TABLE}
# The settings a resumed run must keep (what changes what a row becomes), in the manifest.
PINNED: Final = tuple(option.stored_as for option in TABLE if option.kept.pinned)
# The manifest's settings: the pinned ones, and what is kept to be shown (never a secret).
STORED: Final = tuple(option for option in TABLE if option.kept.pinned or option.kept.stored)
# The manifest's settings copied into summary.json.
SUMMARY_SETTINGS: Final = tuple(option.stored_as for option in TABLE if option.kept.summary)
SAMPLING_OPTIONS: Final = tuple(option for option in TABLE if option.kept.into == SAMPLING)


def option(name: str) -> RunOption:
    """The entry of setting `name`; KeyError for a name the table does not have."""
    return BY_NAME[name]


def flags_of(command: str) -> tuple[RunOption, ...]:
    """The options whose flags `command`'s parser takes from the table, in --help's order."""
    return tuple(o for o in TABLE if o.flags and command in o.commands)


def flag_name(stored_as: str) -> str:
    """A stored setting as the user gives it: its flag where it has one."""
    found = next((o for o in TABLE if o.stored_as == stored_as), None)
    if found is None or not found.flags:
        return {SAMPLING: "sampling options"}.get(stored_as, stored_as)
    return found.flags[0]


def _flag_cell(option: RunOption) -> str:
    if option.flags:
        return ", ".join(f"`{flag}`" for flag in option.flags)
    return "INPUT" if option.name == "input" else "—"


def _kept_cell(option: RunOption) -> str:
    """Where the run keeps the setting: pinned in the manifest, stored there, in summary.json."""
    where = ["pinned" if option.kept.pinned else "manifest" if option.kept.stored else ""]
    if option.kept.into:
        where = [f"in `{option.kept.into}`"]
    if option.kept.summary:
        where.append("summary.json")
    return ", ".join(w for w in where if w) or "—"


# docs/options.md's table (tools/options_table.py writes it there).
DOC_COLUMNS: tuple[Column[RunOption], ...] = (
    Column("flag", _flag_cell),
    Column("setting", lambda o: f"`{o.stored_as}`"),
    Column("commands", lambda o: ", ".join(c for c in COMMANDS if c in o.commands) or "—"),
    Column("type", lambda o: escaped_tags(o.kind)),
    Column("default", lambda o: escaped_tags(o.shown_default())),
    Column("kept", _kept_cell),
    Column("what it does", lambda o: escaped_tags(o.doc())),
)


def doc_table() -> str:
    """TABLE as docs/options.md shows it."""
    return markdown(DOC_COLUMNS, TABLE)
