"""An exponential moving average of a model's weights while it trains (`diffill train --ema DECAY`).

While the learning rate is still high, each step's weights scatter around the low ground of the loss; their average
over the last few hundred steps sits nearer it. Measured on grow-18b at a learning rate of 4e-5 (docs/MODEL.md,
"Averaged weights"): the mean of its last 7 checkpoints, 100 steps apart, had 0.030 nats less held-out loss than the
last of them, as much as tens of millions of training tokens bought before. The average is a second copy of the model
in float32; each checkpoint holds it as a complete model directory, `average/`, which every tool that takes a model
reads as it is (`diffill fill --model`, `scripts/evaluate-model`, `python -m infill_engine.training.export`).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

AVERAGE_DIRECTORY = "average"  # inside a checkpoint: the averaged weights, config and tokenizer


class WeightAverage:
    """The moving average of a model's parameters: after each step, average <- decay * average + (1 - decay) * w."""

    def __init__(self, model: torch.nn.Module, decay: float, start: torch.nn.Module | None = None) -> None:
        """Average `model` from here on with `decay`, starting from `start` (a saved average) or its own weights."""
        if not 0.0 < decay < 1.0:
            raise ValueError(f"the weight average's decay must lie between 0 and 1 (for example 0.998), not {decay}")
        self.decay = decay
        self.model = copy.deepcopy(model) if start is None else start
        self.model.requires_grad_(False).eval()
        trained, averaged = dict(model.named_parameters()), dict(self.model.named_parameters())
        if trained.keys() != averaged.keys() or any(trained[k].shape != averaged[k].shape for k in trained):
            raise ValueError("the saved weight average does not have the model's parameters; it belongs to another "
                             "architecture")
        self.model.to(next(model.parameters()).device, torch.float32)

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        """Move the average towards `model`'s current weights by (1 - decay)."""
        averaged = list(self.model.parameters())
        trained = [p.detach().to(a.dtype) for a, p in zip(averaged, model.parameters())]
        torch._foreach_lerp_(averaged, trained, 1.0 - self.decay)

    def save(self, checkpoint: Path, tokenizer: Any, max_shard_size: str) -> None:
        """Write the average into `checkpoint` as a model directory of its own (`average/`)."""
        directory = Path(checkpoint) / AVERAGE_DIRECTORY
        self.model.save_pretrained(directory, max_shard_size=max_shard_size)
        tokenizer.save_pretrained(directory)


def load_average(model: torch.nn.Module, checkpoint: Path | None, decay: float) -> tuple[WeightAverage, bool]:
    """The weight average to go on with: the one `checkpoint` holds, else a new one from `model`'s weights; and
    whether it was resumed."""
    saved = None if checkpoint is None else Path(checkpoint) / AVERAGE_DIRECTORY
    if saved is None or not (saved / "config.json").is_file():
        return WeightAverage(model, decay), False
    return WeightAverage(model, decay, start=type(model).from_pretrained(saved, dtype=torch.float32)), True
