"""Linear layers whose float32 CPU weights are kept in MKL's packed GEMM layout too (issue 12).

A denoising step multiplies a few rows (the canvas positions still open, 2-24, or the whole canvas) by every weight
matrix of the model. At so few rows MKL's plain `sgemm` spends much of each call laying the weight out for its
kernel; `sgemm_pack` does that once at load time and `sgemm_compute` runs the kernel on the packed copy. The
embedded model's 25 matmuls in a row take 2.35 ms plain against 1.50 packed at 8 rows and 3.19 against 2.59 at 24,
but 1.1 against 1.3-1.4 at 1-3 rows and 18.0 against 19.9 at 256; yet in a fill the packed product at every row count
is the fastest (a step 6-9 % cheaper, a whole fill 2.5-6 %), and packed only where it wins alone is no faster than
plain: a layer that takes both products reads two copies of its weight, twice the memory traffic the step is bound
by (docs/BENCHMARKS.md, "MKL-packed weights"). So a packed layer always takes the packed product where it can.

`pack_linear_weights` turns a model's `nn.Linear` layers into `PackedLinear` in place (the same objects, the same
weight `Parameter`s, so tied weights stay tied and the state dict is unchanged). A layer runs its packed copy only
where that gives the same product: on the CPU, in float32, without autograd, and while its weight is the tensor it
packed (the same storage, no in-place change since; otherwise it packs the new one first); anywhere else, and where
this PyTorch build has no MKL, it is an ordinary `nn.Linear`. The packed copy costs about the weights' size again in
memory, so models whose Linear weights exceed `MAX_PACKED_BYTES` are left as they are (a large checkpoint runs in
bfloat16 on the CPU anyway, which is not packed).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

# Linear weights (float32 bytes, all layers together) up to which a model's layers are packed. The embedded model has
# 27 MB; a 0.5B checkpoint in float32 2 GB, which would double its memory for a gain measured only on small models.
MAX_PACKED_BYTES = 512 * 2**20
PACK_ROWS_HINT = 24  # the rows MKL is told to expect when it packs (a single-line canvas); any row count runs


@dataclass(frozen=True)
class _Packed:
    """A weight in MKL's packed layout, and what identifies the weight it was packed from."""

    tensor: torch.Tensor  # opaque (an mkldnn tensor): only `torch.ops.mkl._mkl_linear` reads it
    data_ptr: int
    version: int

    def __deepcopy__(self, memo: dict[int, Any]) -> None:
        """A copied layer packs its own (copied) weight again when it first runs."""
        return None


def mkl_packing_available() -> bool:
    """Whether this PyTorch build can pack weights for MKL's sgemm (MKL present and the private ops registered)."""
    mkl_ops = getattr(torch.ops, "mkl", None)
    try:
        return bool(torch.backends.mkl.is_available() and mkl_ops is not None and hasattr(mkl_ops, "_mkl_linear")
                    and hasattr(mkl_ops, "_mkl_reorder_linear_weight"))
    except (AttributeError, RuntimeError):
        return False


@functools.cache
def _ensure_flop_formula() -> None:
    """Let torch's FlopCounterMode (`diffill bench fill`'s GFLOP/s) count the packed product as the matmul it is."""
    from torch.utils.flop_counter import register_flop_formula

    @register_flop_formula(torch.ops.mkl._mkl_linear)
    def packed_linear_flops(x_shape: Any, packed_shape: Any, weight_shape: Any, *args: Any, **kwargs: Any) -> int:
        rows = math.prod(x_shape[:-1])
        return 2 * rows * x_shape[-1] * weight_shape[0]


def _packable(weight: torch.Tensor) -> bool:
    """Whether a weight can take the packed path: a dense float32 CPU matrix."""
    return weight.device.type == "cpu" and weight.dtype == torch.float32 and weight.layout == torch.strided \
        and weight.dim() == 2


class PackedLinear(nn.Linear):
    """`nn.Linear` that multiplies with an MKL-packed copy of its weight where that gives the same product."""

    _packed: _Packed | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out)
        """The layer's output, through the packed weight when it is current and the call is float32 CPU inference."""
        packed = self._current_pack(x)
        if packed is None:
            return F.linear(x, self.weight, self.bias)
        rows = x.numel() // self.in_features
        # the op takes the packed path only when the rows equal its last argument: it always does here
        return torch.ops.mkl._mkl_linear(x, packed, self.weight, self.bias, rows)

    def pack(self) -> bool:
        """Pack the current weight for MKL; False (and the layer stays plain) where it cannot be packed."""
        weight = self.weight
        self._packed = None
        if not _packable(weight) or not mkl_packing_available():
            return False
        with torch.no_grad():
            tensor = torch.ops.mkl._mkl_reorder_linear_weight(weight.detach(), PACK_ROWS_HINT)
        self._packed = _Packed(tensor, weight.data_ptr(), weight._version)
        return True

    def _current_pack(self, x: torch.Tensor) -> torch.Tensor | None:
        """The packed weight to multiply `x` with, repacked if the weight changed; None: the plain product."""
        if torch.is_grad_enabled() or x.dtype != torch.float32 or x.device.type != "cpu" or x.numel() == 0:
            return None
        packed, weight = self._packed, self.weight
        if packed is None or packed.data_ptr != weight.data_ptr() or packed.version != weight._version:
            if not _packable(weight) or not self.pack():  # a copied, reloaded or updated weight: pack it again
                return None
            packed = self._packed
        if self.bias is not None and (self.bias.dtype != torch.float32 or self.bias.device.type != "cpu"):
            return None
        return packed.tensor if packed is not None else None


def packing_refusal(model: nn.Module, max_bytes: int = MAX_PACKED_BYTES) -> str | None:
    """Why `pack_linear_weights` leaves this model's layers plain (a phrase for `diffill doctor`); None: it packs."""
    weights = {id(m.weight): m.weight for m in model.modules() if type(m) in (nn.Linear, PackedLinear)}
    if not weights:
        return "the model has no nn.Linear layers"
    if not mkl_packing_available():
        return "this PyTorch build has no MKL packed sgemm"
    unpackable = next((w for w in weights.values() if not _packable(w)), None)
    if unpackable is not None:
        return f"packing needs float32 weights on the CPU (these are {str(unpackable.dtype).removeprefix('torch.')} " \
               f"on {unpackable.device.type})"
    size = sum(weight.numel() * weight.element_size() for weight in weights.values())
    if size > max_bytes:
        return f"its Linear weights ({size / 2**20:,.0f} MiB) exceed the {max_bytes / 2**20:,.0f} MiB packed"
    return None


def pack_linear_weights(model: nn.Module, max_bytes: int = MAX_PACKED_BYTES) -> int:
    """Make every `nn.Linear` of a float32 CPU model a `PackedLinear` with its weight packed; the layers packed.

    Nothing changes (0) where `packing_refusal` gives a reason: MKL packing unavailable, the model not float32 on the
    CPU, or its Linear weights over `max_bytes`.
    """
    if packing_refusal(model, max_bytes) is not None:
        return 0
    _ensure_flop_formula()
    layers = [module for module in model.modules() if type(module) in (nn.Linear, PackedLinear)]
    for layer in layers:
        layer.__class__ = PackedLinear
        layer.pack()
    return len(layers)


def unpack_linear_weights(model: nn.Module) -> int:
    """Make a model's `PackedLinear` layers plain `nn.Linear` again (dropping the packed copies); the layers changed."""
    layers = [module for module in model.modules() if type(module) is PackedLinear]
    for layer in layers:
        layer.__dict__.pop("_packed", None)
        layer.__class__ = nn.Linear
    return len(layers)


def packed_layers(model: nn.Module) -> int:
    """How many of a model's layers hold a packed weight now."""
    return sum(1 for module in model.modules() if isinstance(module, PackedLinear) and module._packed is not None)
