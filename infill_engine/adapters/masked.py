"""Masked-diffusion LMs (LLaDA, Dream, DiffuCoder, Open-dCoder, CoDA) and encoder MLMs (BERT, RoBERTa, ModernBERT).

These models see the whole sequence bidirectionally, so the context is run again with the canvas at every step:
`prefix | span of mask tokens | suffix`, unless a dual cache (`infill_engine.dual_cache`, Fast-dLLM's approximation)
keeps the prefix's and suffix's keys and values between refreshes. Dream-style models are adapted from autoregressive
LMs and read the prediction for position i from output i-1 (`shift_logits`); LLaDA and encoder MLMs read it at
position i.
"""

from __future__ import annotations

from typing import Any

import torch

from infill_engine.adapters.base import Denoiser, EncodedContext
from infill_engine.dual_cache import DualCache, DualCacheState
from infill_engine.special_tokens import SpecialTokens


class MaskedDenoiser(Denoiser):
    """A bidirectional masked-diffusion model run over the full canvas each step."""

    noise = "mask"
    block_mode = "restrict"

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        special: SpecialTokens,
        path: str,
        family: str,
        shift_logits: bool,
        wrap_with_cls_sep: bool = False,
        refresh_every: int = 0,
    ) -> None:
        super().__init__(model, tokenizer, special, path)
        if special.mask_id is None:
            raise ValueError(
                f"{path}: a masked-diffusion model needs a mask token, and neither its tokenizer nor its config "
                "names one (looked for tokenizer.mask_token and config.mask_token_id)"
            )
        self.family = family
        self.shift_logits = shift_logits
        self.wrap_with_cls_sep = wrap_with_cls_sep
        # refresh_every >= 1: the prefix and suffix keys and values are computed again every that many steps
        self.dual_cache = DualCache(model, refresh_every, shift_logits, path) if refresh_every else None

    def _lead_ids(self) -> list[int]:
        """Tokens placed before the prefix: [CLS] for encoder MLMs, a start token for shifted models."""
        if self.wrap_with_cls_sep and self.special.cls_id is not None:
            return [self.special.cls_id]
        return []

    def encode(self, prefix_ids: list[int], suffix_ids: list[int], span_length: int, batch_size: int) -> EncodedContext:
        """Keep the context ids on the device; a shifted model needs at least one token before the span."""
        lead = self._lead_ids() + list(prefix_ids)
        if self.shift_logits and not lead:
            start = next(
                (i for i in (self.special.bos_id, self.special.pad_id, *self.special.end_of_span_ids) if i is not None),
                None,
            )
            if start is None:
                raise ValueError(f"{self.path}: a shifted-logit model needs a start token before an empty prefix")
            lead = [start]
        trail = list(suffix_ids)
        if self.wrap_with_cls_sep and self.special.sep_id is not None:
            trail = trail + [self.special.sep_id]
        device = self.device
        state = (
            torch.tensor([lead], dtype=torch.long, device=device),  # (1, P)
            torch.tensor([trail], dtype=torch.long, device=device),  # (1, S)
            DualCacheState(),
        )
        return EncodedContext(list(prefix_ids), list(suffix_ids), span_length, batch_size, state)

    def predict(
        self, context: EncodedContext, canvas: torch.Tensor, self_conditioning: torch.Tensor | None = None
    ) -> torch.Tensor:
        """One full forward over prefix, canvas and suffix (or the canvas against the dual cache); logits of the span
        positions (B, N, V)."""
        lead, trail, cached = context.state
        if self.dual_cache is not None:
            return self.dual_cache.predict(cached, lead, canvas, trail).float()
        batch, length = canvas.shape
        ids = torch.cat([lead.expand(batch, -1), canvas, trail.expand(batch, -1)], dim=1)  # (B, T)
        logits = self.model(input_ids=ids).logits  # (B, T, V)
        start = lead.shape[1] - 1 if self.shift_logits else lead.shape[1]
        return logits[:, start : start + length].float()
