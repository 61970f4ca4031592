"""Training batches built by worker processes, so that a GPU is not kept waiting on one CPU core.

Building an example tokenizes the text around its hole, which takes tens of milliseconds on one core: a single
process feeds a CPU run but starves a GPU. Here each of N `torch.utils.data.DataLoader` workers runs its own
`ExampleStream` with its own seed, derived from the run's seed, the step the run starts at and the worker's number.

The price is exact resumption: a run with workers draws the same batches for the same seed and start step, but a
resumed run does not continue the interrupted run's sequence of batches. Runs without workers keep that guarantee.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterator
from typing import Any

import torch

from infill_engine.training.corpus import Document
from infill_engine.training.example_stream import ExampleStream
from infill_engine.training.objective import ObjectiveConfig

PREFETCH_BATCHES = 4  # per worker


def worker_seed(seed: int, start_step: int, worker: int) -> int:
    """The seed of one worker's example stream: distinct per worker and per (re)start of the run."""
    return (seed * 1_000_003 + start_step) * 1_009 + worker + 1


class _WorkerBatches(torch.utils.data.IterableDataset):
    """An endless stream of collated batches; each worker process draws from its own seeded `ExampleStream`."""

    def __init__(self, documents: list[Document], tokenizer: Any, objective: ObjectiveConfig, batch_size: int,
                 seed: int, start_step: int, dense: bool, weights: list[float] | None) -> None:
        self.documents, self.tokenizer, self.objective = documents, tokenizer, objective
        self.batch_size, self.seed, self.start_step, self.dense = batch_size, seed, start_step, dense
        self.weights = weights

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = torch.utils.data.get_worker_info()
        worker = 0 if info is None else info.id
        stream = ExampleStream(self.documents, self.tokenizer, self.objective,
                               worker_seed(self.seed, self.start_step, worker), self.dense, weights=self.weights)
        while True:
            yield stream.batch(self.batch_size)


def worker_batches(
    documents: list[Document], tokenizer: Any, objective: ObjectiveConfig, batch_size: int, seed: int,
    start_step: int, dense: bool, workers: int, pin_memory: bool, weights: list[float] | None = None,
) -> Iterator[dict[str, torch.Tensor]]:
    """Endless collated batches from `workers` processes (forked where the platform allows: no corpus copying)."""
    if workers < 1:
        raise ValueError(f"worker_batches needs at least one worker (got {workers})")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # each worker tokenizes on its own core
    fork = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
    loader = torch.utils.data.DataLoader(
        _WorkerBatches(documents, tokenizer, objective, batch_size, seed, start_step, dense, weights),
        batch_size=None,  # the dataset yields whole batches
        num_workers=workers,
        prefetch_factor=PREFETCH_BATCHES,
        pin_memory=pin_memory,
        multiprocessing_context=fork,
    )
    return iter(loader)
