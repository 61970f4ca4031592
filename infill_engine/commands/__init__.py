"""The engine's subcommands (`fill`, `doctor`, `bench`, `eval`): each module exports `add_arguments` and `run`.

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
