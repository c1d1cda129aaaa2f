"""What several commands' parsers share: a subcommand's parser made from its module's docstring
(its arguments added when it is used, if it asks), the --redis flag, and flag values parsed the
same way (produce, the demo, doctor)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from fleetgen.errors import ConfigError

# The flag of every command that reaches the run's Redis (`run` and `estimate` say more).
REDIS_HELP = "Redis URL (default: $FLEETGEN_REDIS_URL)"


class CommandParser(argparse.ArgumentParser):
    """argparse, with a subcommand's arguments added the first time it parses or shows its
    help (`deferred`): `fleetgen sim`'s come from the simulator, and building the parser of
    another command (`fleetgen run`) must not import it."""

    deferred: Callable[[argparse.ArgumentParser], None] | None = None

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self._add_deferred()
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        self._add_deferred()
        return super().format_help()

    def format_usage(self) -> str:
        self._add_deferred()
        return super().format_usage()

    def _add_deferred(self) -> None:
        add, self.deferred = self.deferred, None
        if add is not None:
            add(self)


def subcommand(sub: Any, name: str, help: str, doc: str | None,
               handler: Callable[[argparse.Namespace], int],
               deferred: Callable[[argparse.ArgumentParser], None] | None = None,
               ) -> argparse.ArgumentParser:
    """The parser of `fleetgen NAME`: `help` is its line in `fleetgen --help`; its own --help
    opens with the last paragraph of `doc`: the command module's docstring (whose first one
    says the module's role to the reader of the code), or the description itself where it is
    made of the names it shows (drain's and retry's output files). `deferred` adds its
    arguments once the command is used (a CommandParser's subcommands only)."""
    description = " ".join((doc or "").rstrip().rpartition("\n\n")[2].split())
    p: argparse.ArgumentParser = sub.add_parser(name, help=help, description=description)
    p.set_defaults(handler=handler)
    if deferred is not None:
        assert isinstance(p, CommandParser), type(p)
        p.deferred = deferred
    return p


def redis_option(p: argparse.ArgumentParser, help: str = REDIS_HELP,
                 metavar: str | None = None) -> None:
    p.add_argument("--redis", metavar=metavar, help=help)


def json_object(text: str, what: str) -> dict[str, Any]:
    """`text` (a flag's value, named `what` in the message) as a JSON object; ConfigError,
    one line, if it is not JSON or not an object."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{what} is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ConfigError(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def protocol_choices() -> tuple[str, ...]:
    """Every `--engine-protocol`'s choices: the engine registry's protocols (the builtins and
    FLEETGEN_ENGINE_KINDS's), chosen there once."""
    from fleetgen.engine import protocol_names

    return protocol_names()


def engine_protocol_option(p: argparse.ArgumentParser) -> None:
    """`--engine-protocol` as `run`, `doctor` and `estimate` take it (`produce` has it from the
    run options' table, its choices given by `option_kwargs`)."""
    from fleetgen.settings.envvars import ENGINE_PROTOCOL

    names = protocol_choices()
    p.add_argument("--engine-protocol", choices=names, metavar="NAME",
                   default=ENGINE_PROTOCOL.value(),
                   help=f"{' or '.join(names)} (default: $FLEETGEN_ENGINE_PROTOCOL, else "
                   "detected)")


# Choices the run options' table cannot hold, since they come from a floor above the settings.
CHOICES: dict[str, Callable[[], tuple[str, ...]]] = {"engine_protocol": protocol_choices}


def option_kwargs(attr: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """A table flag's `add_argument` keywords, with the choices only the CLI can give."""
    choices = CHOICES.get(attr)
    return kwargs if choices is None else {**kwargs, "choices": choices()}
