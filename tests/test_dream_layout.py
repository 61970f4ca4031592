"""A diffill model as a Dream-layout checkpoint (infill_engine/training/dream_layout.py): the same weights as Qwen2,
fine-tuned to read both ways, loaded by the engine through its `dream` path with the dual cache."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from infill_engine.diffill_model import DiffillForInfilling
from infill_engine.engine import InfillEngine
from infill_engine.interface import ModelSpec
from infill_engine.loading import inspect_model
from infill_engine.request import InfillRequest
from infill_engine.training.corpus import Document
from infill_engine.training.dream_layout import as_qwen2, fine_tune, main
from tests import tiny_models

SOURCES = ("textwrap", "shlex", "fnmatch", "glob", "bisect", "heapq")


def documents(directory: Path) -> list[Document]:
    """Real Python to fine-tune on: a few standard-library modules."""
    directory.mkdir(parents=True, exist_ok=True)
    tiny_models.copy_stdlib_sources(directory, SOURCES)
    return [Document(str(path), path.read_text(encoding="utf-8"),
                     hashlib.sha256(path.read_bytes()).hexdigest()) for path in sorted(directory.glob("*.py"))]


@pytest.fixture(scope="module")
def tiny_diffill(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny diffill model that reads its context causally and predicts shifted, as the embedded one does."""
    return tiny_models.build_diffill(tmp_path_factory.mktemp("diffill"), hidden=32, layers=2, causal_context=True,
                                     shift_logits=True)


@torch.no_grad()
def test_read_causally_the_converted_weights_give_the_same_next_token_logits(tiny_diffill):
    diffill = DiffillForInfilling.from_pretrained(tiny_diffill, dtype=torch.float32)
    ids = torch.randint(5, diffill.config.vocab_size, (2, 30), generator=torch.Generator().manual_seed(0))
    ours = diffill(ids, canvas_mask=torch.zeros_like(ids, dtype=torch.bool)).logits  # position t from output t - 1
    theirs = as_qwen2(diffill, causal=True)(input_ids=ids).logits  # output t predicts t + 1
    assert torch.allclose(ours[:, 1:], theirs[:, :-1], atol=1e-4)
    both_ways = as_qwen2(diffill, causal=False)(input_ids=ids).logits
    assert not torch.allclose(both_ways[:, :-1], theirs[:, :-1], atol=1e-3)  # the context now reads what follows


def test_fine_tuned_it_loads_as_dream_and_fills_with_the_dual_cache(tiny_diffill, tmp_path):
    docs = documents(tmp_path / "src")
    saved = fine_tune(tiny_diffill, docs[:-1], docs[-1:], tmp_path / "run", steps=4, batch_size=2, checkpoint_every=2,
                      seq_len=128, bfloat16=False, warmup_steps=1, log=False)
    assert [path.name for path in saved] == ["step-00002", "step-00004"]
    rows = (tmp_path / "run" / "log.csv").read_text().splitlines()
    assert len(rows) == 1 + 5 and all(row.split(",")[3] for row in (rows[1], rows[3], rows[5]))  # held-out losses
    before = DiffillForInfilling.from_pretrained(tiny_diffill, dtype=torch.float32)
    info = inspect_model(saved[-1])
    assert info.family == "dream" and info.reads_as_qwen2 and not info.needs_remote_code
    assert json.loads((saved[-1] / "config.json").read_text())["mask_token_id"] == before.config.mask_token_id
    engine = InfillEngine.load(ModelSpec(path=str(saved[-1]), dual_cache=2))
    result = engine.fill(InfillRequest("def area(width, height):\n    return ", "\n", "python", max_tokens=8))
    assert engine.denoiser.dual_cache.usable and result.stats.forward_passes >= 1
    trained = engine.denoiser.model.model.embed_tokens.weight.float()
    assert not torch.allclose(trained, before.embed_tokens.weight.to(torch.bfloat16).float())  # it trained


def test_the_command_refuses_a_directory_without_a_corpus(tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        main([str(tmp_path / "out"), "--corpus", str(tmp_path)])
    assert stopped.value.code == 2 and "holds no corpus.jsonl" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
