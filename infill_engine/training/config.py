"""The configuration of a training run: model-size presets and the settings a run is told (`TrainConfig`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

from infill_engine.training.objective import ObjectiveConfig


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
    # the size sweep's smaller and larger points beside `small` (docs/MODEL.md, "Model size"): about 3.3M and 12M
    "mini": Preset(dict(hidden_size=192, num_hidden_layers=4, num_attention_heads=3, intermediate_size=512),
                   vocab_size=8192, batch_size=16, seq_len=256, lr=1e-3, steps=20_000),
    "medium": Preset(dict(hidden_size=320, num_hidden_layers=8, num_attention_heads=5, intermediate_size=832),
                     vocab_size=8192, batch_size=16, seq_len=256, lr=1e-3, steps=20_000),
    # for a GPU (about 24M parameters): still small enough to denoise on a laptop CPU
    "base": Preset(dict(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, intermediate_size=1024),
                   vocab_size=8192, batch_size=64, seq_len=512, lr=6e-4, steps=50_000),
    # for one H200 in about 8 minutes (gpu_run): about 20.8M parameters with 8,192 tokens, 42 MB in bfloat16, so
    # it ships under the 50 MB cap and denoises on a laptop CPU; `steps` is replaced by gpu_run's time-fitted count
    "gpu": Preset(dict(hidden_size=384, num_hidden_layers=10, num_attention_heads=6, intermediate_size=1024),
                  vocab_size=8192, batch_size=64, seq_len=512, lr=1e-3, steps=4_000),
}


PRECISIONS = ("auto", "float32", "bfloat16")  # TrainConfig.precision
COMPILES = ("auto", "on", "off")  # TrainConfig.compile


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
    # the forward and backward's arithmetic: float32, bfloat16 (autocast over float32 weights and optimizer state),
    # or auto: bfloat16 on a GPU and on a CPU with bfloat16 arithmetic in hardware, float32 elsewhere
    precision: str = "auto"
    # the training forward and backward through torch.compile, batches padded to seq_len: on, off, or auto: on for a
    # run on the CPU with a C++ compiler and at least COMPILE_MIN_STEPS steps to go (its compile takes about a minute)
    compile: str = "auto"
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
    # an exponential moving average of the weights with this decay, kept beside them and saved in each checkpoint as
    # the model directory average/ (weight_average); 0: none
    ema: float = 0.0
    keep_checkpoints: int = 2
    num_threads: int = 2  # CPU threads for torch
    train_layers: int | None = None  # train only the top N blocks (+ embedding and final norm); None: all
    progress: bool = True  # the progress bar on stderr
    # processes building batches (see batch_workers); 0: in the training process, which a resume replays exactly
    data_workers: int = 0
    objective: ObjectiveConfig | None = None  # None: ObjectiveConfig() with this run's seq_len
    # Dense supervision: the context is read causally and every context position also learns its next token
    dense: bool = False
    next_token_weight: float = 1.0  # with dense: the next-token loss's weight beside the span's loss
    holes: int = 1  # holes per training window at most (each window draws 1..holes); 1: one hole, as served
    # Certainty forcing (dParallel): this times the entropy of the span predictions that are already right
    certainty_weight: float = 0.0
    # the loss weight of each span's first end-of-span position, times this (ObjectiveConfig.end_weight)
    end_weight: float = 1.0
    # The autoregressive twin (fim_objective): causal attention, prefix-suffix-middle sequences, next-token loss
    autoregressive: bool = False
    # train only on the corpus files whose names end so (e.g. (".py",)); (): every file. The held-out batches keep
    # every file, so that the run's held-out loss stays on the scale of every other run's
    extensions: tuple[str, ...] = ()
    # share of holes that are a line or the rest of one (ObjectiveConfig.line_prob); the rest keeps the default
    # split between blocks and token runs (3 to 2). None: the objective's default (0.5)
    line_share: float | None = None
    # train on the corpus's documented top-level Python functions, each after the imports it uses, as HumanEval's
    # problems are laid out (function_documents), instead of on whole files
    functions: bool = False
    # with functions: the share of the examples drawn from the function documents; the whole files give the rest
    function_share: float = 1.0

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
        if not isinstance(self.data_workers, int) or self.data_workers < 0:
            raise ValueError(f"data_workers must be an integer >= 0 (got {self.data_workers!r})")
        if self.lr is not None and not self.lr > 0:
            raise ValueError(f"lr must be positive (got {self.lr})")
        if self.time_limit_minutes is not None and not self.time_limit_minutes > 0:
            raise ValueError(f"time limit must be a positive number of minutes (got {self.time_limit_minutes})")
        if not (isinstance(self.certainty_weight, (int, float)) and 0 <= self.certainty_weight < math.inf):
            raise ValueError(f"certainty weight must be a number >= 0 (got {self.certainty_weight!r})")
        if not (isinstance(self.ema, (int, float)) and 0 <= self.ema < 1):
            raise ValueError(f"the weight average's decay (--ema) must be 0 (none) or a number between 0 and 1, "
                             f"such as 0.998 (got {self.ema!r})")
        if not (isinstance(self.end_weight, (int, float)) and 0 < self.end_weight < math.inf):
            raise ValueError(f"end weight must be a positive number (got {self.end_weight!r})")
        if self.autoregressive and (self.dense or self.holes > 1 or self.data_workers or self.certainty_weight
                                    or self.end_weight != 1.0):
            raise ValueError("--autoregressive trains the twin's own objective: it takes no --dense, --holes, "
                             "--certainty-weight, --end-weight or --data-workers")
        for extension in self.extensions:
            if not (isinstance(extension, str) and extension.startswith(".") and len(extension) > 1):
                raise ValueError(f"an extension is a file name ending that starts with a dot, such as .py "
                                 f"(got {extension!r})")
        if self.line_share is not None and not (isinstance(self.line_share, (int, float))
                                                and 0 <= self.line_share <= 1):
            raise ValueError(f"line share must be a number in [0, 1] (got {self.line_share!r})")
        if self.autoregressive and self.line_share is not None:
            raise ValueError("--line-share is the diffusion objective's; the twin (--autoregressive) takes none")
        if not (isinstance(self.function_share, (int, float)) and 0 < self.function_share <= 1):
            raise ValueError(f"function share must be a number in (0, 1] (got {self.function_share!r})")
        if self.function_share != 1 and not self.functions:
            raise ValueError("--function-share is the share of --functions' documents: give --functions too")
        if self.precision not in PRECISIONS:
            raise ValueError(f"unknown precision {self.precision!r}; allowed: {', '.join(PRECISIONS)}")
        if self.compile not in COMPILES:
            raise ValueError(f"unknown compile setting {self.compile!r}; allowed: {', '.join(COMPILES)}")
        if not self.use_stdlib and not self.sources:
            raise ValueError("no training data: give --source DIR, or leave the standard library in")

    def resolved(self) -> "TrainConfig":
        """This config with the preset's values filled in where it has None."""
        preset = PRESETS[self.preset]
        seq_len = self.seq_len or preset.seq_len
        steps = self.steps or preset.steps
        objective = self.objective or ObjectiveConfig(seq_len=seq_len, max_span_tokens=min(64, seq_len // 2),
                                                      holes=self.holes, end_weight=self.end_weight)
        if self.objective is None and self.line_share is not None:
            objective = with_line_share(objective, self.line_share)
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


def with_line_share(objective: ObjectiveConfig, line_share: float) -> ObjectiveConfig:
    """`objective` with `line_share` of its holes lines, the rest split between blocks and token runs as before."""
    rest = 1.0 - objective.line_prob
    block_part = objective.block_prob / rest if rest > 0 else 0.6
    return replace(objective, line_prob=line_share, block_prob=(1.0 - line_share) * block_part)
