"""The training loop: resumable, checkpointed atomically, with a loss log for plotting.

A run directory holds everything a run needs to continue after an interruption:

    run_dir/
      corpus.jsonl, manifest.json   the documents (written once; a resumed run reads them back)
      tokenizer/                    the trained tokenizer (written once)
      checkpoints/step-00001200/    model shards (safetensors), tokenizer, trainer_state.pt: loadable by
                                    infill_engine.loading.load_denoiser as it is
      train_log.csv                 step, tokens, loss, eval_loss, lr, seconds, eval_accuracy
      run_config.json               the settings of the latest start

Checkpoints are written atomically (see `checkpoints`). The data stream is drawn from one `random.Random` whose
state is saved with them, so a resumed run sees exactly the batches an uninterrupted run would have seen, and on CPU
ends with the same weights.
"""

from __future__ import annotations

import contextlib
import csv
import json
import logging
import math
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from bisect import bisect_right
from dataclasses import asdict, dataclass, replace
from itertools import accumulate
from pathlib import Path
from typing import Any, Iterator

import torch

from infill_engine.diffill_model import DiffillConfig, DiffillForInfilling
from infill_engine.diffill_model.modeling_diffill import IGNORE_INDEX
from infill_engine.training.checkpoints import (
    TrainerState,
    MAX_SHARD_SIZE,
    latest_checkpoint,
    load_trainer_state,
    remove_partial_checkpoints,
    save_checkpoint,
)
from infill_engine.training.corpus import (
    Corpus,
    Document,
    build_corpus,
    read_corpus,
    stdlib_directory,
    write_corpus,
    write_manifest,
)
from infill_engine.training.objective import (
    ObjectiveConfig,
    SpanTokens,
    TrainingExample,
    collate,
    make_example,
    span_tokens,
)
from infill_engine.training.tokenizer_training import chars_per_token, train_tokenizer

logger = logging.getLogger(__name__)

LOG_COLUMNS = ("step", "tokens", "loss", "eval_loss", "lr", "seconds", "eval_accuracy")


@dataclass(frozen=True)
class Preset:
    """A model size with the batch shape and learning rate that suit it."""

    model: dict[str, int]  # DiffillConfig fields; unset ones keep DiffillConfig's defaults
    vocab_size: int  # tokenizer vocabulary trained for a new run
    batch_size: int
    seq_len: int
    lr: float
    steps: int


PRESETS = {
    # for tests: trains in milliseconds a step
    "tiny": Preset(dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64),
                   vocab_size=512, batch_size=4, seq_len=96, lr=3e-3, steps=20),
    # DiffillConfig's defaults (about 6.9M parameters with 8,192 tokens): about 2 s a step on 2 CPU cores
    "small": Preset({}, vocab_size=8192, batch_size=16, seq_len=256, lr=1e-3, steps=20_000),
    # for a GPU (about 24M parameters): still small enough to denoise on a laptop CPU
    "base": Preset(dict(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, intermediate_size=1024),
                   vocab_size=8192, batch_size=64, seq_len=512, lr=6e-4, steps=50_000),
}


@dataclass(frozen=True)
class TrainConfig:
    """Everything a training run is told; None means the preset's value."""

    run_dir: Path
    sources: tuple[str, ...] = ()  # directories of source files, besides the standard library
    use_stdlib: bool = True  # include the running interpreter's standard library
    bench_path: str | None = None  # evaluation data the corpus must not overlap (None: the default location)
    preset: str = "small"
    steps: int | None = None  # length of the learning-rate schedule; the run ends there
    batch_size: int | None = None
    seq_len: int | None = None  # longest prefix + span + suffix, in tokens
    lr: float | None = None  # peak learning rate
    vocab_size: int | None = None  # tokenizer size, used only when the run directory has no tokenizer yet
    device: str = "auto"
    seed: int = 0
    resume: bool | None = None  # None: resume when the run directory has a checkpoint
    init_from: Path | None = None  # a new run starts from this model's weights and tokenizer (e.g. the shipped one)
    checkpoint_every: int = 200  # steps
    eval_every: int = 100  # steps
    eval_batches: int = 4  # fixed held-out batches, the same at every evaluation
    log_every: int = 10  # steps between rows of the loss log
    time_limit_minutes: float | None = None  # stop with a checkpoint after this much wall time
    stop_at_step: int | None = None  # stop with a checkpoint at this step (the schedule still runs to `steps`)
    warmup_steps: int | None = None  # None: 5% of the steps, at most 500
    min_lr_ratio: float = 0.1  # the cosine decays to this share of the peak
    weight_decay: float = 0.1  # on matrices only
    grad_clip: float = 1.0  # max global gradient norm
    keep_checkpoints: int = 2
    num_threads: int = 2  # CPU threads for torch
    train_layers: int | None = None  # train only the top N blocks (+ embedding and final norm); None: all
    progress: bool = True  # the progress bar on stderr
    objective: ObjectiveConfig | None = None  # None: ObjectiveConfig() with this run's seq_len
    # Dense supervision: the context is read causally and every context position also learns its next token
    dense: bool = False
    next_token_weight: float = 1.0  # with dense: the next-token loss's weight beside the span's loss

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}; allowed: {', '.join(PRESETS)}")
        for name in ("steps", "batch_size", "seq_len", "vocab_size", "stop_at_step", "train_layers"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer (got {value!r})")
        for name in ("checkpoint_every", "eval_every", "log_every", "eval_batches", "keep_checkpoints",
                     "num_threads"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer (got {value!r})")
        if self.lr is not None and not self.lr > 0:
            raise ValueError(f"lr must be positive (got {self.lr})")
        if self.time_limit_minutes is not None and not self.time_limit_minutes > 0:
            raise ValueError(f"time limit must be a positive number of minutes (got {self.time_limit_minutes})")
        if not self.use_stdlib and not self.sources:
            raise ValueError("no training data: give --source DIR, or leave the standard library in")

    def resolved(self) -> "TrainConfig":
        """This config with the preset's values filled in where it has None."""
        preset = PRESETS[self.preset]
        seq_len = self.seq_len or preset.seq_len
        steps = self.steps or preset.steps
        objective = self.objective or ObjectiveConfig(seq_len=seq_len, max_span_tokens=min(64, seq_len // 2))
        return replace(
            self,
            run_dir=Path(self.run_dir),
            steps=steps,
            batch_size=self.batch_size or preset.batch_size,
            seq_len=seq_len,
            lr=self.lr or preset.lr,
            vocab_size=self.vocab_size or preset.vocab_size,
            warmup_steps=self.warmup_steps if self.warmup_steps is not None else min(500, max(1, steps // 20)),
            objective=replace(objective, seq_len=seq_len),
        )


@dataclass
class TrainResult:
    """How a call to `train` ended."""

    step: int  # optimizer steps done, over all runs of this directory
    stopped_by: str  # "steps", "stop_at_step", "time_limit", "signal" or "already_done"
    checkpoint: Path | None  # the last checkpoint written or loaded
    eval_loss: float | None
    tokens_per_second: float | None  # this run's training throughput


# ---------------------------------------------------------------------------------------------------------- run setup


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
    chars, tokens = chars_per_token(tokenizer, (d.text for d in corpus.documents))
    py_chars, py_tokens = chars_per_token(tokenizer, (d.text for d in corpus.documents if d.path.endswith(".py")))
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


def count_parameters(model: torch.nn.Module) -> int:
    """Trainable parameters, tied weights counted once."""
    return sum(p.numel() for p in model.parameters())


# --------------------------------------------------------------------------------------------------------- the data


class ExampleStream:
    """An endless stream of training batches from documents drawn in proportion to their length."""

    def __init__(
        self, documents: list[Document], tokenizer: Any, objective: ObjectiveConfig, seed: int, dense: bool = False
    ) -> None:
        if not documents:
            raise ValueError("the example stream needs at least one document")
        self.documents = documents
        self.tokenizer = tokenizer
        self.objective = objective
        self.tokens: SpanTokens = span_tokens(tokenizer)
        self.cumulative = list(accumulate(len(d.text) for d in documents))
        self.rng = random.Random(seed)
        self.dense = dense

    def example(self) -> TrainingExample:
        """The next example."""
        index = bisect_right(self.cumulative, self.rng.random() * self.cumulative[-1])
        document = self.documents[min(index, len(self.documents) - 1)]
        return make_example(self.tokenizer, document.text, self.rng, self.tokens, self.objective)

    def batch(self, size: int) -> dict[str, torch.Tensor]:
        """The next `size` examples, collated."""
        return collate([self.example() for _ in range(size)], self.tokens.pad_id, self.dense)

    def state(self) -> Any:
        """The position in the stream."""
        return self.rng.getstate()

    def set_state(self, state: Any) -> None:
        """Continue from a position returned by `state`."""
        self.rng.setstate(_as_rng_state(state))


def _as_rng_state(state: Any) -> tuple:
    """A random.Random state from its saved form (lists where tuples were)."""
    version, internal, gauss = state
    return int(version), tuple(int(x) for x in internal), gauss


# ------------------------------------------------------------------------------------------------- the schedule


def lr_factor(step: int, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """Linear warm-up to 1 over `warmup_steps`, then a cosine down to `min_ratio` at `total_steps`."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def freeze_lower_layers(model: DiffillForInfilling, train_layers: int) -> None:
    """Train only the top `train_layers` blocks, the final norm and the special tokens' embedding rows.

    Everything else keeps the starting model's values, so the trained model is those weights plus a small part.
    """
    layers = model.config.num_hidden_layers
    if not 1 <= train_layers <= layers:
        raise ValueError(f"--train-layers must be between 1 and the model's {layers} layers (got {train_layers})")
    for block in model.layers[: layers - train_layers]:
        block.requires_grad_(False)
    config = model.config
    special = [i for i in (config.mask_token_id, config.end_of_span_token_id, config.pad_token_id) if i is not None]
    embedding = model.embed_tokens.weight
    trained_rows = torch.zeros(embedding.shape[0], 1, dtype=embedding.dtype, device=embedding.device)
    trained_rows[special] = 1.0
    embedding.register_hook(lambda grad: grad * trained_rows)  # input and (tied) output gradients alike
    embedding.rows_frozen = True  # make_optimizer: no weight decay, which would move the frozen rows
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad and p is not embedding)
    logger.info("training the top %d of %d layers and %d embedding rows (%d parameters)", train_layers, layers,
                len(special), trained + len(special) * embedding.shape[1])


def make_optimizer(model: torch.nn.Module, config: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW over the trainable weights: decay on matrices (embeddings included), none on norms."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in trainable if p.dim() >= 2 and not getattr(p, "rows_frozen", False)]
    decayed = {id(p) for p in decay}
    no_decay = [p for p in trainable if id(p) not in decayed]
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda")


# ------------------------------------------------------------------------------------------------- the loss log


def _truncate_log(path: Path, step: int) -> None:
    """Drop log rows written after `step` (by a run that was killed before its next checkpoint)."""
    if not path.is_file():
        return
    with open(path, newline="", encoding="utf-8") as handle:
        rows = [row for row in csv.DictReader(handle) if int(row["step"]) <= step]
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=LOG_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def _append_log(path: Path, row: dict[str, Any]) -> None:
    """Append one row to the loss log, writing the header first when the file is new."""
    new = not path.is_file()
    with open(path, "a", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=LOG_COLUMNS)
        if new:
            writer.writeheader()
        writer.writerow(row)


# ------------------------------------------------------------------------------------------------- evaluation


@torch.no_grad()
def evaluate(
    model: DiffillForInfilling, batches: list[dict[str, torch.Tensor]], device: torch.device, tokens: SpanTokens
) -> tuple[float, float]:
    """Mean loss over fixed held-out batches, and the accuracy at masked positions of the middle (not end-of-span)."""
    was_training = model.training
    model.eval()
    losses, correct, masked = [], 0, 0
    for batch in batches:
        # the span's loss alone, so that span-only and dense runs compare on one scale
        batch = {k: v.to(device) for k, v in batch.items() if k != "next_token_labels"}
        with _autocast(device):
            output = model(**batch)
        losses.append(float(output.loss))
        labels = batch["labels"]  # (B, T)
        at_mask = (batch["input_ids"] == tokens.mask_id) & (labels != IGNORE_INDEX) & (labels != tokens.end_of_span_id)
        correct += int((output.logits.argmax(-1) == labels)[at_mask].sum())
        masked += int(at_mask.sum())
    model.train(was_training)
    return sum(losses) / len(losses), correct / max(masked, 1)


def _autocast(device: torch.device) -> contextlib.AbstractContextManager:
    """bfloat16 autocast on CUDA; nothing on CPU, where float32 is as fast for a model this small."""
    if device.type == "cuda":
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


# ------------------------------------------------------------------------------------------------- the loop


class _StopSignal:
    """Turns the first SIGINT or SIGTERM into a request to stop after the current step (a second one kills)."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "_StopSignal":
        if _in_main_thread():
            for number in (signal.SIGINT, signal.SIGTERM):
                self._previous[number] = signal.signal(number, self._handle)
        return self

    def _handle(self, number: int, frame: Any) -> None:
        logger.warning("signal %d: stopping after this step with a checkpoint (again to stop at once)", number)
        self.requested = True
        signal.signal(number, self._previous.get(number, signal.SIG_DFL))

    def __exit__(self, *exc: Any) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _resume_choice(config: TrainConfig) -> Path | None:
    """The checkpoint to resume from, or None for a new run; raises ValueError when the request cannot be met."""
    checkpoint = latest_checkpoint(config.run_dir)
    if config.resume is True and checkpoint is None:
        raise ValueError(f"--resume: {config.run_dir} has no complete checkpoint to resume from")
    if config.resume is False and checkpoint is not None:
        raise ValueError(
            f"--no-resume: {config.run_dir} already has checkpoints; choose another --run-dir or delete "
            f"{config.run_dir / 'checkpoints'} to start over"
        )
    return checkpoint


def train(config: TrainConfig) -> TrainResult:
    """Train (or continue training) the run in `config.run_dir` until its steps, stop step or time limit."""
    started = time.monotonic()
    config = config.resolved()
    torch.set_num_threads(config.num_threads)
    from infill_engine.device import choose_device

    device = choose_device(config.device)
    run_dir = config.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    remove_partial_checkpoints(run_dir)
    checkpoint = _resume_choice(config)
    if checkpoint is None and config.init_from is not None:
        config = replace(config, init_from=prepare_start(config.init_from, run_dir))
    corpus, tokenizer = prepare_run(config)
    train_docs = corpus.split("train")
    eval_docs = corpus.split("eval") or train_docs
    (run_dir / "run_config.json").write_text(
        json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()}, indent=2,
                   default=str) + "\n", encoding="utf-8",
    )

    stream = ExampleStream(train_docs, tokenizer, config.objective, config.seed, config.dense)
    eval_stream = ExampleStream(eval_docs, tokenizer, config.objective, config.seed + 1_000_003)
    eval_batches = [eval_stream.batch(config.batch_size) for _ in range(config.eval_batches)]

    torch.manual_seed(config.seed)
    if checkpoint is None and config.init_from is not None:
        logger.info("starting from the weights of %s", config.init_from)
        model = DiffillForInfilling.from_pretrained(config.init_from, dtype=torch.float32)
        state = TrainerState(preset=config.preset)
    elif checkpoint is None:
        model = build_model(PRESETS[config.preset], tokenizer, config.seq_len, config.dense)
        state = TrainerState(preset=config.preset)
    else:
        model = DiffillForInfilling.from_pretrained(checkpoint, dtype=torch.float32)
        if config.seq_len > model.config.max_position_embeddings:
            logger.info("raising max_position_embeddings to the new seq_len %d", config.seq_len)
            model.config.max_position_embeddings = config.seq_len
    if config.dense and not (model.config.shift_logits and model.config.causal_context):
        logger.info("dense supervision: the model now reads its context causally and predicts shifted")
        model.config.shift_logits = model.config.causal_context = True
    model.to(device).train()
    if config.train_layers is not None:
        freeze_lower_layers(model, config.train_layers)
    optimizer = make_optimizer(model, config, device)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, config.warmup_steps, config.steps, config.min_lr_ratio)
    )
    if checkpoint is not None:
        saved = load_trainer_state(checkpoint, device)
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        torch.set_rng_state(saved["torch_rng"].cpu())
        if saved.get("cuda_rng") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([s.cpu() for s in saved["cuda_rng"]])
        state = TrainerState(**saved["state"])
        stream.set_state(state.data_rng)
        if state.preset and state.preset != config.preset:
            logger.warning("the checkpoint was trained with preset %r; its architecture is kept", state.preset)
        logger.info("resuming %s at step %d (%d tokens trained)", checkpoint, state.step, state.tokens)
    _truncate_log(run_dir / "train_log.csv", state.step)
    logger.info(
        "training %s: %d parameters on %s, %d train / %d eval documents, batch %d x %d tokens, steps %d",
        run_dir, count_parameters(model), device, len(train_docs), len(eval_docs), config.batch_size,
        config.seq_len, config.steps,
    )
    if state.step >= config.steps:
        logger.info("%s is already at step %d of %d", run_dir, state.step, config.steps)
        return TrainResult(state.step, "already_done", checkpoint, state.eval_loss, None)
    return _loop(config, model, tokenizer, optimizer, scheduler, stream, eval_batches, state, device, started)


def train_step(
    model: DiffillForInfilling,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    batch: dict[str, torch.Tensor],
    device: torch.device,
    grad_clip: float,
    next_token_weight: float = 1.0,
) -> tuple[float, float]:
    """One optimizer step on a batch; the loss before the step and the learning rate it was taken with."""
    with _autocast(device):
        loss = model(**batch, loss_only=True, next_token_weight=next_token_weight).loss
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    lr = scheduler.get_last_lr()[0]
    scheduler.step()
    return loss.detach().item(), lr


def _stop_reason(config: TrainConfig, step: int, signalled: bool, deadline: float | None) -> str | None:
    """Why the run stops after `step`, or None to go on."""
    if step >= config.steps:
        return "steps"
    if signalled:
        return "signal"
    if config.stop_at_step is not None and step >= config.stop_at_step:
        return "stop_at_step"
    if deadline is not None and time.monotonic() >= deadline:
        return "time_limit"
    return None


def _loop(
    config: TrainConfig,
    model: DiffillForInfilling,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    stream: ExampleStream,
    eval_batches: list[dict[str, torch.Tensor]],
    state: TrainerState,
    device: torch.device,
    started: float,
) -> TrainResult:
    """Steps until the end of the schedule, the stop step, the time limit or a signal; checkpoint on the way out."""
    from tqdm import tqdm

    log_path = config.run_dir / "train_log.csv"
    deadline = None if config.time_limit_minutes is None else started + 60 * config.time_limit_minutes
    session_start, session_tokens, seconds_before = time.monotonic(), 0, state.seconds
    window_losses: list[float] = []
    checkpoint: Path | None = None
    stopped_by: str | None = None
    bar = tqdm(
        total=config.steps, initial=state.step, file=sys.stderr, disable=not config.progress, unit="step",
        mininterval=1.0 if sys.stderr.isatty() else 60.0, dynamic_ncols=True,
    )
    with _StopSignal() as stop, bar:
        while stopped_by is None:
            batch = {k: v.to(device, non_blocking=True) for k, v in stream.batch(config.batch_size).items()}
            loss, lr = train_step(
                model, optimizer, scheduler, batch, device, config.grad_clip, config.next_token_weight
            )
            state.step += 1
            session_tokens += int(batch["attention_mask"].sum())
            state.tokens += int(batch["attention_mask"].sum())
            state.seconds = seconds_before + time.monotonic() - session_start
            tokens_per_second = session_tokens / max(time.monotonic() - session_start, 1e-9)
            window_losses.append(loss)
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_second:.0f}", refresh=False)

            stopped_by = _stop_reason(config, state.step, stop.requested, deadline)
            eval_row: dict[str, str] = {}
            if state.step % config.eval_every == 0 or stopped_by == "steps":
                eval_loss, accuracy = evaluate(model, eval_batches, device, stream.tokens)
                state.eval_loss = eval_loss
                eval_row = {"eval_loss": f"{eval_loss:.4f}", "eval_accuracy": f"{accuracy:.4f}"}
                logger.info(
                    "step %d: loss %.4f, eval loss %.4f, middle-token accuracy at masks %.3f, lr %.2e, %.0f tokens/s",
                    state.step, sum(window_losses) / len(window_losses), eval_loss, accuracy, lr, tokens_per_second,
                )
            if state.step % config.log_every == 0 or eval_row or stopped_by:
                mean_loss = sum(window_losses) / len(window_losses)
                _append_log(log_path, {"step": state.step, "tokens": state.tokens, "loss": f"{mean_loss:.4f}",
                                       "lr": f"{lr:.6g}", "seconds": f"{state.seconds:.1f}", **eval_row})
                window_losses.clear()
            if stopped_by or state.step % config.checkpoint_every == 0:
                state.data_rng = stream.state()
                checkpoint = save_checkpoint(
                    config.run_dir, model, tokenizer, optimizer, scheduler, state, config.keep_checkpoints
                )
    tokens_per_second = session_tokens / max(time.monotonic() - session_start, 1e-9)
    logger.info("stopped at step %d (%s); %.0f tokens/s; checkpoint %s", state.step, stopped_by,
                tokens_per_second, checkpoint)
    return TrainResult(state.step, stopped_by, checkpoint, state.eval_loss, tokens_per_second)


def iter_log(run_dir: Path) -> Iterator[dict[str, str]]:
    """The rows of a run's loss log."""
    path = Path(run_dir) / "train_log.csv"
    if path.is_file():
        with open(path, newline="", encoding="utf-8") as handle:
            yield from csv.DictReader(handle)
