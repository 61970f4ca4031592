"""What the context says comes next: a position is committed when the model's argmax there is the token that followed
the same few tokens somewhere in the prefix or the suffix.

Prompt lookup (as speculative decoding does without a draft model) turned into a commit rule for a bidirectional
model: the context proposes, the model's own prediction of the position verifies. Code repeats itself (names,
calls, the arguments of the line above), so two predictors agreeing is stronger evidence than the model's
probability alone. It commits, after the step's own rule, every open position whose argmax agrees with the copy
and has at least `copy_floor` probability, left to right, so that a run of copied tokens goes in one pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def context_grams(ids: list[int], length: int) -> frozenset[tuple[int, ...]]:
    """Every run of `length` tokens in `ids` (a set built in C: a fraction of a millisecond for thousands)."""
    return frozenset(zip(*(ids[start:] for start in range(length))))


@dataclass(frozen=True)
class ContextCopy:
    """The context's runs of `ngram` + 1 tokens, and what stands before the canvas's first position."""

    grams: frozenset[tuple[int, ...]]  # every `ngram` tokens of the context with the token that followed them
    lead: tuple[int, ...]  # the prefix's last `ngram` tokens (fewer where the prefix is shorter)
    ngram: int
    floor: float  # the probability the model's argmax needs to be committed on the context's word

    @classmethod
    def of(cls, prefix_ids: list[int], suffix_ids: list[int], ngram: int, floor: float,
           window: int = 2048) -> ContextCopy:
        """The lookup of a fill: the last `window` tokens of the prefix and the first `window` of the suffix."""
        near_prefix, near_suffix = prefix_ids[-window:], suffix_ids[:window]  # slices: copies already
        grams = context_grams(near_prefix, ngram + 1) | context_grams(near_suffix, ngram + 1)
        return cls(grams, tuple(near_prefix[-ngram:]), ngram, floor)

    def agreed(self, tokens: torch.Tensor, known: torch.Tensor, argmax: torch.Tensor, argmax_probs: torch.Tensor,
               free: torch.Tensor) -> torch.Tensor:
        """The free positions (B, N) whose argmax (B, N) follows, somewhere in the context, the `ngram` tokens
        before them, with probability at least `floor`; left to right, each one agreed counts as known for the
        next. The tokens before a position must all be `known` (B, N: committed, holding `tokens`) or the prefix."""
        chosen = torch.zeros_like(free)
        if not self.grams:
            return chosen
        surely = (argmax_probs >= self.floor) & free  # (B, N)
        if not bool(surely.any()):
            return chosen
        rows = zip(tokens.tolist(), known.tolist(), argmax.tolist(), surely.tolist())
        for row, (row_tokens, row_known, row_argmax, row_sure) in enumerate(rows):
            recent = list(self.lead)  # the known tokens just before the position, at most `ngram` of them
            for position, token in enumerate(row_tokens):
                if row_known[position]:
                    recent.append(token)
                elif row_sure[position] and (*recent, row_argmax[position]) in self.grams:
                    chosen[row, position] = True
                    recent.append(row_argmax[position])
                else:
                    recent = []
                    continue
                del recent[: -self.ngram]
        return chosen
