"""The stream of training batches: documents drawn in proportion to their length (or to given weights), from one
resumable random state."""

from __future__ import annotations

import random
from bisect import bisect_right
from itertools import accumulate
from typing import Any

import torch

from infill_engine.training.corpus import Document
from infill_engine.training.objective import (
    ObjectiveConfig,
    SpanTokens,
    TrainingExample,
    collate,
    make_example,
    span_tokens,
)


class ExampleStream:
    """An endless stream of training batches from documents drawn in proportion to their length (or `weights`)."""

    def __init__(
        self, documents: list[Document], tokenizer: Any, objective: ObjectiveConfig, seed: int, dense: bool = False,
        autoregressive: bool = False, weights: list[float] | None = None,
    ) -> None:
        if not documents:
            raise ValueError("the example stream needs at least one document")
        if weights is not None and (len(weights) != len(documents) or min(weights) < 0 or sum(weights) <= 0):
            raise ValueError(f"the example stream needs one weight >= 0 per document, not all 0 (got "
                             f"{len(weights)} weights for {len(documents)} documents)")
        self.documents = documents
        self.tokenizer = tokenizer
        self.objective = objective
        self.tokens: SpanTokens = span_tokens(tokenizer)
        self.weights = weights
        self.cumulative = list(accumulate(weights if weights is not None else (len(d.text) for d in documents)))
        self.rng = random.Random(seed)
        self.dense = dense
        self.autoregressive = autoregressive  # the twin's fill-in-the-middle sequences (fim_objective)
        if autoregressive:
            from infill_engine.training.fim_objective import fim_tokens

            self.fim = fim_tokens(tokenizer)

    def example(self) -> TrainingExample:
        """The next example (a `FimExample` for an autoregressive stream)."""
        document = self.draw_document()
        if self.autoregressive:
            from infill_engine.training.fim_objective import make_fim_example

            return make_fim_example(self.tokenizer, document.text, self.rng, self.fim, self.objective)
        return make_example(self.tokenizer, document.text, self.rng, self.tokens, self.objective)

    def draw_document(self) -> Document:
        """The next document, drawn in proportion to its weight."""
        index = bisect_right(self.cumulative, self.rng.random() * self.cumulative[-1])
        return self.documents[min(index, len(self.documents) - 1)]

    def batch(self, size: int) -> dict[str, torch.Tensor]:
        """The next `size` examples, collated."""
        examples = [self.example() for _ in range(size)]
        if self.autoregressive:
            from infill_engine.training.fim_objective import collate_fim

            return collate_fim(examples, self.fim.pad_id)
        return collate(examples, self.tokens.pad_id, self.dense)

    def state(self) -> Any:
        """The position in the stream."""
        return self.rng.getstate()

    def set_state(self, state: Any) -> None:
        """Continue from a position returned by `state`."""
        self.rng.setstate(_as_rng_state(state))


def _as_rng_state(state: Any) -> tuple:
    """A random.Random state from its saved form (lists where tuples were)."""
    version, internal, gauss = state
    return int(version), tuple(int(x) for x in internal), gauss
