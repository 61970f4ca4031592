"""The autoregressive twin's objective: fill-in-the-middle in prefix-suffix-middle order, next-token loss everywhere.

    document -> (prefix, middle, suffix) text: the diffusion objective's `sample_hole` (same hole kinds and sizes)
             -> trim_context, with budgets drawn as the diffusion objective draws them
             -> <|fim_prefix|> prefix <|fim_suffix|> suffix <|fim_middle|> middle <|endofspan|>   (`fim_prompt`)

The sequence is read causally (the model is a `DiffillForInfilling` with `shift_logits`, `causal_context` and
`autoregressive` set, and no canvas), and every position from the second on is a next-token target, as in
StarCoder's and Bavarian et al.'s FIM training: the twin learns from every token it reads. The sentinels are added
to the twin's copy of the tokenizer (`add_fim_tokens`), their embedding rows starting at the mean row
(`make_autoregressive`); the rest of the vocabulary is the diffusion model's.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import Any

import torch

from infill_engine.canvas import ContextConfig, trim_context
from infill_engine.diffill_model.modeling_diffill import IGNORE_INDEX
from infill_engine.fim_generation import FIM_SENTINELS, FimTokens, fim_prompt, fim_tokens
from infill_engine.special_tokens import FIM_TOKENS
from infill_engine.training.objective import Hole, ObjectiveConfig, draw_context_budgets, sample_hole

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FimExample:
    """One training sequence in prefix-suffix-middle order, with next-token labels."""

    input_ids: list[int]  # (T,)
    labels: list[int]  # (T,) the token at each position (read from the output before it); IGNORE_INDEX at 0
    middle_start: int  # position of the middle's first token (just after <|fim_middle|>)
    middle_length: int  # middle tokens, before <|endofspan|>
    context: ContextConfig  # the budgets trim_context was called with
    hole: Hole


def add_fim_tokens(tokenizer: Any) -> Any:
    """The tokenizer with the FIM sentinels appended as special tokens (unchanged when it has them)."""
    missing = [token for token in FIM_TOKENS if token not in tokenizer.get_vocab()]
    if missing:
        tokenizer.add_special_tokens({"additional_special_tokens": missing}, replace_extra_special_tokens=False)
    return tokenizer


def make_autoregressive(model: Any, tokenizer: Any) -> None:
    """Turn a `DiffillForInfilling` into the twin: causal and shifted, with embedding rows for every token.

    New rows (the sentinels) start at the mean of the existing ones, as `causal_conversion` does for new tokens.
    """
    old_rows = model.get_input_embeddings().weight.shape[0]
    if old_rows < len(tokenizer):
        model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
        with torch.no_grad():
            weight = model.get_input_embeddings().weight  # (V, E), tied with the output layer
            weight[old_rows:] = weight[:old_rows].mean(dim=0)
        logger.info("the twin's vocabulary grew from %d to %d tokens (FIM sentinels)", old_rows, len(tokenizer))
    model.config.shift_logits = model.config.causal_context = model.config.autoregressive = True


def build_fim_example(
    tokenizer: Any, hole: Hole, rng: random.Random, tokens: FimTokens, config: ObjectiveConfig
) -> FimExample:
    """Lay a hole out in prefix-suffix-middle order with the serving trimmer; label every next token."""
    middle_ids = tokenizer(hole.middle, add_special_tokens=False)["input_ids"][: config.max_span_tokens]
    room = max(0, config.seq_len - len(middle_ids) - 1 - FIM_SENTINELS)  # the middle and its end token
    context = draw_context_budgets(room, rng, config)
    trimmed = trim_context(tokenizer, hole.prefix, hole.suffix, context)
    prompt = fim_prompt(trimmed.prefix_ids, trimmed.suffix_ids, tokens)
    input_ids = prompt + list(middle_ids) + [tokens.end_id]
    return FimExample(
        input_ids=input_ids,
        labels=[IGNORE_INDEX] + input_ids[1:],
        middle_start=len(prompt),
        middle_length=len(middle_ids),
        context=context,
        hole=hole,
    )


def make_fim_example(
    tokenizer: Any, document: str, rng: random.Random, tokens: FimTokens, config: ObjectiveConfig
) -> FimExample:
    """A training example from one document: cut a hole as the diffusion objective does, lay it out PSM."""
    return build_fim_example(tokenizer, sample_hole(document, rng, tokenizer, config), rng, tokens, config)


def collate_fim(examples: list[FimExample], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded tensors for the twin's `forward`: every position is context (canvas_mask all False)."""
    length = max(len(e.input_ids) for e in examples)
    batch = len(examples)
    input_ids = torch.full((batch, length), pad_id, dtype=torch.long)  # (B, T)
    labels = torch.full((batch, length), IGNORE_INDEX, dtype=torch.long)  # (B, T)
    attention_mask = torch.zeros((batch, length), dtype=torch.bool)  # (B, T)
    for row, example in enumerate(examples):
        n = len(example.input_ids)
        input_ids[row, :n] = torch.tensor(example.input_ids)
        labels[row, :n] = torch.tensor(example.labels)
        attention_mask[row, :n] = True
    return {
        "input_ids": input_ids,
        "position_ids": torch.arange(length).expand(batch, length).clone(),  # (B, T)
        "canvas_mask": torch.zeros((batch, length), dtype=torch.bool),  # (B, T) no canvas: causal everywhere
        "attention_mask": attention_mask,
        "labels": labels,
    }


__all__ = ["FimExample", "add_fim_tokens", "build_fim_example", "collate_fim", "fim_tokens", "make_autoregressive",
           "make_fim_example"]
