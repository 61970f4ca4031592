"""Choosing the device and dtype a model runs on, at load time, and the CPU threads a small pass runs on."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

# Canvas positions (all rows of a pass together) up to which one CPU thread runs a denoising step faster than two:
# the step's matrices are then a few rows high and splitting them costs more than it saves (docs/BENCHMARKS.md,
# "One thread for small steps": 24 positions 20 ms on one thread, 23 ms on two; 48 the same; 256 positions 98-108
# ms vs 65-79).
SMALL_PASS_POSITIONS = 32

DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPES = ("auto", "float32", "bfloat16", "float16")


def choose_device(requested: str = "auto") -> torch.device:
    """CUDA when present (or asked for), else CPU; `requested` is one of DEVICES or a torch device string."""
    if requested == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("cpu")
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {requested!r} was requested but CUDA is not available here; use 'auto' or 'cpu'")
    if requested == "mps" and not torch.backends.mps.is_available():
        raise ValueError("device 'mps' was requested but MPS is not available here; use 'auto' or 'cpu'")
    try:
        return torch.device(requested)
    except RuntimeError as error:
        raise ValueError(f"unknown device {requested!r}; allowed: {', '.join(DEVICES)} or e.g. 'cuda:1'") from error


def choose_dtype(device: torch.device, requested: str = "auto") -> torch.dtype:
    """bfloat16 on a GPU that supports it, float32 on CPU (faster there for small models), or what was asked."""
    if requested not in DTYPES:
        raise ValueError(f"unknown dtype {requested!r}; allowed: {', '.join(DTYPES)}")
    if requested != "auto":
        return getattr(torch, requested)
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


@contextmanager
def threads_for_pass(device: torch.device, positions: int) -> Iterator[None]:
    """Run a pass over `positions` canvas positions on one CPU thread when it is small (see SMALL_PASS_POSITIONS),
    on the configured threads otherwise; the count is set back after."""
    configured = torch.get_num_threads()
    if device.type != "cpu" or configured == 1 or positions > SMALL_PASS_POSITIONS:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(configured)
