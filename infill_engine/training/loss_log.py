"""The loss log of a run (`train_log.csv`): one row per few steps, cut back to the checkpoint a run resumes from."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Iterator

LOG_COLUMNS = ("step", "tokens", "loss", "eval_loss", "lr", "seconds", "eval_accuracy", "eval_loss_average")
LOG_FILE = "train_log.csv"


def truncate_log(path: Path, step: int) -> None:
    """Drop log rows written after `step` (by a run that was killed before its next checkpoint)."""
    if not path.is_file():
        return
    with open(path, newline="", encoding="utf-8") as handle:
        rows = [row for row in csv.DictReader(handle) if int(row["step"]) <= step]
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=LOG_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def append_log(path: Path, row: dict[str, Any]) -> None:
    """Append one row to the loss log, writing the header first when the file is new."""
    new = not path.is_file()
    with open(path, "a", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=LOG_COLUMNS)
        if new:
            writer.writeheader()
        writer.writerow(row)


def iter_log(run_dir: Path) -> Iterator[dict[str, str]]:
    """The rows of a run's loss log."""
    path = Path(run_dir) / LOG_FILE
    if path.is_file():
        with open(path, newline="", encoding="utf-8") as handle:
            yield from csv.DictReader(handle)
