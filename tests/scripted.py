"""A denoiser whose predictions are written in advance, to test the loop and the engine exactly."""

from __future__ import annotations

import torch

from infill_engine.adapters.base import Denoiser, EncodedContext
from infill_engine.special_tokens import resolve_special_tokens


class _Weights(torch.nn.Module):
    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.out = torch.nn.Linear(1, vocab, bias=False)

    def get_output_embeddings(self) -> torch.nn.Linear:
        return self.out


class ScriptedDenoiser(Denoiser):
    """Predicts, for row b and span position i, the i-th token of `scripts[b]` followed by end-of-span tokens.

    `confidence[i]` sets how peaked position i is (a logit margin); `later_scripts` replaces the scripts after the
    first request (to model a repair that finds a better answer).
    """

    family = "scripted"
    noise = "mask"
    block_mode = "restrict"

    def __init__(self, tokenizer, scripts: list[str], margin: float = 12.0, confidence: list[float] | None = None,
                 later_scripts: list[str] | None = None) -> None:
        config = type("Config", (), {"max_position_embeddings": 4096})()
        super().__init__(_Weights(len(tokenizer)), tokenizer, resolve_special_tokens(tokenizer, config), "scripted")
        self.model.config = config
        self.scripts, self.later_scripts = scripts, later_scripts
        self.margin, self.confidence = margin, confidence
        self.encodes = 0
        self.calls = 0
        self.seen_canvases: list[torch.Tensor] = []

    def encode(self, prefix_ids, suffix_ids, span_length, batch_size) -> EncodedContext:
        self.encodes += 1
        scripts = self.scripts if self.encodes == 1 or self.later_scripts is None else self.later_scripts
        end = self.special.end_of_span_ids[0]
        rows = []
        for text in scripts:
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"][:span_length]
            rows.append(ids + [end] * (span_length - len(ids)))
        return EncodedContext(prefix_ids, suffix_ids, span_length, batch_size, torch.tensor(rows))

    def predict(self, context, canvas, self_conditioning=None) -> torch.Tensor:
        self.calls += 1
        self.seen_canvases.append(canvas.clone())
        targets = context.state[: canvas.shape[0]]
        if targets.shape[0] < canvas.shape[0]:
            targets = targets[:1].expand(canvas.shape[0], -1)
        logits = torch.zeros(canvas.shape[0], canvas.shape[1], self.vocab_size)
        margins = torch.full((canvas.shape[1],), self.margin)
        if self.confidence is not None:
            margins = torch.tensor(self.confidence[: canvas.shape[1]], dtype=torch.float32)
        logits.scatter_(-1, targets[..., None], margins[None, :, None].expand(canvas.shape[0], -1, 1))
        return logits
