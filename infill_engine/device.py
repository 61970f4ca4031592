"""Choosing the device and dtype a model runs on, at load time."""

from __future__ import annotations

import torch

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
