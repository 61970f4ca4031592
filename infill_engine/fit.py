"""Whether a catalogued model fits this machine, judged before anything is downloaded (`diffill doctor --model ID`).

The need is the weights' size computed from the parameter count (2 bytes a parameter at bf16, 1 at int8, and on
the CPU the dtype `--dtype auto` would pick there, `device.cpu_dtype`: 4 bytes where it picks float32); the room is
the GPU's memory when there is one, else the RAM, less a tenth for activations, the context and the rest of the
machine. A catalogued model is taken as stored in bfloat16, as the catalogued checkpoints are published. A rule of
thumb, not a measurement: say so wherever it is shown.
"""

from __future__ import annotations

import os
from typing import Any

from infill_engine.catalogue import GIB, CatalogueModel

HEADROOM = 0.9  # the share of a memory the weights may take


def ram_gib() -> float:
    """This machine's physical memory in GiB."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB


def gpu_gib() -> float | None:
    """The first CUDA device's total memory in GiB; None without one (imports torch)."""
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_properties(0).total_memory / GIB


def fit_verdict(
    model: CatalogueModel, ram: float, gpu: float | None, bfloat16_hardware: bool | None = None
) -> dict[str, Any]:
    """A doctor section: the sizes, the memories, and whether (and where) the model fits; `ok` is False when not.

    `bfloat16_hardware`: whether this CPU does bfloat16 arithmetic (None: read from /proc/cpuinfo), which decides
    the dtype the CPU would run it in."""
    from infill_engine.device import cpu_dtype, cpu_has_bfloat16  # imports torch, as gpu_gib does
    from infill_engine.loading import StoredWeights

    bf16, int8 = model.memory_gib(2), model.memory_gib(1)
    section: dict[str, Any] = {
        "ok": True, "model": model.hub_id, "bf16 GiB": _round(bf16), "int8 GiB": _round(int8),
        "RAM GiB": round(ram, 1), "GPU GiB": _round(gpu), "note": "weights only, computed from the parameter count",
    }
    if bf16 is None or int8 is None or model.parameters is None:
        section["verdict"] = "unknown: the parameter count is unconfirmed"
        return section
    hardware = cpu_has_bfloat16() if bfloat16_hardware is None else bfloat16_hardware
    cpu_name, why = cpu_dtype(StoredWeights(round(model.parameters * 1e9), "BF16"), hardware, ram)
    cpu_label = "bf16" if cpu_name == "bfloat16" else cpu_name
    cpu_need = model.memory_gib(4 if cpu_name == "float32" else 2)
    section.update({"CPU dtype": cpu_name, "CPU GiB": _round(cpu_need), "CPU dtype because": why})
    on_cpu = f"at {cpu_label} ({cpu_need:.1f} GiB) it runs on the CPU"
    if gpu is not None and bf16 <= gpu * HEADROOM:
        section["verdict"] = "fits the GPU at bf16"
    elif gpu is not None and int8 <= gpu * HEADROOM:
        section["verdict"] = f"fits the GPU only at int8, which diffill does not load yet; {on_cpu}"
        section["ok"] = cpu_need <= ram * HEADROOM
    elif cpu_need <= ram * HEADROOM:
        section["verdict"] = f"fits in RAM at {cpu_label}: runs on the CPU" + (" (no GPU here)" if gpu is None else "")
    else:
        section["verdict"] = f"does not fit: {bf16:.1f} GiB at bf16 ({int8:.1f} at int8) on a machine with " \
                             f"{ram:.1f} GiB RAM" + ("" if gpu is None else f" and a {gpu:.1f} GiB GPU")
        section["ok"] = False
    return section


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)
