"""A scripted engine for the README's screenshots: `diffill serve --engine-factory tests.editors.demo_engine:build_engine`.

No trained model ships yet and the tiny random test models write noise, so the screenshots in docs/ are made with
the real editors and the real `diffill serve` (canvas, denoising loop, syntax gate, LSP) around the rule denoiser of
tests/lsp/fake_engine.py, which writes the fill below when the context matches. The tests use the random models.
"""

from __future__ import annotations

from infill_engine.engine import InfillEngine
from infill_engine.sampler import SamplerConfig
from tests.lsp.fake_engine import Rule, RuleDenoiser
from tests.tiny_models import diffill_tokenizer

# The file the screenshots show, and the line the user is typing at its end.
DEMO_FILE = '''from pathlib import Path


def read_lines(path: Path) -> list[str]:
    """The lines of a text file, without their line breaks."""
    with path.open() as f:
        ret


def main() -> None:
    for line in read_lines(Path("notes.txt")):
        print(line)
'''
DEMO_LINE = 7  # 1-based: "        ret"
DEMO_TYPED = "urn "
DEMO_FILL = "f.read().splitlines()"

RULES = (Rule("    with path.open() as f:\n        return ", "\n", (DEMO_FILL,)),)


def build_engine(settings: object) -> InfillEngine:
    """The `--engine-factory` entry point."""
    tokenizer = diffill_tokenizer()
    return InfillEngine(RuleDenoiser(tokenizer, RULES), sampler=SamplerConfig(steps=24, block_size=64))
