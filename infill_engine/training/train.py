"""The training loop: resumable, checkpointed atomically, with a loss log for plotting.

A run continues after an interruption from its run directory (see `run_directory`). Checkpoints are written
atomically (see `checkpoints`). The data stream is drawn from one `random.Random` whose state is saved with them (see
`example_stream`), so a resumed run sees exactly the batches an uninterrupted run would have seen, and on CPU ends
with the same weights.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from infill_engine.diffill_model import DiffillForInfilling
from infill_engine.diffill_model.modeling_diffill import IGNORE_INDEX
from infill_engine.training.checkpoints import (
    TrainerState,
    load_trainer_state,
    remove_partial_checkpoints,
    save_checkpoint,
    usable_checkpoint,
)
from infill_engine.training.config import PRESETS, TrainConfig
from infill_engine.training.example_stream import ExampleStream
from infill_engine.training.function_documents import functions_to_train_on
from infill_engine.training.held_out import COMMIT_THRESHOLD, held_out_batches
from infill_engine.training.loss_log import LOG_FILE, append_log, truncate_log
from infill_engine.training.objective import SpanTokens, pad_batch
from infill_engine.training.run_directory import build_model, prepare_run, prepare_start
from infill_engine.training.weight_average import WeightAverage, load_average

logger = logging.getLogger(__name__)


@dataclass
class TrainResult:
    """How a call to `train` ended."""

    step: int  # optimizer steps done, over all runs of this directory
    stopped_by: str  # "steps", "stop_at_step", "time_limit", "signal" or "already_done"
    checkpoint: Path | None  # the last checkpoint written or loaded
    eval_loss: float | None
    tokens_per_second: float | None  # this run's training throughput


def count_parameters(model: torch.nn.Module) -> int:
    """Trainable parameters, tied weights counted once."""
    return sum(p.numel() for p in model.parameters())


# ------------------------------------------------------------------------------------ the optimizer and its schedule


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


# ------------------------------------------------------------------------------------------------- evaluation


@torch.no_grad()
def evaluate(
    model: DiffillForInfilling, batches: list[dict[str, torch.Tensor]], device: torch.device, tokens: SpanTokens,
    bfloat16: bool = False,
) -> tuple[float, float, float]:
    """Mean loss over fixed held-out batches, the accuracy at masked positions of the middle (not end-of-span), and the
    share of those positions whose top probability reaches the sampler's commit threshold ("sure").

    For the autoregressive twin: its next-token loss and accuracy at every position (not comparable with the span's).
    """
    was_training = model.training
    model.eval()
    losses, correct, sure, masked = [], 0, 0, 0
    for batch in batches:
        # the span's loss alone, so that span-only and dense runs compare on one scale
        batch = {k: v.to(device) for k, v in batch.items() if k != "next_token_labels"}
        with _autocast(device, bfloat16):
            output = model(**batch)
        losses.append(float(output.loss))
        labels = batch["labels"]  # (B, T)
        at_mask = (batch["input_ids"] == tokens.mask_id) & (labels != IGNORE_INDEX) & (labels != tokens.end_of_span_id)
        if model.config.autoregressive:  # the twin has no masks: its accuracy is next-token accuracy everywhere
            at_mask = labels != IGNORE_INDEX
        correct += int((output.logits.argmax(-1) == labels)[at_mask].sum())
        top = torch.softmax(output.logits[at_mask].float(), dim=-1).amax(dim=-1)
        sure += int((top >= COMMIT_THRESHOLD).sum())
        masked += int(at_mask.sum())
    model.train(was_training)
    return sum(losses) / len(losses), correct / max(masked, 1), sure / max(masked, 1)


def trains_in_bfloat16(device: torch.device, precision: str) -> bool:
    """Whether `precision` ("auto", "float32" or "bfloat16") means bfloat16 arithmetic on `device`.

    auto: yes on a GPU, and on a CPU with bfloat16 arithmetic in hardware (AMX or AVX-512 BF16), where a step of the
    small model takes about 0.6 of its float32 time at the same losses (docs/MODEL.md, "Training in bfloat16")."""
    if precision != "auto":
        return precision == "bfloat16"
    if device.type == "cpu":
        from infill_engine.device import cpu_has_bfloat16

        return cpu_has_bfloat16()
    return True


# oneDNN, which runs bfloat16 matrix products on the CPU, keeps up to 1,024 of them compiled, one per shape, each with
# buffers of its own; training windows come in every length, so few are ever reused and the cache only grows: a
# bfloat16 run's memory reached 12 GB by step 2,900 (dense-11), and 3.9 GB against float32's 2.2 GB after 60 steps,
# which a cap of 8 kept at 2.2 GB at the same tokens per second (docs/MODEL.md, "Training in bfloat16").
ONEDNN_CACHE_CAPACITY = 16
ONEDNN_CACHE_VARIABLE = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"


def cap_onednn_cache() -> None:
    """Cap oneDNN's cache of compiled products for a bfloat16 run on the CPU (a value the user set is kept). oneDNN
    reads the variable once, at its first product: this process's bfloat16 products before the call keep the old cap."""
    os.environ.setdefault(ONEDNN_CACHE_VARIABLE, str(ONEDNN_CACHE_CAPACITY))


# `--compile auto` compiles only a run this long: its compile (about a minute of one core, the first time on a machine)
# is paid back after some 350 steps of the small model (0.85 against 1.04 s a step on one thread, docs/MODEL.md)
COMPILE_MIN_STEPS = 500


def compiles_steps(config: TrainConfig, device: torch.device, steps_left: int) -> bool:
    """Whether the run's steps go through torch.compile (`TrainConfig.compile`): auto compiles on the CPU where a C++
    compiler is there (inductor writes C++) and `COMPILE_MIN_STEPS` steps or more are left."""
    if config.compile != "auto":
        return config.compile == "on"
    has_compiler = any(shutil.which(name) for name in (os.environ.get("CXX", ""), "c++", "g++", "clang++") if name)
    return device.type == "cpu" and has_compiler and steps_left >= COMPILE_MIN_STEPS


def _autocast(device: torch.device, bfloat16: bool) -> contextlib.AbstractContextManager:
    """bfloat16 autocast over the float32 weights where `bfloat16`, else nothing."""
    if bfloat16:
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
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
    checkpoint = usable_checkpoint(config.run_dir)  # a damaged newest one is moved aside for the one before
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
    if config.autoregressive:  # the twin: the same tokenizer plus the FIM sentinels (appended, same ids on resume)
        from infill_engine.training.fim_objective import add_fim_tokens

        tokenizer = add_fim_tokens(tokenizer)
    train_docs = corpus.training_documents(config.extensions)
    eval_docs = corpus.split("eval") or corpus.split("train")
    if config.extensions:
        logger.info("training on the %d of %d training files ending with %s", len(train_docs),
                    len(corpus.split("train")), " or ".join(config.extensions))
    weights = None
    if config.functions:
        train_docs, weights = functions_to_train_on(train_docs, config.function_share)
    (run_dir / "run_config.json").write_text(
        json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()}, indent=2,
                   default=str) + "\n", encoding="utf-8",
    )

    stream = ExampleStream(train_docs, tokenizer, config.objective, config.seed, config.dense, config.autoregressive,
                           weights)
    # held-out windows are laid out as served (one hole), whatever the training layout, so runs compare on one scale
    eval_batches = held_out_batches(eval_docs, tokenizer, config.objective, config.seed, config.batch_size,
                                    config.eval_batches, config.autoregressive)

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
    if config.seq_len > model.config.max_position_embeddings:  # a longer run, from a model or a checkpoint: serving
        logger.info("raising max_position_embeddings to the new seq_len %d", config.seq_len)  # reads this
        model.config.max_position_embeddings = config.seq_len
    if config.autoregressive:
        from infill_engine.training.fim_objective import make_autoregressive

        make_autoregressive(model, tokenizer)
    elif config.dense and not (model.config.shift_logits and model.config.causal_context):
        logger.info("dense supervision: the model now reads its context causally and predicts shifted")
        model.config.shift_logits = model.config.causal_context = True
    model.to(device).train()
    if config.train_layers is not None:
        freeze_lower_layers(model, config.train_layers)
    average = None
    if config.ema:
        average, resumed = load_average(model, checkpoint, config.ema)
        logger.info("weight average (--ema %g): %s", config.ema,
                    f"resumed from {checkpoint.name}" if resumed else "starting from the current weights")
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
    truncate_log(run_dir / LOG_FILE, state.step)
    logger.info(
        "training %s: %d parameters on %s, %d train / %d eval documents, batch %d x %d tokens, steps %d",
        run_dir, count_parameters(model), device, len(train_docs), len(eval_docs), config.batch_size,
        config.seq_len, config.steps,
    )
    if state.step >= config.steps:
        logger.info("%s is already at step %d of %d", run_dir, state.step, config.steps)
        return TrainResult(state.step, "already_done", checkpoint, state.eval_loss, None)
    batches = _batches(config, stream, tokenizer, state.step, device)
    return _loop(config, model, tokenizer, optimizer, scheduler, stream, batches, eval_batches, state, device,
                 started, average)


def _batches(
    config: TrainConfig, stream: ExampleStream, tokenizer: Any, start_step: int, device: torch.device,
) -> Iterator[dict[str, torch.Tensor]]:
    """The training batches: drawn from `stream` in this process, or built by `config.data_workers` processes."""
    if config.data_workers == 0:
        return iter(lambda: stream.batch(config.batch_size), None)
    from infill_engine.training.batch_workers import worker_batches

    return worker_batches(stream.documents, tokenizer, config.objective, config.batch_size, config.seed, start_step,
                          config.dense, config.data_workers, pin_memory=device.type == "cuda", weights=stream.weights)


def train_step(
    model: DiffillForInfilling,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    batch: dict[str, torch.Tensor],
    device: torch.device,
    grad_clip: float,
    next_token_weight: float = 1.0,
    certainty_weight: float = 0.0,
    bfloat16: bool = False,
) -> tuple[float, float]:
    """One optimizer step on a batch (in bfloat16 arithmetic where `bfloat16`); the loss before the step and the
    learning rate it was taken with."""
    with _autocast(device, bfloat16):
        loss = model(**batch, loss_only=True, next_token_weight=next_token_weight,
                     certainty_weight=certainty_weight).loss
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
    batches: Iterator[dict[str, torch.Tensor]],
    eval_batches: list[dict[str, torch.Tensor]],
    state: TrainerState,
    device: torch.device,
    started: float,
    average: WeightAverage | None = None,
) -> TrainResult:
    """Steps until the end of the schedule, the stop step, the time limit or a signal; checkpoint on the way out."""
    from tqdm import tqdm

    log_path = config.run_dir / LOG_FILE
    bfloat16 = trains_in_bfloat16(device, config.precision)
    logger.info("arithmetic: %s (--precision %s)", "bfloat16 autocast" if bfloat16 else "float32", config.precision)
    if bfloat16 and device.type == "cpu":
        cap_onednn_cache()
    compiled = compiles_steps(config, device, config.steps - state.step)
    steps_run = f"compiled, each batch padded to {config.seq_len} positions" if compiled else "eager"
    logger.info("training steps: %s (--compile %s)", steps_run, config.compile)
    step_model = torch.compile(model) if compiled else model  # shares the model's parameters
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
            batch = next(batches)
            batch_tokens = int(batch["attention_mask"].sum())  # counted on the CPU copy: no device sync
            if compiled:  # one shape for every step: no compile again for each window length
                batch = pad_batch(batch, config.seq_len, stream.tokens.pad_id)
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            def step_on(run: Any) -> tuple[float, float]:
                return train_step(run, optimizer, scheduler, batch, device, config.grad_clip,
                                  config.next_token_weight, config.certainty_weight, bfloat16)

            try:
                loss, lr = step_on(step_model)
            except torch._dynamo.exc.TorchDynamoException as error:  # compiling failed, before the optimizer's step:
                if step_model is model:  # the same batch again, eagerly, and every step after it
                    raise
                logger.warning("the compiled training step failed (%s); the run goes on eagerly", error)
                step_model = model
                loss, lr = step_on(model)
            if average is not None:
                average.update(model)
            state.step += 1
            session_tokens += batch_tokens
            state.tokens += batch_tokens
            state.seconds = seconds_before + time.monotonic() - session_start
            tokens_per_second = session_tokens / max(time.monotonic() - session_start, 1e-9)
            window_losses.append(loss)
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_second:.0f}", refresh=False)

            stopped_by = _stop_reason(config, state.step, stop.requested, deadline)
            eval_row: dict[str, str] = {}
            if state.step % config.eval_every == 0 or stopped_by == "steps":
                # held-out losses stay float32 on a CPU, so that every run's compare on one scale
                eval_loss, accuracy, _ = evaluate(model, eval_batches, device, stream.tokens,
                                                  bfloat16 and device.type != "cpu")
                state.eval_loss = eval_loss
                eval_row = {"eval_loss": f"{eval_loss:.4f}", "eval_accuracy": f"{accuracy:.4f}"}
                if average is not None:
                    average_loss, _, _ = evaluate(average.model, eval_batches, device, stream.tokens,
                                                  bfloat16 and device.type != "cpu")
                    eval_row["eval_loss_average"] = f"{average_loss:.4f}"
                logger.info(
                    "step %d: loss %.4f, eval loss %.4f%s, middle-token accuracy at masks %.3f, lr %.2e, %.0f tokens/s",
                    state.step, sum(window_losses) / len(window_losses), eval_loss,
                    f" (the weight average {eval_row['eval_loss_average']})" if average is not None else "",
                    accuracy, lr, tokens_per_second,
                )
            if state.step % config.log_every == 0 or eval_row or stopped_by:
                mean_loss = sum(window_losses) / len(window_losses)
                append_log(log_path, {"step": state.step, "tokens": state.tokens, "loss": f"{mean_loss:.4f}",
                                       "lr": f"{lr:.6g}", "seconds": f"{state.seconds:.1f}", **eval_row})
                window_losses.clear()
            if stopped_by or state.step % config.checkpoint_every == 0:
                state.data_rng = stream.state()
                checkpoint = save_checkpoint(
                    config.run_dir, model, tokenizer, optimizer, scheduler, state, config.keep_checkpoints, average
                )
    tokens_per_second = session_tokens / max(time.monotonic() - session_start, 1e-9)
    logger.info("stopped at step %d (%s); %.0f tokens/s; checkpoint %s", state.step, stopped_by,
                tokens_per_second, checkpoint)
    return TrainResult(state.step, stopped_by, checkpoint, state.eval_loss, tokens_per_second)
