"""What a fill takes and gives: plain dataclasses, without torch.

The engine (`infill_engine.engine`) and its clients (the language server, the shared engine service's client side)
both use these, so that a process which only talks to an engine over a socket never imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from infill_engine import syntax
from infill_engine.stats import FillStats


class FillCancelled(Exception):
    """The per-step callback (or the engine's client) asked the fill to stop."""


MAX_SPAN_TOKENS = 4096
MAX_CANDIDATES = 16


@dataclass(frozen=True)
class InfillRequest:
    """A hole to fill: the text before and after it, and how to fill it."""

    prefix: str
    suffix: str
    language: str | None = None  # canonical name, LSP languageId or file name; None: lexical bracket check only
    max_tokens: int = 64  # span positions on the canvas; the model may end the span earlier
    candidates: int = 1  # canvases denoised together in one batch
    gate: bool = True  # drop candidates that add syntax problems (after trying to repair them)
    seed: int | None = None  # overrides SamplerConfig.seed
    single_line: bool = False  # the fill ends at its first line break (ghost text in the middle of a line)
    require_content: bool = False  # the fill holds more than whitespace (SamplerConfig.end_after_content)
    repair_rounds: int | None = None  # overrides the engine's repair budget (0: reject without repairing)
    budget_ms: int | None = None  # ms, then the loop takes its argmax and repairs are skipped; None: no limit

    def validate(self) -> None:
        """Raise ValueError saying what is wrong and what is allowed."""
        if not isinstance(self.prefix, str) or not isinstance(self.suffix, str):
            raise ValueError("prefix and suffix must be text (str)")
        if not isinstance(self.max_tokens, int) or not 1 <= self.max_tokens <= MAX_SPAN_TOKENS:
            raise ValueError(f"max_tokens must be an integer from 1 to {MAX_SPAN_TOKENS} (got {self.max_tokens!r})")
        if not isinstance(self.candidates, int) or not 1 <= self.candidates <= MAX_CANDIDATES:
            raise ValueError(f"candidates must be an integer from 1 to {MAX_CANDIDATES} (got {self.candidates!r})")
        if self.repair_rounds is not None and (not isinstance(self.repair_rounds, int) or self.repair_rounds < 0):
            raise ValueError(f"repair_rounds must be an integer >= 0 (got {self.repair_rounds!r})")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)
                                      or not 0 <= self.seed < 2**63):  # torch's seeds, with room for repair rounds
            raise ValueError(f"seed must be an integer from 0 to 2**63 - 1 or None (got {self.seed!r})")
        if self.budget_ms is not None and (not isinstance(self.budget_ms, int) or isinstance(self.budget_ms, bool)
                                           or self.budget_ms < 0):
            raise ValueError(f"budget_ms must be an integer >= 0 (milliseconds) or None (got {self.budget_ms!r})")


@dataclass
class Candidate:
    """One filled span."""

    text: str
    token_ids: list[int]
    score: float  # mean log-probability of its tokens (higher is surer)
    gate: syntax.GateResult | None = None  # None when the gate was off
    repairs: int = 0  # re-noise-and-denoise rounds it went through
    lowest: float = 1.0  # probability of its least sure token (kept tokens of a refine count as 1)

    @property
    def passed(self) -> bool:
        """True when the gate was off or found no new syntax problem."""
        return self.gate is None or self.gate.ok


@dataclass
class InfillResult:
    """Fills that passed the gate, best first, the ones it rejected, and what it cost."""

    candidates: list[Candidate]
    rejected: list[Candidate]
    stats: FillStats = field(default_factory=FillStats)

    @property
    def text(self) -> str | None:
        """The best fill, or None when no candidate passed."""
        return self.candidates[0].text if self.candidates else None
