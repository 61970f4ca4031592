"""Checkpoints of a training run: written atomically, listed newest last, never read half-written.

A checkpoint is a directory `checkpoints/step-NNNNNNNN` with the model (safetensors shards of at most 16 MB), the
tokenizer and `trainer_state.pt` (optimizer, scheduler, RNG and progress). It is written into
`step-NNNNNNNN.tmp-XXXX`, flushed to disk, and renamed into place with `os.replace`: a run killed at any moment
leaves complete checkpoints and at most a .tmp directory, which is ignored and removed at the next start.
`infill_engine.loading.load_denoiser` loads a checkpoint directory as it is.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)

CHECKPOINT_PATTERN = re.compile(r"^step-(\d{8})$")
TRAINER_STATE = "trainer_state.pt"
MAX_SHARD_SIZE = "16MB"


@dataclass
class TrainerState:
    """What a checkpoint holds besides the weights, to continue exactly where it stopped."""

    step: int = 0
    tokens: int = 0  # real (not padding) tokens trained on
    seconds: float = 0.0  # training wall time over all runs
    data_rng: Any = None  # random.Random state of the example stream
    eval_loss: float | None = None
    preset: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first; .tmp directories of interrupted writes are not listed."""
    directory = Path(run_dir) / "checkpoints"
    if not directory.is_dir():
        return []
    found = []
    for path in directory.iterdir():
        match = CHECKPOINT_PATTERN.match(path.name)
        if match and (path / TRAINER_STATE).is_file() and (path / "config.json").is_file():
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found)]


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run, or None."""
    checkpoints = list_checkpoints(run_dir)
    return checkpoints[-1] if checkpoints else None


def remove_partial_checkpoints(run_dir: Path) -> None:
    """Delete the leftovers of checkpoint writes that were interrupted."""
    directory = Path(run_dir) / "checkpoints"
    if directory.is_dir():
        for path in directory.iterdir():
            if ".tmp-" in path.name:
                logger.warning("removing %s, left by an interrupted checkpoint write", path)
                shutil.rmtree(path, ignore_errors=True)


def save_checkpoint(
    run_dir: Path,
    model: Any,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    state: TrainerState,
    keep: int,
) -> Path:
    """Write a checkpoint atomically (a temporary directory renamed into place) and keep the newest `keep`."""
    directory = Path(run_dir) / "checkpoints"
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"step-{state.step:08d}"
    if final.exists():
        return final  # this step is already saved (a run stopped right after it resumed)
    staging = Path(tempfile.mkdtemp(prefix=f"{final.name}.tmp-", dir=directory))
    model.save_pretrained(staging, max_shard_size=MAX_SHARD_SIZE)
    tokenizer.save_pretrained(staging)
    torch.save(
        {
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            "state": asdict(state),
        },
        staging / TRAINER_STATE,
    )
    summary = {k: v for k, v in asdict(state).items() if k != "data_rng"}
    (staging / "trainer_state.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    _fsync_tree(staging)
    staging.chmod(0o755)  # mkdtemp makes it private; a checkpoint is an ordinary directory
    os.replace(staging, final)
    _fsync_directory(directory)
    for old in list_checkpoints(run_dir)[:-keep]:
        doomed = old.with_name(f"{old.name}.tmp-delete")
        os.replace(old, doomed)  # out of the listing first, so a half-deleted checkpoint is never loaded
        shutil.rmtree(doomed, ignore_errors=True)
    logger.info("checkpoint %s", final)
    return final


def load_trainer_state(checkpoint: Path, device: torch.device) -> dict[str, Any]:
    """The optimizer, scheduler, RNG and progress state saved beside a checkpoint's weights."""
    return torch.load(checkpoint / TRAINER_STATE, map_location=device, weights_only=True)


def _fsync_tree(directory: Path) -> None:
    """Flush every file under `directory` to disk, so that a rename after it publishes complete files."""
    for path in directory.rglob("*"):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
    _fsync_directory(directory)


def _fsync_directory(directory: Path) -> None:
    """Flush a directory's entries (best effort; not every platform allows it)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
