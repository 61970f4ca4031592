"""The engine's subcommands (`fill`, `doctor`, `compile`, `bench`, `eval`): each module exports `add_arguments` and `run`.

The `diffill` command table (`diffill.cli`) assembles them with the server's and training's. Importing these modules
is cheap (no torch); a command imports the engine when it runs.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from infill_engine.interface import model_spec_from_args

if TYPE_CHECKING:
    from infill_engine.engine import InfillEngine


class UsageError(Exception):
    """Bad input from the command line, reported as one clear line without a traceback (exit status 2)."""


def add_fill_options(parser: argparse.ArgumentParser, *, effect: str) -> None:
    """--variant (sampler settings) and --budget-ms (a fill's time budget); `effect` ends the budget's help."""
    parser.add_argument("--variant", metavar="KEY=VALUE[,...]",
                        help="sampler settings for this run, e.g. end_bias=-1,threshold=0.7 (SamplerConfig fields)")
    parser.add_argument("--budget-ms", type=int, metavar="MS",
                        help="each fill's time budget, as the language server's completion.budgetMs (250) sets it: "
                             f"past it the undecided positions take the model's best guess and repairs are skipped"
                             f"{effect} (default: no limit)")


def check_fill_options(args: argparse.Namespace) -> None:
    """Refuse a bad --variant or --budget-ms before a model loads (ValueError naming what is allowed)."""
    from infill_engine.sampler import sampler_overrides

    if args.variant:
        sampler_overrides(args.variant)
    if args.budget_ms is not None and args.budget_ms < 0:
        raise ValueError(f"--budget-ms must be an integer >= 0 (milliseconds) (got {args.budget_ms})")


def load_in_process(args: argparse.Namespace) -> InfillEngine:
    """The engine of the command line's model options, loaded in this process (with --threads where given)."""
    from infill_engine.engine import InfillEngine
    from infill_engine.loading import ModelLoadError

    try:
        spec = model_spec_from_args(args)
        if spec.threads:
            import torch

            torch.set_num_threads(spec.threads)
        return InfillEngine.load(spec)
    except (ModelLoadError, ValueError) as error:
        raise UsageError(str(error)) from None
