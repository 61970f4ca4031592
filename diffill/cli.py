"""The `diffill` command table: each subcommand's module adds its arguments and runs it.

A subcommand module exports `HELP`, `add_arguments(parser)` and `run(args) -> int`, and imports nothing heavy at
module level, so building the whole parser imports no torch: `diffill serve` answers `initialize` before torch is
loaded. Logging is set up here once, and bad usage (a `UsageError` or an argparse error) exits with status 2.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from types import ModuleType

from infill_engine.commands import UsageError

# name -> module; the order is the order of `diffill --help`
COMMANDS = {
    "fill": "infill_engine.commands.fill",
    "serve": "lsp_server.cli",
    "engine": "infill_engine.service.command",
    "http": "infill_engine.http.command",
    "doctor": "infill_engine.commands.doctor",
    "models": "infill_engine.commands.models",
    "compile": "infill_engine.commands.compile_layers",
    "bench": "diffill.bench",
    "eval": "infill_engine.commands.evaluate",
    "train": "infill_engine.training.cli",
}
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def command_module(name: str) -> ModuleType:
    """The module of a subcommand."""
    return importlib.import_module(COMMANDS[name])


def build_parser() -> argparse.ArgumentParser:
    """The parser of `diffill` with every subcommand."""
    parser = argparse.ArgumentParser(prog="diffill", description="Code infilling with a diffusion language model.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens to standard error")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        module = command_module(name)
        module.add_arguments(commands.add_parser(name, help=module.HELP, description=module.HELP))
    return parser


def set_up_logging(verbose: bool) -> None:
    """Log to standard error (stdout may carry a protocol); quiet the model libraries unless verbose."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, stream=sys.stderr, format=LOG_FORMAT)
    if not verbose:  # read by transformers and huggingface_hub when (and if) they are imported
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `diffill` console command; the subcommand's exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse: 2 for bad usage (with its message), 0 for --help
        return int(exit_.code or 0)
    set_up_logging(args.verbose)
    try:
        return command_module(args.command).run(args)
    except UsageError as error:
        print(f"diffill: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (`diffill models | head`): stop quietly, as `cat` does
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the flush at exit writes nowhere instead of failing again
        return 141  # 128 + SIGPIPE, what a shell reports for a command the pipe stopped


if __name__ == "__main__":
    sys.exit(main())
