"""Held-out loss of any checkpoint on a run's own held-out batches, so that models compare on one scale.

    python -m infill_engine.training.held_out --run-dir RUN MODEL [MODEL ...] [--batches N] [--json PATH]

The batches are the ones the run evaluates on while it trains (its held-out files, its seed, one hole per window
laid out as served), so a checkpoint of another run, the shipped model or an exported directory gets numbers that
sit on the run's own curve. Loss is the span's masked-diffusion loss alone; accuracy is at masked middle positions;
"sure" is the share of those positions whose top probability reaches the sampler's commit threshold (0.9), which is
what certainty forcing raises (docs/MODEL.md, "Fewer steps").
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

EVAL_SEED_OFFSET = 1_000_003  # the held-out stream's seed is the run's seed plus this
COMMIT_THRESHOLD = 0.9  # the sampler's default threshold (SamplerConfig.threshold)


def held_out_batches(documents: list[Any], tokenizer: Any, objective: Any, seed: int, batch_size: int, count: int,
                     autoregressive: bool = False) -> list[dict[str, torch.Tensor]]:
    """The fixed held-out batches of a run: one hole per window (as served) and every span position weighted as the
    objective weights it without `end_weight`, so runs compare on one scale; drawn from the run's seed."""
    from infill_engine.training.example_stream import ExampleStream

    if not autoregressive:
        objective = replace(objective, holes=1, end_weight=1.0)
    stream = ExampleStream(documents, tokenizer, objective, seed + EVAL_SEED_OFFSET, autoregressive=autoregressive)
    return [stream.batch(batch_size) for _ in range(count)]


def run_batches(run_dir: Path, batch_size: int | None = None, count: int | None = None
                ) -> tuple[list[dict[str, torch.Tensor]], Any]:
    """A run directory's held-out batches and tokenizer, rebuilt from its run_config.json, corpus and tokenizer
    (`batch_size` and `count` default to the run's own)."""
    from transformers import AutoTokenizer

    from infill_engine.training.corpus import read_corpus
    from infill_engine.training.objective import ObjectiveConfig

    config_path = run_dir / "run_config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{run_dir} is not a training run directory (no run_config.json)")
    config = json.loads(config_path.read_text(encoding="utf-8"))
    if config.get("autoregressive"):
        raise ValueError(f"{run_dir} trains the autoregressive twin, whose loss is not on the span's scale")
    corpus = read_corpus(run_dir)
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "tokenizer")
    objective = ObjectiveConfig(**config["objective"])
    documents = corpus.split("eval") or corpus.split("train")
    batches = held_out_batches(documents, tokenizer, objective, config["seed"], batch_size or config["batch_size"],
                               count or config["eval_batches"])
    return batches, tokenizer


def measure(model_dirs: list[Path], run_dir: Path, count: int | None = None) -> list[dict[str, Any]]:
    """Held-out span loss and masked-token accuracy of each model on the run's held-out batches (its own number of
    them, or the first `count` of the same stream: more batches, a steadier figure)."""
    from infill_engine.diffill_model import DiffillForInfilling
    from infill_engine.training.objective import span_tokens
    from infill_engine.training.train import evaluate

    batches, tokenizer = run_batches(run_dir, count=count)
    tokens = span_tokens(tokenizer)
    rows = []
    for model_dir in model_dirs:
        model = DiffillForInfilling.from_pretrained(model_dir, dtype=torch.float32)
        if model.config.vocab_size != len(tokenizer):
            raise ValueError(f"{model_dir} has a vocabulary of {model.config.vocab_size} tokens, the run's tokenizer "
                             f"{len(tokenizer)}: they do not share a tokenizer, so the loss would not compare")
        loss, accuracy, sure = evaluate(model, batches, torch.device("cpu"), tokens)
        rows.append({"model": str(model_dir), "held_out_loss": round(loss, 4), "accuracy": round(accuracy, 4),
                     "sure": round(sure, 4)})
    return rows


def _positive(text: str) -> int:
    """A whole number of at least 1, for argparse."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a number of batches is a whole number of at least 1, not {text!r}")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    """Print each model's held-out loss and accuracy on the run's batches (and write them as JSON if asked)."""
    parser = argparse.ArgumentParser(prog="python -m infill_engine.training.held_out", description=__doc__.split("\n")[0])
    parser.add_argument("--run-dir", required=True, type=Path, help="the run whose held-out batches to use")
    parser.add_argument("models", nargs="+", type=Path, help="checkpoint or model directories")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--batches", type=_positive, metavar="N",
                        help="the first N held-out batches of the run's stream instead of its own count (the run logs "
                             "4 by default: 0.02-0.04 nats of noise between two evaluations; 32 settle a comparison)")
    args = parser.parse_args(argv)
    try:
        rows = measure(args.models, args.run_dir, args.batches)
    except (FileNotFoundError, ValueError, OSError) as error:
        print(f"held_out: {error}", file=sys.stderr)
        return 2
    for row in rows:
        print(f"loss {row['held_out_loss']:.4f}  accuracy {100 * row['accuracy']:5.1f} %  "
              f"sure {100 * row['sure']:5.1f} %  {row['model']}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
