"""A deterministic engine for end-to-end tests of the language server, built by `diffill serve --engine-factory`.

Random tiny checkpoints write garbage, which only allows assertions that hold for any output. For exact ones the
server is started with `--engine-factory tests.lsp.fake_engine:build_engine`: a real `InfillEngine` (canvas,
denoising loop, syntax gate, refine) around a denoiser whose predictions are scripted by the context it is given.
A rule matches when the decoded prefix ends with `before` and the suffix starts with `after`; candidate k of the
batch predicts the k-th of its `fills` (the last one repeats), then end-of-span. A fill given as a tuple of pieces
is tokenized piece by piece, so that its tokens line up with the tokens of the text it refines. `unended` is the
model's second choice after the fill, below end-of-span: what it writes where the span may not end yet.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from infill_engine.adapters.base import EncodedContext
from infill_engine.engine import InfillEngine
from infill_engine.sampler import SamplerConfig
from tests.scripted import ScriptedDenoiser
from tests.tiny_models import diffill_tokenizer

SLOW_STEP_SECONDS = 0.15  # per forward pass of a slow rule: long enough to supersede or cancel it mid-fill
SLOW_MARGIN = 2.0  # logit margin of a slow rule: below the commit threshold, so one position commits per step


@dataclass(frozen=True)
class Rule:
    """What the fake model writes in a context."""

    before: str
    after: str
    fills: tuple[str | tuple[str, ...], ...]
    slow: bool = False
    unended: str = ""  # written after the fill where the span may not end (a second choice below end-of-span)


RULES = (
    # ghost text at a line end: two candidates, two items
    Rule("def add(a, b):\n    return ", "\n", ("a + b", "b + a")),
    # ghost text, and what the model writes once it is accepted (the server prefetches that)
    Rule("def mul(a, b):\n    product = ", "\n", ("a * b",)),
    Rule("def mul(a, b):\n    product = a * b", "\n", ("  # the product",)),
    # a rewrite or a refinement of a selection
    Rule("def sub(a, b):\n    return ", "\n", ("a - b",)),
    # the instruction of a rewrite, as the comment line the server puts before the selection
    Rule("# make it a product\n    return ", "\n", ("a * b",)),
    # mid-line: the fill repeats the closing bracket after the cursor and runs on to another line
    Rule("total = sum(", ")", ("values)\nprint(total)",)),
    # a word being typed, for completion items
    Rule("def scale(values, factor):\n    ret", "\n", ("urn [v * factor for v in values]",)),
    # a fill that would break the syntax: the gate must drop it
    Rule("broken = ", "\n", ("foo(",)),
    # a body for a placeholder
    Rule("def mean(values):\n    ", "\n", ("return sum(values) / len(values)",)),
    # the quick fix of a missing closing bracket: the line's own tokens, then ")"
    Rule("", "\ny = 3", (("x = foo(1, 2", ")"),)),
    # slow fills, to supersede, cancel or outdate them while they run
    Rule("slow = ", "\n", ("1 + 2 + 3 + 4 + 5 + 6 + 7",), slow=True),
    Rule("fast = ", "\n", ("42",)),
    Rule("through = ", "\n", ("10 + 20",), slow=True),  # keys typed at the cursor while it runs (typing through)
    Rule("def slow_rewrite():\n    return ", "\n", ("0",), slow=True),
    # a fill of whitespace alone (no ghost text), unless it must write something (completion.requireContent)
    Rule("def pad(a):\n    return", "\n", (" ",), unended="a"),
)


class RuleDenoiser(ScriptedDenoiser):
    """Writes the fills of the first rule that matches the context; nothing (end-of-span) when none does."""

    def __init__(self, tokenizer, rules=RULES) -> None:
        super().__init__(tokenizer, [""])
        self.rules = rules
        self.slow = False
        self.unended: torch.Tensor | None = None  # (B, N) second choices, -1 where there is none

    def _ids(self, fill: str | tuple[str, ...]) -> list[int]:
        pieces = (fill,) if isinstance(fill, str) else fill
        return [i for piece in pieces for i in self.tokenizer(piece, add_special_tokens=False)["input_ids"]]

    def encode(self, prefix_ids, suffix_ids, span_length, batch_size) -> EncodedContext:
        self.encodes += 1
        prefix = self.tokenizer.decode(prefix_ids)
        suffix = self.tokenizer.decode(suffix_ids)
        rule = next((r for r in self.rules if prefix.endswith(r.before) and suffix.startswith(r.after)), None)
        fills = rule.fills if rule else ("",)
        self.slow = bool(rule and rule.slow)
        self.margin = SLOW_MARGIN if self.slow else 12.0
        end = self.special.end_of_span_ids[0]
        rows, seconds = [], []
        for row in range(batch_size):
            ids = self._ids(fills[min(row, len(fills) - 1)])[:span_length]
            rows.append(ids + [end] * (span_length - len(ids)))
            after = self._ids(rule.unended) if rule else []
            seconds.append(([-1] * len(ids) + after + [-1] * span_length)[:span_length])
        self.unended = torch.tensor(seconds)
        return EncodedContext(prefix_ids, suffix_ids, span_length, batch_size, torch.tensor(rows))

    def predict(self, context, canvas, self_conditioning=None) -> torch.Tensor:
        if self.slow:
            time.sleep(SLOW_STEP_SECONDS)
        logits = super().predict(context, canvas, self_conditioning)
        if self.unended is not None and canvas.shape[1] == self.unended.shape[1]:
            second = self.unended[: canvas.shape[0]]
            if second.shape[0] < canvas.shape[0]:
                second = second[:1].expand(canvas.shape[0], -1)
            rows, positions = (second >= 0).nonzero(as_tuple=True)
            logits[rows, positions, second[rows, positions]] = self.margin - 2.0
        return logits


def build_engine(settings) -> InfillEngine:
    """The `--engine-factory` entry point: an engine around the rule denoiser (settings are applied by the server)."""
    tokenizer = diffill_tokenizer()
    return InfillEngine(RuleDenoiser(tokenizer), sampler=SamplerConfig(steps=24, block_size=64))
