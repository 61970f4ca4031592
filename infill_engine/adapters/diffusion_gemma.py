"""DiffusionGemma through transformers' native `DiffusionGemmaForBlockDiffusion`.

DiffusionGemma is a block-diffusion model: a causal encoder writes the KV cache of everything before the canvas,
and a bidirectional decoder (the same weights) denoises a canvas of uniformly random tokens, fed back its own
previous logits (self-conditioning). It has no fill-in-the-middle mode, so diffill gives it one:

    encoder: prefix (causal, cached once)      decoder canvas: [ span: N free positions | suffix: S pinned tokens ]

The suffix tokens sit inside the canvas, right after the span, and are never re-noised: the decoder attends
bidirectionally over the canvas, so every span position sees the suffix while it is written, and the model's own
block-diffusion training (a canvas continuing the cached text) needs no new ability. The sampler only ever sees the
span positions; their self-conditioning input is the previous step's processed logits, as in `generate()`, while
the pinned suffix positions are fed their own previous raw logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from infill_engine.adapters.base import Denoiser, EncodedContext


@dataclass
class _GemmaState:
    cache: object  # transformers Cache written by the encoder
    suffix: torch.Tensor  # (B, S) pinned suffix tokens
    positions: torch.Tensor  # (1, N + S) decoder positions
    suffix_logits: torch.Tensor | None = None  # (B, S, V) the suffix's logits from the previous step


class DiffusionGemmaDenoiser(Denoiser):
    """DiffusionGemma with a prefix KV cache and the suffix pinned inside the canvas."""

    family = "diffusion_gemma"
    noise = "uniform"
    block_mode = "append"
    uses_self_conditioning = True

    def encode(self, prefix_ids: list[int], suffix_ids: list[int], span_length: int, batch_size: int) -> EncodedContext:
        """Run the causal encoder over the prefix once; the cache is shared by every candidate."""
        empty = torch.zeros((batch_size, 0), dtype=torch.long, device=self.device)
        return self.encode_rows(prefix_ids, empty, suffix_ids, span_length)

    def encode_rows(
        self, prefix_ids: list[int], continuation: torch.Tensor, suffix_ids: list[int], span_length: int
    ) -> EncodedContext:
        """Encode the prefix plus each row's finished blocks (B, k) into a KV cache of batch B."""
        from transformers import DynamicCache

        device = self.device
        batch = continuation.shape[0]
        lead = list(prefix_ids) or [i for i in (self.special.bos_id, self.special.pad_id) if i is not None][:1]
        if not lead:
            raise ValueError(f"{self.path}: DiffusionGemma needs at least one token before the canvas")
        prefix = torch.tensor([lead], dtype=torch.long, device=device).expand(batch, -1)
        input_ids = torch.cat([prefix, continuation.to(device)], dim=1)  # (B, P)
        length = input_ids.shape[1]
        cache = DynamicCache(config=self.model.config.get_text_config(decoder=True))
        positions = torch.arange(length, dtype=torch.int32, device=device)[None]
        attention = torch.ones((batch, length), dtype=torch.bool, device=device)
        masks = self.model.model.encoder.create_masks_for_generate(
            config=self.model.config,
            inputs_embeds=torch.empty((batch, length, 0), dtype=self.dtype, device=device),
            attention_mask=attention,
            cache=cache,
            position_ids=positions,
        )
        cache = self.model.model.encoder(
            input_ids=input_ids, attention_mask=masks, cache=cache, position_ids=positions
        ).cache
        suffix = torch.tensor([list(suffix_ids)], dtype=torch.long, device=device).expand(batch, -1)
        canvas_positions = torch.arange(
            length, length + span_length + len(suffix_ids), dtype=torch.int32, device=device
        )[None]
        state = _GemmaState(cache, suffix, canvas_positions)
        return EncodedContext(list(prefix_ids), list(suffix_ids), span_length, batch, state)

    def predict(
        self, context: EncodedContext, canvas: torch.Tensor, self_conditioning: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Decoder pass over [span | pinned suffix]; logits of the span positions (B, N, V)."""
        state: _GemmaState = context.state
        batch, length = canvas.shape
        suffix = state.suffix[:batch]
        decoder_ids = torch.cat([canvas, suffix], dim=1)  # (B, N + S)
        conditioning = None
        embed_dtype = self.model.model.decoder.embed_tokens.weight.dtype
        if self_conditioning is not None:
            parts = [self_conditioning.to(embed_dtype)]
            if suffix.shape[1]:
                parts.append(state.suffix_logits.to(embed_dtype))
            conditioning = torch.cat(parts, dim=1)  # (B, N + S, V)
        logits = self.model(
            decoder_input_ids=decoder_ids,
            self_conditioning_logits=conditioning,
            cache=state.cache,
            decoder_position_ids=state.positions,
        ).logits  # (B, N + S, V)
        state.suffix_logits = logits[:, length:]
        return logits[:, :length]
