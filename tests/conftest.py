"""Shared fixtures: tiny random-weight checkpoints of every family, built once per test session."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

# Layers compiled ahead of time are off in the suite (before anything reads the default): otherwise every server a
# test starts with a tiny real model would compile it in the background (20-60 s of a core each, and a child process
# that outlives the test). tests/test_compiled_layers.py turns them on where it tests them, and checks the default.
os.environ["DIFFILL_COMPILED_LAYERS"] = "off"

import pytest

from infill_engine.special_tokens import END_OF_SPAN_TOKEN, END_OF_TEXT_TOKEN, MASK_TOKEN, PAD_TOKEN
from tests import tiny_models

# The session's own cache of compiled layers ($DIFFILL_CACHE), set before any server environment is built from
# os.environ: servers' background compiles of tiny models land there, not in the user's ~/.cache/diffill.
os.environ["DIFFILL_CACHE"] = tempfile.mkdtemp(prefix="diffill-test-cache-")
atexit.register(shutil.rmtree, os.environ["DIFFILL_CACHE"], ignore_errors=True)


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


@pytest.fixture
def package_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test's own cache of compiled layers ($DIFFILL_CACHE), where a module asks for it (`usefixtures`)."""
    from infill_engine.compiled_layers import default_cache_dir

    monkeypatch.setenv("DIFFILL_CACHE", str(tmp_path / "cache"))
    return default_cache_dir()


@pytest.fixture(scope="session")
def tokenizer():
    """The tiny byte-level BPE tokenizer with the embedded model's special tokens."""
    return tiny_models.build_tokenizer(
        {"pad": PAD_TOKEN, "mask": MASK_TOKEN, "eos": END_OF_TEXT_TOKEN, "end_of_span": END_OF_SPAN_TOKEN}
    )


# Fuzz tests (tests/**/test_fuzz_*.py): no deadline (a loaded machine must not fail them), no example database
# written into the checkout, and DIFFILL_FUZZ_EXAMPLES=N raising every fuzz test's example count for a longer run.
try:
    from hypothesis import HealthCheck
    from hypothesis import settings as _hypothesis_settings

    _hypothesis_settings.register_profile(
        "diffill", deadline=None, database=None, print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    _hypothesis_settings.load_profile("diffill")
except ImportError:  # hypothesis is in the `test` extra; without it only the fuzz tests are skipped
    pass
