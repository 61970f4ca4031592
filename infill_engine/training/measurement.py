"""What the training side's measures of a model share (`held_out_lines`, `end_probe`): the model loaded as they
score it, in float32 on the CPU with eager layers so that figures compare across machines, and their rows written
as JSON."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any


def add_measure_arguments(parser: argparse.ArgumentParser, holes: int, holes_help: str) -> None:
    """The options every measure takes: the models, how many holes (`holes` by default), threads and a JSON file."""
    parser.add_argument("models", nargs="+", help="model or checkpoint directories")
    parser.add_argument("--holes", type=int, default=holes, help=f"{holes_help} (default {holes})")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--json", type=Path, help="also write the rows here")


def measured_engine(model: str) -> Any:
    """An InfillEngine of `model` in float32 on the CPU, its layers eager; ModelLoadError where it does not load."""
    from infill_engine.engine import InfillEngine
    from infill_engine.loading import load_denoiser

    return InfillEngine(load_denoiser(model, device="cpu", dtype="float32", compiled_layers="off"))


def write_rows(path: Path, rows: list[Any]) -> None:
    """The rows (dataclasses) as a JSON list at `path`, written whole or not at all."""
    from infill_engine.atomic import write_text_atomic

    write_text_atomic(path, json.dumps([asdict(row) for row in rows], indent=1) + "\n")


def measure_models(tool: str, models: list[str], measure: Callable[[Any, str], list[Any]], out: Path | None) -> int:
    """`measure(engine, model)` for each model in turn, all their rows then written to `out` (if given); the exit
    status: 0, or 2 with the reason on stderr after `tool`'s name where a model does not load."""
    from infill_engine.loading import ModelLoadError

    rows: list[Any] = []
    for model in models:
        try:
            engine = measured_engine(model)
        except ModelLoadError as error:
            print(f"{tool}: {error}", file=sys.stderr)
            return 2
        rows.extend(measure(engine, model))
    if out is not None:
        write_rows(out, rows)
    return 0
