"""The output layer and its cross-entropy together, a chunk of positions at a time (training's loss).

A training step of the embedded model projects some 3,300 context positions (dense next-token supervision) and a few
hundred span positions onto the 8,192-entry vocabulary. Done whole, that is a (3,300 x 8,192) tensor of logits in
bfloat16, its float32 copy, its log-softmax, and the same again backwards: some 130 MB each, each pass over them a trip
to memory, and the log-softmax alone took 13 % of a compiled step. `output_cross_entropy` walks the positions in
chunks of `CHUNK` whose logits stay in the cache: each chunk's logits, its losses, and at once its gradients (softmax
minus the one-hot target), which it multiplies back into the gradients of the hidden states and of the output weight.
The loss is a weighted sum, so the gradients are known in the forward pass; backward only scales them.

The products run in the autocast dtype where autocast is on (bfloat16 on the CPU, as the unchunked loss's layer does),
the softmax in float32. Where no gradient is wanted (evaluation), only the losses are computed.
"""

from __future__ import annotations

from typing import Any

import torch

CHUNK = 256  # positions whose logits (8,192 each, float32: 8 MB) are held at once; 128 and 512 were slower


def output_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.LongTensor,
                         token_weights: torch.Tensor | None = None) -> torch.Tensor:
    """Sum over positions of weight_i x cross-entropy(hidden_i . weight^T, target_i): hidden (L, E), weight (V, E),
    targets (L,) (no ignored entries), token_weights (L,) or None (all 1); a float32 scalar with gradients. Its sizes
    change every batch, so it is called outside compiled graphs (`DiffillForInfilling._labelled_loss`)."""
    device = hidden.device.type
    if torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
    else:
        dtype = torch.promote_types(hidden.dtype, weight.dtype)
    with torch.autocast(device, enabled=False):  # the products' dtype is chosen above, explicitly
        return _OutputCrossEntropy.apply(hidden, weight, targets, token_weights, dtype)


class _OutputCrossEntropy(torch.autograd.Function):
    """The weighted sum of cross-entropies, whose forward pass also finds the gradients (see the module)."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.LongTensor,
                token_weights: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        for_hidden, for_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]  # a frozen output layer: no grad
        wanted = for_hidden or for_weight
        grad_hidden = torch.zeros_like(hidden) if for_hidden else None  # (L, E)
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if for_weight else None
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        projection = weight.to(dtype)  # (V, E)
        for start in range(0, hidden.shape[0], CHUNK):
            rows = slice(start, start + CHUNK)
            inputs, chosen = hidden[rows].to(dtype), targets[rows]  # (c, E), (c,)
            logits = (inputs @ projection.T).float()  # (c, V)
            picked = logits.gather(-1, chosen[:, None]).squeeze(-1)  # (c,) the targets' logits
            largest = logits.amax(dim=-1, keepdim=True)  # (c, 1)
            exponentials = logits.sub_(largest).exp_()  # (c, V) in place of the logits: one pass for both uses
            sums = exponentials.sum(dim=-1)  # (c,)
            losses = largest.squeeze(-1) + sums.log() - picked  # (c,) log-sum-exp minus the target's logit
            scale = None if token_weights is None else token_weights[rows].float()  # (c,)
            total += losses.sum() if scale is None else (losses * scale).sum()
            if not wanted:
                continue
            gradient = exponentials.div_(sums[:, None])  # (c, V) the softmax
            gradient[torch.arange(chosen.shape[0], device=chosen.device), chosen] -= 1.0
            if scale is not None:
                gradient *= scale[:, None]
            gradient = gradient.to(dtype)
            if grad_hidden is not None:
                grad_hidden[rows] = (gradient @ projection).to(hidden.dtype)
            if grad_weight is not None:
                grad_weight += (gradient.T @ inputs).float()
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.weight_dtype = weight.dtype
        return total

    @staticmethod
    def backward(ctx: Any, grad_total: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grad_hidden, grad_weight = ctx.saved_tensors
        return (None if grad_hidden is None else grad_hidden * grad_total.to(grad_hidden.dtype),
                None if grad_weight is None else (grad_weight * grad_total).to(ctx.weight_dtype), None, None, None)
