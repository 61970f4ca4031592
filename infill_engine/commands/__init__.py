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


def load_in_process(args: argparse.Namespace, compile_first: bool = False) -> InfillEngine:
    """The engine of the command line's model options, loaded in this process (with --threads where given).

    `compile_first` (the benchmarks'): where the layers would run compiled (--compiled-layers auto) but none are
    compiled for this model, PyTorch and CPU yet (a new model, a fresh machine), compile them before returning, as a
    server does in the background (30-60 s, once per machine), so that what is measured is what a server runs."""
    import sys

    from infill_engine.engine import InfillEngine
    from infill_engine.loading import ModelLoadError

    try:
        spec = model_spec_from_args(args)
        if spec.threads:
            import torch

            torch.set_num_threads(spec.threads)
        engine = InfillEngine.load(spec)
    except (ModelLoadError, ValueError) as error:
        raise UsageError(str(error)) from None
    compile_now = getattr(getattr(engine, "denoiser", None), "compile_layers_now", None)
    if compile_first and spec.compiled_layers == "auto" and compile_now is not None:
        def announce() -> None:
            print("compiling the model's layers for this CPU before measuring (30-60 s, once per model and machine; "
                  "a server does it in the background)", file=sys.stderr, flush=True)

        if compile_now(spec, announce):
            print(f"compiled layers: {engine.denoiser.compiled_layers_state}", file=sys.stderr, flush=True)
    return engine
