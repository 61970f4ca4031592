"""A deeper diffill model that starts out computing exactly what a shallower one does, to train on from there.

    python -m infill_engine.training.depth_growth MODEL OUT --depth 12

Blocks are followed by copies of themselves whose two output projections (attention's `o_proj`, the MLP's
`down_proj`) are zero, as LLaMA Pro expands a model's blocks, the copies spread evenly over the depth (12 blocks grown
to 18 copy every second block, to 24 every block): a copy adds nothing to the residual stream, so
the deeper model's logits are the shallower one's, and training (`diffill train --init-from OUT`) grows the copies
from there instead of from a new model's random start. The zero projections take gradients at once (their inputs
are the copies' non-zero attention and MLP activations); the rest of a copy follows as soon as they move.

OUT is written beside itself and renamed into place (float32 weights and the model's tokenizer), so a failure never
leaves half a model.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch

from infill_engine.diffill_model import DiffillForInfilling
from infill_engine.training.export import write_model_directory


def copies_after_each_block(blocks: int, depth: int) -> list[int]:
    """How many zero-output copies follow each of `blocks` blocks to make `depth`: spread evenly, later blocks first
    (12 to 18: one after every second block, starting with the second). ValueError unless blocks < depth."""
    if depth <= blocks:
        raise ValueError(f"--depth must be more than the model's {blocks} blocks (got {depth})")
    added = depth - blocks
    return [(index + 1) * added // blocks - index * added // blocks for index in range(blocks)]


def grow_depth(model: DiffillForInfilling, depth: int) -> DiffillForInfilling:
    """A copy of `model` with `depth` blocks: blocks followed by copies of themselves whose output projections are
    zero (`copies_after_each_block`), so that the logits are `model`'s own. ValueError unless `depth` is deeper."""
    copies = copies_after_each_block(len(model.layers), depth)
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = depth
    deeper = DiffillForInfilling(config).to(model.dtype)
    layers = []
    for block, count in zip(model.layers, copies):
        layers.append(copy.deepcopy(block))
        for _ in range(count):
            quiet = copy.deepcopy(block)
            with torch.no_grad():
                quiet.attn.o_proj.weight.zero_()
                quiet.mlp.down_proj.weight.zero_()
            layers.append(quiet)
    deeper.load_state_dict({**model.state_dict(), **{
        f"layers.{index}.{name}": value for index, block in enumerate(layers)
        for name, value in block.state_dict().items()}})
    return deeper


def grow_model_directory(source: str | Path, destination: str | Path, depth: int) -> Path:
    """Write the model at `source` grown to `depth` blocks (`grow_depth`), with its tokenizer, to `destination`."""
    from transformers import AutoTokenizer

    model = DiffillForInfilling.from_pretrained(source, dtype=torch.float32)
    deeper = grow_depth(model, depth)  # refused before anything is written
    tokenizer = AutoTokenizer.from_pretrained(source)

    def write(staging: Path) -> None:
        deeper.save_pretrained(staging)
        tokenizer.save_pretrained(staging)

    return write_model_directory(Path(destination), write)


def main(argv: list[str] | None = None) -> int:
    """The command line: grow a diffill model's depth; 2 with a one-line message for what cannot be grown."""
    parser = argparse.ArgumentParser(prog="python -m infill_engine.training.depth_growth",
                                     description="a deeper diffill model with the same logits, to train on from there")
    parser.add_argument("model", type=Path, help="a diffill model or training checkpoint directory")
    parser.add_argument("out", type=Path, help="where the deeper model goes (replaced if it exists)")
    parser.add_argument("--depth", type=int, required=True,
                        help="blocks of the deeper model, more than its own, e.g. 18 for 12 (a copy after every second block)")
    args = parser.parse_args(argv)
    if not (args.model / "config.json").is_file():
        parser.exit(2, f"{parser.prog}: {args.model} is not a model directory (no config.json)\n")
    try:
        print(grow_model_directory(args.model, args.out, args.depth))
    except ValueError as error:
        parser.exit(2, f"{parser.prog}: {error}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
