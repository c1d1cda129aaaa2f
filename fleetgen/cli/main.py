"""The `fleetgen` command: one parser with a subcommand per role, and one error policy."""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

import redis

from fleetgen import __version__, exitcodes
from fleetgen.cli import signals
from fleetgen.cli.flags import CommandParser
from fleetgen.errors import USER_MISTAKES, DiskFull, EngineUnreachable
from fleetgen.records import diskfull
from fleetgen.settings import envvars

Handler = Callable[[argparse.Namespace], int]
_INTERRUPTS: list[BaseException] = []
# The commands an interrupt leaves with work to go on with: the same command resumes it.
RESUMABLE = frozenset({"demo", "run", "produce", "drain", "retry"})


class Parser(CommandParser):
    """argparse, but a flag no subcommand knows is that subcommand's error: its usage and the
    flag meant (argparse alone prints the top-level usage and no hint)."""

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            sub = self._subcommands().get(getattr(parsed, "command", None) or "")
            message = f"unrecognized arguments: {' '.join(extras)}{_did_you_mean(sub, extras)}"
            (sub or self).error(message)
        return parsed

    def _subcommands(self) -> dict[str, argparse.ArgumentParser]:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                return dict(action.choices)
        return {}


def _did_you_mean(parser: argparse.ArgumentParser | None, extras: list[str]) -> str:
    if parser is None:
        return ""
    known = [flag for action in parser._actions for flag in action.option_strings]
    for extra in extras:
        if extra.startswith("-"):
            close = difflib.get_close_matches(extra.split("=", 1)[0], known, n=1, cutoff=0.6)
            if close:
                return f" (did you mean {close[0]}?)"
    return ""


def build_parser() -> argparse.ArgumentParser:
    from fleetgen.cli import (
        check,
        demo,
        doctor,
        drain,
        estimate,
        export,
        metrics,
        node,
        produce,
        purge,
        report,
        retry,
        run,
        sim,
        status,
        valkey,
    )

    parser = Parser(
        prog="fleetgen",
        description="Generate completions for huge prompt sets on a fleet of SGLang servers: "
                    "exact token budgets, every row written exactly once, resumable.",
        epilog="Start with `fleetgen demo`. Every command reads the Redis URL from "
               "FLEETGEN_REDIS_URL unless --redis is given.",
    )
    parser.add_argument("--version", action="version", version=f"fleetgen {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in (demo, run, node, estimate, produce, drain, export, report, status, retry, purge,
                   sim, check, doctor, metrics, valkey):
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # The command as given, for a message that tells the user the command to run next.
    args.argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # One line per request would drown the progress bar; fleetgen logs what matters itself.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    handler: Handler = args.handler
    try:
        return _run(handler, args)
    except USER_MISTAKES as exc:
        print(f"fleetgen {args.command}: {exc}", file=sys.stderr)
        return exitcodes.CONFIG
    except EngineUnreachable as exc:
        print(f"fleetgen {args.command}: {exc}", file=sys.stderr)
        return exitcodes.UNAVAILABLE
    except redis.AuthenticationError:
        print(f"fleetgen {args.command}: Redis refused the password; check "
              f"{_redis_source(args)}", file=sys.stderr)
        return exitcodes.UNAVAILABLE
    except redis.ConnectionError as exc:
        print(f"fleetgen {args.command}: cannot reach Redis ({_no_secret(exc)}); check "
              f"{_redis_source(args)}{FINISHED_RUN.get(args.command, '')}", file=sys.stderr)
        return exitcodes.UNAVAILABLE
    except BrokenPipeError:
        # The reader went away (`fleetgen status | head -3`): stop quietly, as a Unix tool
        # that SIGPIPE ends does, with its exit code.
        _close_stdout()
        return exitcodes.CLOSED_PIPE
    except Exception as exc:
        full = _disk_full(exc)
        if full is not None:
            print(f"fleetgen {args.command}: {full}", file=sys.stderr)
            return exitcodes.DISK_FULL
        # A bug, not a user mistake: the traceback is what the next engineer needs. Exit 70,
        # so a script never mistakes it for 1 (the run is merely incomplete).
        logging.getLogger("fleetgen").exception("fleetgen %s failed unexpectedly", args.command)
        return exitcodes.BUG
    except KeyboardInterrupt as exc:
        # Held until entrypoint's os._exit: letting go of its traceback would free all the
        # command held (a tokenizer's vocabulary: a second or more) before the exit.
        _INTERRUPTS.append(exc)
        if not isinstance(exc, signals.Stopped):  # else the command has said how it stopped
            again = "; run the same command again to resume" if args.command in RESUMABLE \
                else ""
            print(f"fleetgen {args.command}: interrupted{again}", file=sys.stderr)
        return exitcodes.INTERRUPTED


# `fleetgen run` and the demo stop the Valkey they embed when the run ends: status asked of a
# finished run reaches nothing, and must say where the run's figures are.
FINISHED_RUN = {"status": ". A finished `fleetgen run` or demo stopped its own Valkey: its "
                          "figures are in OUT/summary.json, and `fleetgen report OUT` draws "
                          "them"}


def _run(handler: Handler, args: argparse.Namespace) -> int:
    try:
        return handler(args)
    finally:
        signals.disarm()  # no grace timer fires into the command's way out


def _disk_full(exc: Exception) -> DiskFull | None:
    """A full disk wherever the command met it (its own files, or Redis's MISCONF): what to
    do about it is the same, so it is one line rather than a bug's traceback."""
    if isinstance(exc, DiskFull):
        return exc
    if isinstance(exc, OSError):
        return diskfull.from_os_error(exc)
    if isinstance(exc, redis.ResponseError):
        return diskfull.from_redis_error(exc, None)
    return None


def _close_stdout() -> None:
    """Nothing more reaches the closed pipe, the interpreter's own flush at exit included
    (else it prints "Exception ignored ... BrokenPipeError")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no real stdout (a test's capture): nothing to flush
        pass


def _redis_source(args: argparse.Namespace) -> str:
    """Where the command took its Redis URL from: the flag when given, else the variable."""
    return "--redis" if getattr(args, "redis", None) else envvars.REDIS_URL.name


def _no_secret(exc: Exception) -> str:
    # redis-py's messages name host and port, never the password; keep only the first line.
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def entrypoint() -> None:
    code = main()
    if code == exitcodes.INTERRUPTED:
        # Stopped by a signal: everything is written and flushed, so skip the interpreter's
        # teardown (freeing a tokenizer's vocabulary alone takes a second or more on a busy
        # machine), which would otherwise break the promise to stop within 2 s of SIGTERM.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
