"""A scripted engine for the Neovim tests: `diffill serve --engine-factory tests.editors.rule_engine:build_engine`.

Two lines of the same length get two different fills, so a test can change the text while an answer is on its way
without moving the cursor, and tell the stale answer from the fresh one. It is the rule denoiser of
tests/lsp/fake_engine.py (a real `InfillEngine` around it: canvas, denoising loop, syntax gate, LSP), as
tests/editors/demo_engine.py uses it for the screenshots.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from infill_engine.engine import InfillEngine

TEXT = "import os\n\nalpha =\n"  # the document; the tests type " " at the end of line 3
OLD_LINE, OLD_FILL = "alpha = ", "answer_for_alpha"
NEW_LINE, NEW_FILL = "omega = ", "answer_for_omega"  # same length as OLD_LINE: the cursor column does not move
# accepted a word or a line at a time: the tests type " " at the end of line 3 of MEAN_TEXT
MEAN_TEXT = "def mean(values):\n    total = sum(values)\n    result =\n"
MEAN_LINE, MEAN_FILL = "    result = ", "total / len(values)\n    return result"


def build_engine(spec: object = None) -> InfillEngine:
    """The `--engine-factory` entry point (what it is given, the model options, is not needed)."""
    # Imported here: the tests import this module for its texts, and should not load torch for them.
    from infill_engine.engine import InfillEngine
    from infill_engine.sampler import SamplerConfig
    from tests.lsp.fake_engine import Rule, RuleDenoiser
    from tests.tiny_models import diffill_tokenizer

    rules = (Rule(OLD_LINE, "\n", (OLD_FILL,)), Rule(NEW_LINE, "\n", (NEW_FILL,)), Rule(MEAN_LINE, "\n", (MEAN_FILL,)))
    tokenizer = diffill_tokenizer()
    return InfillEngine(RuleDenoiser(tokenizer, rules), sampler=SamplerConfig(steps=24, block_size=64))
