"""Export a training checkpoint as the shipped embedded model: weights in bfloat16, tokenizer, nothing else.

    python -m infill_engine.training.export runs/NAME/checkpoints/step-N [infill_engine/model] [--delta BASE]

With `--delta BASE` (what the run's --init-from named, e.g. smollm2) only what training changed is written, and the
model loads by converting BASE again (see infill_engine/diffill_model/delta.py).

The destination is written beside itself and renamed into place, so a failed export never leaves half a model.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from infill_engine.loading import PACKAGED_MODEL


def export_checkpoint(
    checkpoint: str | Path, destination: str | Path = PACKAGED_MODEL, delta_base: str | None = None
) -> Path:
    """Write `checkpoint`'s model (bfloat16 safetensors, shards of at most 16 MB) and tokenizer to `destination`."""
    import torch
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    import infill_engine.diffill_model  # noqa: F401  (registers the model class)

    destination = Path(destination)
    if destination.exists() and not destination.is_dir():
        raise ValueError(f"{destination} is a file, not a model directory: give a directory to write the model into")
    # a delta compares the trained weights with the start's exactly, so it reads them at full precision
    model = AutoModelForMaskedLM.from_pretrained(checkpoint, dtype=torch.float32 if delta_base else torch.bfloat16)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)

    def write(staging: Path) -> None:
        if delta_base is not None:
            from infill_engine.diffill_model.causal_conversion import diffill_from_causal_lm
            from infill_engine.diffill_model.delta import write_delta_model

            start, _ = diffill_from_causal_lm(delta_base)
            write_delta_model(model, tokenizer, start, delta_base, staging)
        else:
            model.save_pretrained(staging, max_shard_size="16MB")
            tokenizer.save_pretrained(staging)

    return write_model_directory(destination, write)


def write_model_directory(destination: Path, write: Callable[[Path], None]) -> Path:
    """`destination` (replaced if it exists) holding what `write` puts into an empty directory: written beside it and
    renamed into place, readable by everyone, so that a failure never leaves half a model."""
    destination.parent.mkdir(parents=True, exist_ok=True)  # a new folder, e.g. runs/eval/step-N/model
    staging = Path(tempfile.mkdtemp(prefix=f".{destination.name}.", dir=destination.parent))
    try:
        write(staging)
        staging.chmod(0o755)  # mkdtemp makes it private; a model directory is readable by everyone
        for written in staging.iterdir():
            written.chmod(0o644)
        if destination.exists():
            shutil.rmtree(destination)
        staging.rename(destination)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return destination


def main(argv: list[str] | None = None) -> int:
    """The command line: export a checkpoint; 2 with a one-line message for a checkpoint that is not there."""
    parser = argparse.ArgumentParser(prog="python -m infill_engine.training.export",
                                     description="export a training checkpoint as the embedded model (bfloat16)")
    parser.add_argument("checkpoint", type=Path, help="a checkpoint directory, e.g. runs/NAME/checkpoints/step-N")
    parser.add_argument("destination", type=Path, nargs="?", default=PACKAGED_MODEL,
                        help="where the model goes (default: the embedded model's directory)")
    parser.add_argument("--delta", metavar="BASE", help="write only what training changed from BASE (its --init-from)")
    args = parser.parse_args(argv)
    if not (args.checkpoint / "config.json").is_file():
        parser.exit(2, f"{parser.prog}: {args.checkpoint} is not a checkpoint directory (no config.json)\n")
    try:
        print(export_checkpoint(args.checkpoint, args.destination, delta_base=args.delta))
    except ValueError as error:  # a destination that is a file: refused before anything is read or written
        parser.exit(2, f"{parser.prog}: {error}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
