"""The embedded default model: the context is encoded once per request, each step computes only the canvas."""

from __future__ import annotations

import torch

from infill_engine.adapters.base import Denoiser, EncodedContext


class DiffillDenoiser(Denoiser):
    """Our own `DiffillForInfilling`: an exact context KV cache (the context never attends to the canvas)."""

    family = "diffill"
    noise = "mask"
    block_mode = "restrict"

    def encode(self, prefix_ids: list[int], suffix_ids: list[int], span_length: int, batch_size: int) -> EncodedContext:
        """Encode prefix and suffix once; positions leave room for the span between them."""
        device = self.device
        prefix_length = len(prefix_ids)
        context_ids = torch.tensor([list(prefix_ids) + list(suffix_ids)], dtype=torch.long, device=device)  # (1, C)
        positions = torch.cat(
            [
                torch.arange(prefix_length, device=device),
                torch.arange(len(suffix_ids), device=device) + prefix_length + span_length,
            ]
        )[None]  # (1, C)
        cache = self.model.encode_context(context_ids, positions)
        canvas_positions = torch.arange(prefix_length, prefix_length + span_length, device=device)[None]  # (1, N)
        return EncodedContext(list(prefix_ids), list(suffix_ids), span_length, batch_size, (cache, canvas_positions))

    def predict(
        self, context: EncodedContext, canvas: torch.Tensor, self_conditioning: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Logits (B, N, V) of the canvas against the cached context."""
        cache, positions = context.state
        return self.model.denoise(canvas, positions.expand(canvas.shape[0], -1), cache).float()
