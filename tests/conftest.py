"""Shared fixtures: tiny random-weight checkpoints of every family, built once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import tiny_models


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Directories of tiny checkpoints saved with save_pretrained, keyed by family."""
    root = tmp_path_factory.mktemp("models")
    return {
        "diffill": tiny_models.build_diffill(root / "diffill"),
        "diffusion_gemma": tiny_models.build_diffusion_gemma(root / "diffusion_gemma"),
        "mlm": tiny_models.build_bert(root / "bert"),
        "dream": tiny_models.build_remote_code(root / "dream", "dream"),
        "llada": tiny_models.build_remote_code(root / "llada", "llada"),
    }


@pytest.fixture(scope="session")
def tokenizer():
    """The tiny byte-level BPE tokenizer with the embedded model's special tokens."""
    return tiny_models.build_tokenizer(
        {"pad": "<|pad|>", "mask": "<|mask|>", "eos": "<|endoftext|>", "end_of_span": "<|endofspan|>"}
    )
