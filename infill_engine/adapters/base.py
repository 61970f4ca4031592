"""The one small interface every model family implements for the denoising loop.

A denoiser is asked two things: encode a request's context once (`encode`), then, for each denoising step, predict
logits for every span position of a batch of canvases (`predict`). How the context is kept between steps (a KV
cache, or plain token ids that are run again) is the adapter's business.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import torch

from infill_engine.special_tokens import SpecialTokens

Noise = Literal["mask", "uniform"]
BlockMode = Literal["restrict", "append"]


@dataclass
class EncodedContext:
    """What a denoiser keeps between steps of one request; `state` is adapter-specific."""

    prefix_ids: list[int]
    suffix_ids: list[int]
    span_length: int
    batch_size: int
    state: Any = None


class ContextArgs(NamedTuple):
    """The arguments of one `Denoiser.encode` call."""

    prefix_ids: list[int]
    suffix_ids: list[int]
    span_length: int
    batch_size: int


class MergedRows(NamedTuple):
    """One request's part of a merged batch: its encoded context and the shape of its canvas."""

    context: EncodedContext
    rows: int  # canvases (candidates) of this request
    length: int  # canvas positions N of this request


class Denoiser(ABC):
    """A diffusion model behind the interface the sampler needs."""

    family: str  # "diffill", "diffusion_gemma", "llada", "dream" or "mlm"
    noise: Noise  # "mask": noisy positions hold the mask token; "uniform": they hold random tokens
    block_mode: BlockMode  # "restrict": the whole span is on the canvas, blocks order the commits;
    #                        "append": each block is its own canvas, committed blocks join the context
    uses_self_conditioning: bool = False  # the model takes the previous step's logits as an input
    batches_contexts: bool = False  # canvases of different contexts share one forward pass (`merge_contexts`)
    projects_columns: bool = False  # `predict(..., columns=)` computes the logits of those canvas positions only
    reuses_context: bool = False  # an encoded context is not changed by the steps run against it, so another fill
    #                               of the same context (the request's repairs) may run against it again
    reuses_canvas_keys: bool = False  # `predict(..., columns=, rows=)` runs the layers over the canvas positions
    #                                   `rows` only (and those the columns' logits need); every other position keeps
    #                                   the keys and values of its last pass against this context (SamplerConfig.
    #                                   canvas_refresh)

    def __init__(self, model: Any, tokenizer: Any, special: SpecialTokens, path: str) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.special = special
        self.path = path

    @functools.cached_property
    def token_texts(self) -> list[str]:
        """The text of every token id, decoded alone, read from the tokenizer once."""
        return self.tokenizer.batch_decode([[i] for i in range(len(self.tokenizer))])

    @functools.cached_property
    def line_break_ids(self) -> torch.Tensor:
        """(K,) ids of the tokens whose text holds a line break."""
        return torch.tensor([i for i, text in enumerate(self.token_texts) if "\n" in text], dtype=torch.long)

    @functools.cached_property
    def is_line_break(self) -> torch.Tensor:
        """(V,) True at `line_break_ids`, on the model's device: `is_line_break[tokens]` looks each token up (a tenth
        of `torch.isin`'s time over a canvas)."""
        ids = self.line_break_ids
        table = torch.zeros(max(self.vocab_size, int(ids.max()) + 1 if ids.numel() else 0), dtype=torch.bool)
        table[ids] = True
        return table.to(self.device)

    @functools.cached_property
    def blank_ids(self) -> torch.Tensor:
        """(K,) ids of the tokens whose text is only whitespace (indentation, line breaks), special ones left out."""
        special = {*self.special.end_of_span_ids, *self.special.ids_never_generated}
        return torch.tensor([i for i, text in enumerate(self.token_texts)
                             if text and not text.strip() and i not in special], dtype=torch.long)

    @property
    def device(self) -> torch.device:
        """Where the model's weights live."""
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the model's weights."""
        return next(self.model.parameters()).dtype

    @property
    def precision(self) -> str:
        """What the model runs in, as `--dtype` names it: "float32", "bfloat16", ..., or "mixed" (`mixed_precision`)."""
        from infill_engine.mixed_precision import is_mixed

        return "mixed" if is_mixed(self.model) else str(self.dtype).removeprefix("torch.")

    @property
    def sampler_settings(self) -> dict[str, Any]:
        """The sampler settings the checkpoint recommends for itself: its config.json's `diffill_sampler` object
        (`SamplerConfig` fields, e.g. the embedded model's `end_bias`), empty when it has none."""
        from infill_engine.sampler_config import checked_sampler_settings

        settings = getattr(self.model.config, "diffill_sampler", None) or {}
        return checked_sampler_settings(settings, f"{self.path}: config.json's diffill_sampler")

    @property
    def vocab_size(self) -> int:
        """Size of the output distribution (may exceed the tokenizer's length)."""
        return int(self.model.get_output_embeddings().weight.shape[0])

    @property
    def max_positions(self) -> int:
        """The longest sequence the model's positions allow."""
        config = self.model.config
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        return int(getattr(text_config, "max_position_embeddings", 2048) or 2048)

    @abstractmethod
    def encode(self, prefix_ids: list[int], suffix_ids: list[int], span_length: int, batch_size: int) -> EncodedContext:
        """Prepare the context of one request (run once; cached where the architecture allows)."""

    @abstractmethod
    def predict(
        self, context: EncodedContext, canvas: torch.Tensor, self_conditioning: torch.Tensor | None = None,
        columns: torch.Tensor | None = None, rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits (B, N, V) for every span position of `canvas` (B, N); where `projects_columns`, with `columns` (n,)
        the logits (B, n, V) of those positions only (the model still reads the whole canvas); where
        `reuses_canvas_keys`, with `rows` (r,) as well, the layers run over those positions only (and the ones the
        columns' logits come from), the others read as their last pass left them. Families that do not project
        columns or reuse canvas keys are never given any."""

    def encode_many(self, requests: list[ContextArgs]) -> list[EncodedContext]:
        """Encode several requests' contexts; families that batch contexts do it in one padded forward pass."""
        return [self.encode(*args) for args in requests]

    def merge_contexts(self, parts: list[MergedRows]) -> EncodedContext:
        """One context for the canvases of several requests stacked in order, each right-padded to the longest
        canvas: `predict(merged, canvas)` with canvas (sum of rows, longest length) gives each request's logits in
        its rows and first `length` columns. Only where `batches_contexts` is True."""
        raise NotImplementedError(f"{self.family} cannot put canvases of different contexts in one batch")

    def encode_rows(
        self, prefix_ids: list[int], continuation: torch.Tensor, suffix_ids: list[int], span_length: int
    ) -> EncodedContext:
        """Append-mode models: the context is the prefix plus each row's finished blocks `continuation` (B, k)."""
        raise NotImplementedError(f"{self.family} denoises the whole span on one canvas")
