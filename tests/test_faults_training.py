"""Faults while training: the disk full during a checkpoint write, and a damaged checkpoint at resume.

docs/RELIABILITY.md ("Faults") lists what the user sees in each case.
"""

from __future__ import annotations

import errno
import logging
from pathlib import Path

import pytest
import torch

from infill_engine.loading import load_denoiser
from infill_engine.training import checkpoints
from infill_engine.training.checkpoints import CheckpointWriteError, checkpoint_problem, list_checkpoints
from infill_engine.training.train import train
from tests.test_training import copy_run, prepared_run, source_dir, tiny_config  # noqa: F401 - fixtures


def leftovers(run_dir: Path) -> list[str]:
    """What the checkpoints directory holds besides complete checkpoints."""
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir()
                  if not checkpoints.CHECKPOINT_PATTERN.match(p.name))


def test_a_full_disk_during_a_checkpoint_keeps_the_previous_one_usable(prepared_run, source_dir, tmp_path,
                                                                        monkeypatch):
    run_dir = copy_run(prepared_run, tmp_path / "run")
    train(tiny_config(run_dir, source_dir, stop_at_step=2))
    real_save = torch.save

    def save_until_the_disk_is_full(obj, path, *args, **kwargs):
        Path(path).write_bytes(b"PK\x03\x04 half of it")  # some bytes reach the disk before ENOSPC
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", save_until_the_disk_is_full)
    with pytest.raises(CheckpointWriteError, match="no room to write checkpoint step-00000004.*step-00000002 is the "
                                                   "newest.*run the same command again"):
        train(tiny_config(run_dir, source_dir, stop_at_step=4))
    monkeypatch.setattr(torch, "save", real_save)

    assert [p.name for p in list_checkpoints(run_dir)] == ["step-00000002"]
    assert leftovers(run_dir) == []  # the half-written checkpoint was removed, not left for the next run
    assert checkpoint_problem(run_dir / "checkpoints" / "step-00000002") is None
    assert load_denoiser(run_dir / "checkpoints" / "step-00000002").family == "diffill"
    resumed = train(tiny_config(run_dir, source_dir, stop_at_step=4))  # space again: the run goes on from step 2
    assert resumed.step == 4 and resumed.stopped_by == "stop_at_step"


def test_a_damaged_newest_checkpoint_is_set_aside_and_training_resumes_from_the_one_before(
        prepared_run, source_dir, tmp_path, caplog):
    run_dir = copy_run(prepared_run, tmp_path / "run")
    train(tiny_config(run_dir, source_dir, stop_at_step=4))
    newest = run_dir / "checkpoints" / "step-00000004"
    weights = newest / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte inside a tensor: the file still parses
    weights.write_bytes(bytes(data))
    assert "checksum" in checkpoint_problem(newest)

    with caplog.at_level(logging.INFO, logger="infill_engine.training"):
        result = train(tiny_config(run_dir, source_dir, stop_at_step=6))

    assert result.step == 6
    assert "resuming" in caplog.text and "step-00000002 at step 2" in caplog.text
    assert "step-00000004 cannot be resumed from" in caplog.text
    assert (run_dir / "checkpoints" / "step-00000004.corrupt").is_dir()  # kept for a look, never loaded again
    assert [p.name for p in list_checkpoints(run_dir)][-1] == "step-00000006"


def test_a_truncated_checkpoint_without_checksums_is_found_too(prepared_run, source_dir, tmp_path):
    run_dir = copy_run(prepared_run, tmp_path / "run")
    train(tiny_config(run_dir, source_dir, stop_at_step=2))
    checkpoint = run_dir / "checkpoints" / "step-00000002"
    (checkpoint / checkpoints.CHECKSUMS).unlink()  # as written before checksums existed
    assert checkpoint_problem(checkpoint) is None
    state = checkpoint / checkpoints.TRAINER_STATE
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])  # half-written
    assert "trainer_state.pt is damaged" in checkpoint_problem(checkpoint)
    weights = checkpoint / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    assert "model.safetensors is damaged" in checkpoint_problem(checkpoint)
    assert checkpoints.usable_checkpoint(run_dir) is None
    with pytest.raises(ValueError, match="no complete checkpoint"):
        train(tiny_config(run_dir, source_dir, resume=True))
