"""Mixed precision on the CPU (`--dtype mixed`): the blocks' matrix products in bfloat16, everything else float32.

A denoising step multiplies a few canvas rows by every weight matrix of the model, so on the CPU it is bound by
reading the weights and by the calls, not by the arithmetic. bfloat16 weights are half the bytes, and on a CPU with
AMX the compiled layers (`compiled_layers.py`) run them through inductor's AMX micro-kernels: the embedded model's
blocks over 13 rows take 0.90 ms instead of 2.59 in float32 (docs/BENCHMARKS.md, "Mixed precision"); with AVX-512 BF16
alone (Zen 4) through oneDNN's bfloat16 products, 1.82 ms instead of 2.72 ("On a CPU without AMX"). Only the
products are rounded: each layer's input is cast to bfloat16 and its output back to float32, and the residual stream,
the norms, the rotary, the attention, the output layer (whose logits the sampler compares: in bfloat16 it cost the
embedded model 0.38 points of pass@1) and the sampler stay float32.

`mix_precision` turns a float32 model's `nn.Linear` layers, all but the output layer, into `BFloat16Linear` in place.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class BFloat16Linear(nn.Module):
    """A linear layer with bfloat16 weights that takes and gives the dtype of its input (float32)."""

    def __init__(self, layer: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = layer.in_features, layer.out_features
        self.weight = nn.Parameter(layer.weight.detach().to(torch.bfloat16), requires_grad=False)
        bias = layer.bias
        self.bias = None if bias is None else nn.Parameter(bias.detach().to(torch.bfloat16), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., in_features) times the weight in bfloat16, in x's dtype."""
        return F.linear(x.to(torch.bfloat16), self.weight, self.bias).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def mixing_refusal(model: nn.Module) -> str | None:
    """Why `mix_precision` cannot take this model (a phrase for errors and `diffill doctor`); None: it can."""
    weight = next(model.parameters(), None)
    if weight is None or weight.dtype != torch.float32 or weight.device.type != "cpu":
        found = "no weights" if weight is None else f"{str(weight.dtype).removeprefix('torch.')} on {weight.device.type}"
        return f"mixed precision needs a float32 model on the CPU (this one has {found})"
    if not _mixed_layers(model):
        return "mixed precision needs nn.Linear layers besides the output layer (this model has none)"
    return None


def _mixed_layers(model: nn.Module) -> list[tuple[nn.Module, str, nn.Linear]]:
    """(parent, attribute, layer) of every nn.Linear that mixed precision rounds: all but the output layer and any
    layer sharing its weight (tied embeddings)."""
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    kept = {id(output.weight)} if output is not None else set()
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if embeddings is not None:
        kept.add(id(embeddings.weight))
    return [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
            if isinstance(child, nn.Linear) and child is not output and id(child.weight) not in kept]


def mix_precision(model: nn.Module) -> int:
    """Give a float32 CPU model's linear layers, all but the output layer, bfloat16 weights (`BFloat16Linear`), in
    place; the layers changed. Raises ValueError where `mixing_refusal` gives a reason."""
    refusal = mixing_refusal(model)
    if refusal is not None:
        raise ValueError(refusal)
    layers = _mixed_layers(model)
    for parent, name, layer in layers:
        setattr(parent, name, BFloat16Linear(layer))
    return len(layers)


def is_mixed(model: nn.Module) -> bool:
    """Whether `mix_precision` has given this model bfloat16 matrix products."""
    return any(isinstance(module, BFloat16Linear) for module in model.modules())
