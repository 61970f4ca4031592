"""Counters and timings recorded for every fill."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class FillStats:
    """What one fill cost: forward passes, tokens written and milliseconds per stage."""

    forward_passes: int = 0  # denoiser forward passes (one per step, all candidates batched together)
    context_encodes: int = 0  # context encodings (once per request and block where the model caches context)
    tokens_generated: int = 0  # span tokens kept in the best candidate (before its end-of-span)
    canvas_positions: int = 0  # positions per canvas row
    positions_predicted: int = 0  # canvas positions whose logits a pass computed, all passes and rows together
    candidates: int = 0  # canvases denoised in one batch
    repairs: int = 0  # re-noise-and-denoise rounds spent on candidates the syntax gate rejected
    stopped_early: bool = False  # the loop ended because the canvas was stable and confident
    over_budget: bool = False  # the time budget ran out: the loop took its argmax early, or repairs were skipped
    ms: dict[str, float] = field(default_factory=dict)  # stage -> milliseconds

    @property
    def tokens_per_forward(self) -> float:
        """Span tokens of the best candidate per denoiser forward pass."""
        return self.tokens_generated / self.forward_passes if self.forward_passes else 0.0

    @property
    def canvas_positions_per_forward(self) -> float:
        """Canvas positions of one row (end-of-span ones too) per denoiser forward pass: LLaDA's accounting
        (`gen_length / steps`), where generating `gen_length` positions one per step is 1."""
        return self.canvas_positions / self.forward_passes if self.forward_passes else 0.0

    @contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        """Add the wall time of the block to `ms[stage]`."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.ms[stage] = self.ms.get(stage, 0.0) + (time.perf_counter() - start) * 1000.0

    def as_dict(self) -> dict[str, object]:
        """A JSON-ready summary."""
        return {
            "forward_passes": self.forward_passes,
            "context_encodes": self.context_encodes,
            "tokens_generated": self.tokens_generated,
            "tokens_per_forward": round(self.tokens_per_forward, 3),
            "canvas_positions_per_forward": round(self.canvas_positions_per_forward, 3),
            "canvas_positions": self.canvas_positions,
            "positions_predicted": self.positions_predicted,
            "candidates": self.candidates,
            "repairs": self.repairs,
            "stopped_early": self.stopped_early,
            "over_budget": self.over_budget,
            "ms": {k: round(v, 2) for k, v in self.ms.items()},
        }
