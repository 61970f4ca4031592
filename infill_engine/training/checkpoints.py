"""Checkpoints of a training run: written atomically, listed newest last, never read half-written.

A checkpoint is a directory `checkpoints/step-NNNNNNNN` with the model (safetensors shards of at most 16 MB), the
tokenizer, `trainer_state.pt` (optimizer, scheduler, RNG and progress) and, in a run with `--ema`, the averaged
weights as a model directory of their own, `average/` (weight_average). It is written into
`step-NNNNNNNN.tmp-XXXX`, flushed to disk, and renamed into place with `os.replace`: a run killed at any moment
leaves complete checkpoints and at most a .tmp directory, which is ignored and removed at the next start. A write
that fails (the disk full, a quota) removes its .tmp directory and publishes nothing, so the previous checkpoint stays
the newest. Each checkpoint lists its files' SHA-256 in `checksums.json`; a resumed run checks them and falls back to
the newest checkpoint that is whole, moving a damaged one aside as `step-NNNNNNNN.corrupt`.
`infill_engine.loading.load_denoiser` loads a checkpoint directory as it is.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
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
CHECKSUMS = "checksums.json"
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (nothing was published; the previous checkpoint is intact)."""
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
    average: Any = None,
) -> Path:
    """Write a checkpoint atomically (a temporary directory renamed into place) and keep the newest `keep`; with
    `average` (a `WeightAverage`), the averaged weights too, as the model directory `average/` inside it."""
    directory = Path(run_dir) / "checkpoints"
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"step-{state.step:08d}"
    if final.exists():
        return final  # this step is already saved (a run stopped right after it resumed)
    staging = Path(tempfile.mkdtemp(prefix=f"{final.name}.tmp-", dir=directory))
    try:
        _write_checkpoint(staging, model, tokenizer, optimizer, scheduler, state, average)
    except BaseException as failure:
        shutil.rmtree(staging, ignore_errors=True)  # nothing half-written is left behind
        if isinstance(failure, OSError) and failure.errno in DISK_FULL:
            previous = latest_checkpoint(run_dir)
            raise CheckpointWriteError(
                failure.errno, f"no room to write checkpoint {final.name} in {directory} ({failure.strerror}); "
                f"nothing was published and {previous.name if previous else 'no earlier checkpoint'} is the newest: "
                "free some space and run the same command again to resume from it"
            ) from failure
        raise
    staging.chmod(0o755)  # mkdtemp makes it private; a checkpoint is an ordinary directory
    os.replace(staging, final)
    _fsync_directory(directory)
    for old in list_checkpoints(run_dir)[:-keep]:
        doomed = old.with_name(f"{old.name}.tmp-delete")
        os.replace(old, doomed)  # out of the listing first, so a half-deleted checkpoint is never loaded
        shutil.rmtree(doomed, ignore_errors=True)
    logger.info("checkpoint %s", final)
    return final


def _write_checkpoint(
    staging: Path,
    model: Any,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    state: TrainerState,
    average: Any = None,
) -> None:
    """Every file of a checkpoint, flushed, in the staging directory, with their checksums last."""
    model.save_pretrained(staging, max_shard_size=MAX_SHARD_SIZE)
    tokenizer.save_pretrained(staging)
    if average is not None:
        average.save(staging, tokenizer, MAX_SHARD_SIZE)
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
    files = sorted(path for path in staging.rglob("*") if path.is_file())
    sums = {path.relative_to(staging).as_posix(): _sha256(path) for path in files}
    (staging / CHECKSUMS).write_text(json.dumps(sums, indent=2) + "\n", encoding="utf-8")
    _fsync_tree(staging)


def checkpoint_problem(checkpoint: Path) -> str | None:
    """Why a checkpoint cannot be resumed from (a missing, truncated or changed file), or None when it is whole."""
    checkpoint = Path(checkpoint)
    sums_file = checkpoint / CHECKSUMS
    if sums_file.is_file():
        try:
            sums = json.loads(sums_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            return f"{CHECKSUMS} is unreadable ({error})"
        for name, expected in sums.items():
            path = checkpoint / name
            if not path.is_file():
                return f"{name} is missing"
            if _sha256(path) != expected:
                return f"{name} is not the file that was written (its checksum differs)"
        return None
    # A checkpoint written before checksums: check what can be checked without them.
    from safetensors import safe_open

    shards = sorted(checkpoint.glob("*.safetensors"))
    if not shards:
        return "it has no weights (*.safetensors)"
    for shard in shards:
        try:
            with safe_open(str(shard), framework="pt"):
                pass
        except Exception as error:  # noqa: BLE001 - safetensors raises its own types for truncated files
            return f"{shard.name} is damaged ({error})"
    try:
        torch.load(checkpoint / TRAINER_STATE, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - torch raises several types for a damaged file
        return f"{TRAINER_STATE} is damaged ({type(error).__name__}: {error})"
    return None


def usable_checkpoint(run_dir: Path) -> Path | None:
    """The newest checkpoint that is whole; damaged newer ones are moved aside (`step-NNNNNNNN.corrupt`) and logged."""
    for checkpoint in reversed(list_checkpoints(run_dir)):
        problem = checkpoint_problem(checkpoint)
        if problem is None:
            return checkpoint
        aside = checkpoint.with_name(f"{checkpoint.name}.corrupt")
        number = 1
        while aside.exists():
            number += 1
            aside = checkpoint.with_name(f"{checkpoint.name}.corrupt{number}")
        os.replace(checkpoint, aside)
        logger.warning("checkpoint %s cannot be resumed from: %s; moved it to %s and trying the one before",
                       checkpoint.name, problem, aside.name)
    return None


def load_trainer_state(checkpoint: Path, device: torch.device) -> dict[str, Any]:
    """The optimizer, scheduler, RNG and progress state saved beside a checkpoint's weights."""
    return torch.load(checkpoint / TRAINER_STATE, map_location=device, weights_only=True)


def _sha256(path: Path) -> str:
    """The SHA-256 of a file, read in 1 MiB pieces."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while piece := handle.read(1 << 20):
            digest.update(piece)
    return digest.hexdigest()


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
