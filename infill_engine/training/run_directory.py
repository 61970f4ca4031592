"""A run directory: what a training run reads and writes, prepared once and read back on every resume.

    run_dir/
      corpus.jsonl, manifest.json   the documents (written once; a resumed run reads them back)
      tokenizer/                    the trained tokenizer (written once)
      start/                        a causal LM converted into a diffill model, when --init-from named one
      checkpoints/step-00001200/    model shards (safetensors), tokenizer, trainer_state.pt: loadable by
                                    infill_engine.loading.load_denoiser as it is
      train_log.csv                 step, tokens, loss, eval_loss, lr, seconds, eval_accuracy (see `loss_log`)
      run_config.json               the settings of the latest start

The tokenizer and a converted start are written beside their place and renamed into it, so a killed run never
leaves half of one.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from infill_engine.diffill_model import DiffillConfig, DiffillForInfilling
from infill_engine.training.checkpoints import MAX_SHARD_SIZE
from infill_engine.training.config import Preset, TrainConfig
from infill_engine.training.corpus import (
    Corpus,
    build_corpus,
    read_corpus,
    stdlib_directory,
    write_corpus,
    write_manifest,
)
from infill_engine.training.objective import span_tokens
from infill_engine.training.tokenizer_training import chars_and_tokens, train_tokenizer

logger = logging.getLogger(__name__)


def prepare_run(config: TrainConfig) -> tuple[Corpus, Any]:
    """The run's corpus and tokenizer: read from the run directory, or built and written there the first time."""
    from transformers import AutoTokenizer

    run_dir = config.run_dir
    tokenizer_dir = run_dir / "tokenizer"
    sources = [str(stdlib_directory())] if config.use_stdlib else []
    sources += [str(s) for s in config.sources]
    if config.init_from is not None and not (tokenizer_dir / "tokenizer.json").is_file():
        # a run that starts from a trained model keeps that model's tokenizer: its weights only make sense with it
        run_dir.mkdir(parents=True, exist_ok=True)
        AutoTokenizer.from_pretrained(config.init_from).save_pretrained(tokenizer_dir)
    if (run_dir / "corpus.jsonl").is_file() and (tokenizer_dir / "tokenizer.json").is_file():
        corpus = read_corpus(run_dir)
        if corpus.manifest.sources != sources:
            logger.warning("%s was prepared from %s; it keeps that corpus (start a new --run-dir for another)",
                           run_dir, ", ".join(corpus.manifest.sources))
        logger.info("reading the corpus and tokenizer of %s", run_dir)
        return corpus, AutoTokenizer.from_pretrained(tokenizer_dir)
    corpus = build_corpus(sources, config.bench_path)
    if not corpus.split("train"):
        raise ValueError(f"no usable source files under {', '.join(sources)}")
    if (tokenizer_dir / "tokenizer.json").is_file():  # given by --init-from
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    else:
        tokenizer = train_tokenizer((d.text for d in corpus.split("train")), vocab_size=config.vocab_size)
    by_kind = chars_and_tokens(tokenizer, (("python" if d.path.endswith(".py") else "other", d.text)
                                           for d in corpus.documents))
    chars, tokens = (sum(counts) for counts in zip((0, 0), *by_kind.values()))
    py_chars, py_tokens = by_kind.get("python", (0, 0))
    corpus.manifest.tokens = tokens
    corpus.manifest.chars_per_token_python = round(py_chars / py_tokens, 3) if py_tokens else None
    logger.info("corpus: %d tokens, %.2f characters per token (%.2f on Python)",
                tokens, chars / max(tokens, 1), corpus.manifest.chars_per_token_python or 0.0)
    write_corpus(corpus, run_dir)
    write_manifest(corpus.manifest, run_dir)
    staging = Path(tempfile.mkdtemp(prefix="tokenizer.tmp-", dir=run_dir))
    tokenizer.save_pretrained(staging)
    staging.chmod(0o755)
    if tokenizer_dir.exists():  # a tokenizer without its corpus: both are rebuilt together
        shutil.rmtree(tokenizer_dir)
    os.replace(staging, tokenizer_dir)
    return corpus, AutoTokenizer.from_pretrained(tokenizer_dir)


def prepare_start(init_from: Path | str, run_dir: Path) -> Path:
    """The diffill model a new run starts from: `init_from` itself, or a causal LM converted once into run_dir/start."""
    from infill_engine.diffill_model.causal_conversion import diffill_from_causal_lm, resolve_causal_source

    if resolve_causal_source(init_from) is None:
        return Path(init_from)
    start = run_dir / "start"
    if not (start / "config.json").is_file():
        model, tokenizer = diffill_from_causal_lm(init_from)
        staging = Path(tempfile.mkdtemp(prefix="start.tmp-", dir=run_dir))
        model.save_pretrained(staging, max_shard_size=MAX_SHARD_SIZE)
        tokenizer.save_pretrained(staging)
        staging.chmod(0o755)
        os.replace(staging, start)  # a killed conversion leaves only a temporary directory, never a partial start
    return start


def build_model(preset: Preset, tokenizer: Any, seq_len: int, dense: bool = False) -> DiffillForInfilling:
    """A new model of the preset's size, with the tokenizer's special ids in its config."""
    tokens = span_tokens(tokenizer)
    model_config = DiffillConfig(
        **preset.model,
        shift_logits=dense,
        causal_context=dense,
        vocab_size=len(tokenizer),
        # Serving fits prefix + span + suffix into this many positions, so it asks only for what was trained.
        max_position_embeddings=seq_len,
        mask_token_id=tokens.mask_id,
        end_of_span_token_id=tokens.end_of_span_id,
        pad_token_id=tokens.pad_id,
    )
    return DiffillForInfilling(model_config)
