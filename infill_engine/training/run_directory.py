"""A run directory: what a training run reads and writes, prepared once and read back on every resume.

    run_dir/
      corpus.jsonl, manifest.json   the documents (written once; a resumed run reads them back)
      tokenizer/                    the trained tokenizer (written once)
      start/                        a causal LM converted into a diffill model, when --init-from named one
      checkpoints/step-00001200/    model shards (safetensors), tokenizer, trainer_state.pt: loadable by
                                    infill_engine.loading.load_denoiser as it is
      train_log.csv                 step, tokens, loss, eval_loss, lr, seconds, eval_accuracy, eval_loss_average (see `loss_log`)
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


# Characters of a corpus tokenized to count its tokens: a larger corpus is counted on an even sample of its documents
# and scaled (the registry corpus, 650 MB, took over ten minutes of one core to tokenize whole before the first step).
COUNTED_CHARS = 64_000_000


def count_tokens(tokenizer: Any, corpus: Corpus) -> tuple[int, int, float | None, float]:
    """The corpus's tokens and characters, its characters per token on Python files, and the share of its characters
    tokenized to count them (1.0: all; below, every k-th document, the counts scaled kind by kind)."""
    kinds = [("python" if d.path.endswith(".py") else "other", d.text) for d in corpus.documents]
    all_chars: dict[str, int] = {}
    for kind, text in kinds:
        all_chars[kind] = all_chars.get(kind, 0) + len(text)
    chars = sum(all_chars.values())
    every = max(1, -(-chars // COUNTED_CHARS))  # ceil: the k of every k-th document
    counted = chars_and_tokens(tokenizer, kinds[::every])
    tokens = round(sum(sampled_tokens * all_chars[kind] / max(sampled_chars, 1)
                       for kind, (sampled_chars, sampled_tokens) in counted.items()))
    python_chars, python_tokens = counted.get("python", (0, 0))
    share = sum(sampled_chars for sampled_chars, _ in counted.values()) / max(chars, 1) if every > 1 else 1.0
    return tokens, chars, round(python_chars / python_tokens, 3) if python_tokens else None, round(share, 4)


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
    tokens, chars, python_chars_per_token, share = count_tokens(tokenizer, corpus)
    corpus.manifest.tokens = tokens
    corpus.manifest.chars_per_token_python = python_chars_per_token
    corpus.manifest.tokens_counted_share = share
    logger.info("corpus: %s%d tokens, %.2f characters per token (%.2f on Python)%s", "" if share == 1 else "about ",
                tokens, chars / max(tokens, 1), python_chars_per_token or 0.0,
                "" if share == 1 else f" (from an even sample of {share:.1%} of its characters)")
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
