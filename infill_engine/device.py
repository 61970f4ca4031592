"""Choosing the device and dtype a model runs on, at load time, and the CPU threads a small pass runs on."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from infill_engine.catalogue import GIB
from infill_engine.fit import HEADROOM, ram_gib
from infill_engine.loading import StoredWeights

# Canvas positions (all rows of a pass together) up to which one CPU thread runs a denoising step faster than two:
# the step's matrices are then a few rows high and splitting them costs more than it saves (docs/BENCHMARKS.md,
# "One thread for small steps": 24 positions 20 ms on one thread, 23 ms on two; 48 the same; 256 positions 98-108
# ms vs 65-79).
SMALL_PASS_POSITIONS = 32

DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPES = ("auto", "float32", "bfloat16", "float16", "mixed")  # mixed: float32, the blocks' products in bfloat16

# From this many parameters up a checkpoint is large: on the CPU, `auto` then picks its dtype by the CPU and the RAM.
# Below it, float32: a small model is fast in float32 and its memory does not matter, and the embedded model lost
# 0.48 points of pass@1 in bfloat16 (docs/BENCHMARKS.md, "Against one token per step").
LARGE_MODEL_PARAMETERS = 100_000_000
BFLOAT16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo flags of bfloat16 arithmetic in hardware
AMX_CPU_FLAG = "amx_bf16"  # bfloat16 matrix tiles: what the compiled layers' micro-kernels use (mixed_precision.py)


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> list[str]:
    """This CPU's feature flags as Linux lists them; none where it cannot tell (not Linux)."""
    try:
        text = Path(cpuinfo).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])


def cpu_has_bfloat16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU does bfloat16 arithmetic in hardware (AMX or AVX-512 BF16); False where it cannot tell."""
    return any(flag in cpu_flags(cpuinfo) for flag in BFLOAT16_CPU_FLAGS)


def cpu_has_amx(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU multiplies bfloat16 matrices in AMX tiles; False where it cannot tell."""
    return AMX_CPU_FLAG in cpu_flags(cpuinfo)


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


def choose_dtype(device: torch.device, requested: str = "auto", weights: StoredWeights | None = None) -> torch.dtype:
    """The dtype the weights load in for `dtype_choice`'s pick, the layers not compiled."""
    return torch_dtype(dtype_choice(device, requested, weights)[0])


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype a model of this DTYPES name (not auto) loads in."""
    return torch.float32 if name == "mixed" else getattr(torch, name)


def dtype_choice(device: torch.device, requested: str = "auto", weights: StoredWeights | None = None,
                 compiled: bool = False) -> tuple[str, str]:
    """What was asked, or for `auto`: bfloat16 on a GPU that supports it, and on the CPU as `cpu_dtype` says (with
    `compiled`: for a model whose layers are compiled where a package is cached); a name of DTYPES and why (a phrase
    for `diffill doctor`)."""
    if requested not in DTYPES:
        raise ValueError(f"unknown dtype {requested!r}; allowed: {', '.join(DTYPES)}")
    if requested == "mixed" and device.type != "cpu":
        raise ValueError(f"dtype 'mixed' (float32 with bfloat16 matrix products) is for the CPU, not {device.type}; "
                         "there use auto or bfloat16")
    if requested != "auto":
        return requested, "asked for"
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return "bfloat16", "auto: a GPU with bfloat16"
        return "float16", "auto: a GPU without bfloat16"
    if device.type != "cpu":
        return "float32", f"auto: float32 on {device.type}"
    bfloat16_hardware = cpu_has_bfloat16()
    name, why = cpu_dtype(weights, bfloat16_hardware, ram_gib(), compiled and bfloat16_hardware)
    return name, f"auto: {why}"


def cpu_dtype(weights: StoredWeights | None, bfloat16_hardware: bool, ram: float,
              compiled_with_bfloat16: bool = False) -> tuple[str, str]:
    """The dtype `auto` picks on the CPU for these weights (None: unknown, taken as small) and `ram` GiB, and why.

    A small model runs in float32; where its layers are compiled (`compiled_layers.py`) on a CPU with bfloat16
    arithmetic (`compiled_with_bfloat16`: AMX or AVX-512 BF16), with its blocks' matrix products in bfloat16 (mixed):
    the compiled layers multiply them faster (AMX: 2.9x; AVX-512 BF16: 1.5x), at no cost in pass@1 (eagerly mixed
    precision is no faster for a single line: docs/BENCHMARKS.md, "Mixed precision"). A large
    one runs in bfloat16 when it is stored so and the CPU has bfloat16 arithmetic (half the memory and faster, in the
    precision it was trained in); otherwise in float32 when that copy fits the RAM (a CPU without bfloat16 arithmetic
    runs float32 faster), and in bfloat16 when only that fits."""
    if weights is None:
        return "float32", "weights not read: float32 on the CPU"
    if weights.parameters < LARGE_MODEL_PARAMETERS:
        small = f"a small model ({weights.parameters / 1e6:.1f}M parameters)"
        if compiled_with_bfloat16:
            return "mixed", f"{small}, its layers compiled for a CPU with bfloat16 arithmetic: float32, the " \
                            "blocks' matrix products in bfloat16"
        return "float32", f"{small}: float32 on the CPU"
    size = f"{weights.parameters / 1e9:.2f}B parameters stored in {weights.dtype}"
    if weights.dtype == "BF16" and bfloat16_hardware:
        return "bfloat16", f"{size}, and this CPU has bfloat16 arithmetic"
    float32_gib = 4 * weights.parameters / GIB
    if float32_gib <= HEADROOM * ram:
        hardware = "" if bfloat16_hardware else ", on a CPU without bfloat16 arithmetic"
        return "float32", f"{size}{hardware}: float32 ({float32_gib:.1f} GiB) fits the RAM ({ram:.1f} GiB)"
    return "bfloat16", f"{size}: float32 ({float32_gib:.1f} GiB) does not fit the RAM ({ram:.1f} GiB)"


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
