"""Export a training checkpoint as the shipped embedded model: weights in bfloat16, tokenizer, nothing else.

    python -m infill_engine.training.export runs/NAME/checkpoints/step-N [infill_engine/model]

The destination is written beside itself and renamed into place, so a failed export never leaves half a model.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from infill_engine.loading import PACKAGED_MODEL


def export_checkpoint(checkpoint: str | Path, destination: str | Path = PACKAGED_MODEL) -> Path:
    """Write `checkpoint`'s model (bfloat16 safetensors, shards of at most 16 MB) and tokenizer to `destination`."""
    import torch
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    import infill_engine.diffill_model  # noqa: F401  (registers the model class)

    destination = Path(destination)
    model = AutoModelForMaskedLM.from_pretrained(checkpoint, dtype=torch.bfloat16)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    staging = Path(tempfile.mkdtemp(prefix=f".{destination.name}.", dir=destination.parent))
    try:
        model.save_pretrained(staging, max_shard_size="16MB")
        tokenizer.save_pretrained(staging)
        if destination.exists():
            shutil.rmtree(destination)
        staging.rename(destination)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return destination


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: python -m infill_engine.training.export CHECKPOINT [DESTINATION]")
    print(export_checkpoint(*sys.argv[1:]))
