"""The embedded masked-diffusion infilling transformer, whose context is encoded once per request.

A request is a context (prefix and suffix tokens) and a canvas of N tokens that fills the hole between them; every
token carries an explicit position id (prefix 0..P-1, canvas P..P+N-1, suffix P+N..P+N+S-1), so the context can be
passed in any order. The attention rule:

- context tokens attend bidirectionally to all context tokens and never to canvas tokens;
- canvas tokens attend to all context tokens and to all canvas tokens;
- nobody attends a padding token.

Because the context never sees the canvas, its per-layer keys and values do not change while the canvas is denoised.
`encode_context` computes them once; each `denoise` step then runs the layers over the canvas positions only, the
canvas queries attending to the cached context keys followed by the canvas keys. This is exact, not an approximate
cache. What the steps of a fill share (the canvas's rotary angles, the attention mask, per layer a keys/values buffer
with the context's in its head and room for the canvas's) is computed once per fill by `plan_denoising`; each
`denoise_planned` step writes the canvas's keys and values into the buffers' tails. `forward` applies the same rule to a whole sequence in one pass, for training, and gives the same logits.

A step may also run the layers over some canvas positions only (`rows`): the others are attended with the keys and
values the plan's last pass wrote for them. That is exact while their tokens and the canvas are unchanged, and an
approximation otherwise (the sampler's `canvas_refresh` decides when it is used).

Shapes: B batch, T sequence, C context length, N canvas length, E hidden width, H heads, D head size, V vocabulary.
"""

import logging
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel, initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import MaskedLMOutput

from .configuration_diffill import DiffillConfig
from .output_loss import output_cross_entropy

logger = logging.getLogger(__name__)
IGNORE_INDEX = -100  # label value of positions that carry no loss (the transformers convention)


@dataclass
class DiffillContextCache:
    """Per-layer keys and values of an encoded context, shared by every denoising step of a request."""

    keys: tuple[torch.Tensor, ...]  # one (B, H, C, D) per layer, rotary embedding already applied
    values: tuple[torch.Tensor, ...]  # one (B, H, C, D) per layer
    padding_mask: torch.Tensor | None  # (B, C) True at real tokens, False at padding; None when nothing is padded
    # Only for shift_logits models, whose first canvas position is predicted by the context token just before it:
    hidden: torch.Tensor | None = None  # (B, C, E) the context's last-layer output
    positions: torch.LongTensor | None = None  # (B, C) the context's position ids
    # Decoding token by token (`reserve_context`): buffers longer than this cache, whose first C positions it views;
    # `extend_context` writes the new tokens into them in place instead of copying the context for every token.
    room: "DiffillContextCache | None" = None

    @property
    def batch_size(self) -> int:
        """Number of contexts in the cache (1 when K candidates share one context)."""
        return self.keys[0].shape[0]

    @property
    def length(self) -> int:
        """Context length C, padding included."""
        return self.keys[0].shape[2]


@dataclass
class DiffillDenoisingPlan:
    """What every denoising step of one canvas batch against one context shares, computed once per fill.

    Each layer's keys and values live in one buffer per layer, the context's copied into its head once; each step
    writes the canvas's into its tail and attends to the whole buffer, instead of concatenating the context's with
    the canvas's at every layer and step. A step overwrites the tail: one step at a time per plan."""

    cache: DiffillContextCache  # the encoded context (its hidden states and positions, for shift_logits)
    positions: torch.LongTensor  # (B, N) position ids of the canvas
    cos: torch.Tensor  # (B, N, 1, D) rotary cosines at the canvas positions
    sin: torch.Tensor  # (B, N, 1, D) rotary signed sines
    attn_mask: torch.Tensor | None  # (B, 1, N, C + N) True where attended; None when nothing is padded
    keys: tuple[torch.Tensor, ...]  # one (B, Hkv, C + N, D) per layer: the context's keys, then the canvas's
    values: tuple[torch.Tensor, ...]  # one (B, Hkv, C + N, D) per layer
    last_rows: int = 0  # canvas positions (per row) the plan's last step ran the layers over
    before: tuple[torch.Tensor, torch.Tensor] | None = None  # shift_logits: the context's output just before each
    #     row's canvas (B, 1, E) and whether the row has one (B,), found at the plan's first step that needs it

    @property
    def shape(self) -> torch.Size:
        """(B, N): the canvas batch this plan serves."""
        return self.positions.shape


def _kv_buffers(
    cache: DiffillContextCache, batch: int, length: int
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """Per layer, keys and values buffers (batch, Hkv, C + length, D) holding the cache's in the first C positions."""

    def buffer(context: torch.Tensor) -> torch.Tensor:
        B, H, C, D = context.shape
        out = context.new_empty(batch, H, C + length, D)
        out[:, :, :C] = context  # a batch-1 context is broadcast over the rows
        return out

    return tuple(buffer(k) for k in cache.keys), tuple(buffer(v) for v in cache.values)


def rotary_cos_sin(
    positions: torch.LongTensor, head_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosines and signed sines (first half negated) of the rotary angles at explicit positions, each (B, T, 1, D)."""
    exponents = torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim
    inv_freq = theta**-exponents  # (D/2,)
    # Angles in float32: in bfloat16 a position like 1000 is not even representable exactly.
    angles = positions[..., None].to(torch.float32) * inv_freq  # (B, T, D/2)
    cos, sin = angles.cos(), angles.sin()
    cos = torch.cat([cos, cos], dim=-1)[:, :, None]  # (B, T, 1, D)
    sin = torch.cat([-sin, sin], dim=-1)[:, :, None]  # (B, T, 1, D), so that apply_rotary needs no negation
    return cos.to(dtype), sin.to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each (first half, second half) pair of the head dimension of x (B, T, heads, D) by its position's angles.

    The same numbers as x * cos + cat(-x2, x1) * sin, bit for bit, in four operators instead of six (the sign is in
    `sin`; rolling by half the head swaps the halves)."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin  # (B, T, heads, D)


def infilling_attention_mask(
    canvas_mask: torch.Tensor,
    padding_mask: torch.Tensor,
    causal_positions: torch.LongTensor | None = None,
    canvas_segments: torch.LongTensor | None = None,
) -> torch.Tensor:
    """Boolean (B, 1, T, T) mask, True where query t may attend key s, implementing the rule of this module.

    With `causal_positions` (B, T), a context token attends only to context tokens at positions up to its own (the
    causal_context variant, for models that start from an autoregressive one); canvas tokens still see everything.
    With `canvas_segments` (B, T; 0 in the context, k in the k-th of several canvases of one training sequence), a
    canvas token sees the context and its own canvas only, as if each canvas were the only hole.
    """
    key_is_context = ~canvas_mask[:, None, :]  # (B, 1, T)
    query_is_canvas = canvas_mask[:, :, None]  # (B, T, 1)
    canvas_sees = key_is_context | query_is_canvas  # (B, T, T) for canvas queries: every key...
    if canvas_segments is not None:  # ...or the context and their own canvas
        canvas_sees = key_is_context | (canvas_segments[:, :, None] == canvas_segments[:, None, :])
    if causal_positions is not None:
        key_is_context = key_is_context & (causal_positions[:, None, :] <= causal_positions[:, :, None])  # (B, T, T)
    allowed = torch.where(query_is_canvas, canvas_sees, key_is_context) & padding_mask[:, None, :]  # (B, T, T)
    # Every position may attend itself. The rule already allows this for real tokens; for a padding token (whose
    # output nobody reads) it keeps the row from being empty, which would make the softmax NaN.
    allowed = allowed | torch.eye(canvas_mask.shape[1], dtype=torch.bool, device=canvas_mask.device)
    return allowed[:, None]  # (B, 1, T, T)


def masked_diffusion_loss(
    logits: torch.Tensor, labels: torch.LongTensor, loss_weights: torch.Tensor | None = None
) -> torch.Tensor:
    """Cross-entropy at labelled positions, each weighted by loss_weights, averaged over the labelled count."""
    labelled = labels != IGNORE_INDEX  # (B, T)
    token_loss = F.cross_entropy(
        logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="none"
    ).view_as(labels)  # (B, T), zero where unlabelled
    if loss_weights is not None:
        # where() rather than a product, so an infinite weight at an unlabelled position cannot give NaN
        token_loss = torch.where(labelled, token_loss * loss_weights.float(), 0.0)
    return token_loss.sum() / labelled.sum().clamp(min=1)


CERTAINTY_TEMPERATURE = 0.5  # dParallel's: the entropy is taken of the sharpened distribution


def certainty_loss(logits: torch.Tensor, labels: torch.LongTensor) -> torch.Tensor:
    """Mean entropy of the predictions that are already right (dParallel's certainty forcing); 0 if none are."""
    right = logits.argmax(dim=-1) == labels  # labels: (..., ) without IGNORE_INDEX entries
    if not bool(right.any()):
        return logits.sum() * 0.0  # keeps the graph, so backward works on a batch with nothing right
    log_probs = F.log_softmax(logits[right].float() / CERTAINTY_TEMPERATURE, dim=-1)
    return -(log_probs.exp() * log_probs).sum(dim=-1).mean()


class DiffillAttention(nn.Module):
    """Multi-head attention with rotary embeddings, optionally after a cached context's keys and values."""

    def __init__(self, config: DiffillConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads or config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        qkv_width = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim  # q for every head, k and v per group
        self.qkv_proj = nn.Linear(config.hidden_size, qkv_width, bias=False)
        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.o_proj.scale_init_by_depth = True  # writes into the residual stream, see _init_weights

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attn_mask: torch.Tensor | None,
        kv_buffer: tuple[torch.Tensor, torch.Tensor] | None = None,
        slots: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Attention output (B, T, E), and the keys and values attended (B, Hkv, L, D), for caching.

        Without `kv_buffer` x attends to itself (L = T). With it (keys, values, each (B, Hkv, L, D) holding a
        cached context's in the first C positions), x's own keys and values are written into the last T positions,
        or into the buffer positions `slots` (T,) when given (the others keep what an earlier call wrote), and x
        attends to the whole buffer: no copy of the context per call."""
        B, T, E = x.shape
        heads, kv_heads = self.num_heads, self.num_kv_heads
        qkv = self.qkv_proj(x).view(B, T, heads + 2 * kv_heads, self.head_dim)  # q heads, k heads, v heads
        qk = apply_rotary(qkv[:, :, : heads + kv_heads], cos, sin)  # (B, T, H + Hkv, D): q and k in one go
        q = qk[:, :, :heads].transpose(1, 2)  # (B, H, T, D)
        k = qk[:, :, heads:].transpose(1, 2)  # (B, Hkv, T, D)
        v = qkv[:, :, heads + kv_heads :].transpose(1, 2)  # (B, Hkv, T, D)
        keys, values = k, v
        if kv_buffer is not None:
            keys, values = kv_buffer
            if slots is None:
                keys[:, :, -T:] = k
                values[:, :, -T:] = v
            else:
                keys.index_copy_(2, slots, k)
                values.index_copy_(2, slots, v)
        grouped = kv_heads != heads  # each key/value head serves H / Hkv query heads
        y = F.scaled_dot_product_attention(q, keys, values, attn_mask=attn_mask, enable_gqa=grouped)  # (B, H, T, D)
        y = y.transpose(1, 2).reshape(B, T, E)  # (B, T, E)
        return self.o_proj(y), keys, values


class DiffillMLP(nn.Module):
    """SwiGLU feed-forward layer."""

    def __init__(self, config: DiffillConfig):
        super().__init__()
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.down_proj.scale_init_by_depth = True  # writes into the residual stream, see _init_weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, E) -> (B, T, E)."""
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # each (B, T, I)
        return self.down_proj(F.silu(gate) * up)


class DiffillBlock(GradientCheckpointingLayer):
    """Pre-norm transformer block: x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: DiffillConfig):
        super().__init__()
        self.attn_norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.attn = DiffillAttention(config)
        self.mlp_norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = DiffillMLP(config)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attn_mask: torch.Tensor | None,
        kv_buffer: tuple[torch.Tensor, torch.Tensor] | None = None,
        slots: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """New hidden states (B, T, E), and this layer's keys and values attended (B, Hkv, L, D) (see attention)."""
        attn_out, k, v = self.attn(self.attn_norm(x), cos, sin, attn_mask, kv_buffer, slots)
        x = x + attn_out
        x = x + self.mlp(self.mlp_norm(x))
        return x, k, v


class DiffillPreTrainedModel(PreTrainedModel):
    """Weight initialisation and loading conventions shared by the Diffill models."""

    config: DiffillConfig
    base_model_prefix = "diffill"
    supports_gradient_checkpointing = True
    _no_split_modules = ["DiffillBlock"]
    _supports_sdpa = True

    def _init_weights(self, module: nn.Module) -> None:
        """Normal(0, initializer_range) linears and embeddings, unit norms, depth-scaled residual projections."""
        if isinstance(module, nn.Linear) and getattr(module, "scale_init_by_depth", False):
            # GPT-2 style: the projections that write into the residual stream shrink with depth.
            std = self.config.initializer_range / math.sqrt(2 * self.config.num_hidden_layers)
            init.normal_(module.weight, mean=0.0, std=std)  # skipped for weights loaded from a checkpoint
        else:
            super()._init_weights(module)


class DiffillForInfilling(DiffillPreTrainedModel):
    """The infilling model: a context encoder with an exact per-layer cache, and a canvas denoiser."""

    _tied_weights_keys = {"lm_head.weight": "embed_tokens.weight"}

    def __init__(self, config: DiffillConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DiffillBlock(config) for _ in range(config.num_hidden_layers))
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()
        self.compiled_layers = None  # the blocks compiled ahead of time (`compiled_layers.py`), if loaded

    def get_input_embeddings(self) -> nn.Embedding:
        """The token embedding."""
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        """Replace the token embedding."""
        self.embed_tokens = value

    def get_output_embeddings(self) -> nn.Linear:
        """The output projection (tied to the token embedding by default)."""
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        """Replace the output projection."""
        self.lm_head = value

    def _rotary(self, positions: torch.LongTensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        head_dim = self.config.hidden_size // self.config.num_attention_heads
        return rotary_cos_sin(positions, head_dim, self.config.rope_theta, dtype)

    @torch.no_grad()
    def encode_context(
        self,
        context_ids: torch.LongTensor,
        context_positions: torch.LongTensor,
        context_padding_mask: torch.Tensor | None = None,
    ) -> DiffillContextCache:
        """Run the layers over the context alone; context_padding_mask is True at real tokens, False at padding."""
        x = self.embed_tokens(context_ids)  # (B, C, E)
        cos, sin = self._rotary(context_positions, x.dtype)  # each (B, C, 1, D)
        attn_mask = None
        padded = context_padding_mask is not None and not bool(context_padding_mask.all())
        context_padding_mask = context_padding_mask.bool() if padded else None
        compiled = None
        if not padded and self.config.causal_context and getattr(self, "compiled_layers", None):  # as extend_context
            B, C, _ = x.shape
            heads = self.config.num_key_value_heads or self.config.num_attention_heads
            shape = (B, heads, C, self.config.hidden_size // self.config.num_attention_heads)
            buffers = tuple(x.new_empty(shape) for _ in self.layers), tuple(x.new_empty(shape) for _ in self.layers)
            compiled = self._compiled_context_rows(x, cos, sin, *buffers, start=0)
        if compiled is not None:
            x, (keys, values) = compiled, buffers
        else:
            if padded or self.config.causal_context:
                real = context_padding_mask if padded else torch.ones_like(context_ids, dtype=torch.bool)
                causal = context_positions.expand_as(context_ids) if self.config.causal_context else None
                attn_mask = infilling_attention_mask(torch.zeros_like(real), real, causal)
            keys, values = [], []
            for block in self.layers:
                x, k, v = block(x, cos, sin, attn_mask)
                keys.append(k.contiguous())  # k and v are views into per-layer outputs (q's too): keep only their own
                values.append(v.contiguous())
        cache = DiffillContextCache(keys=tuple(keys), values=tuple(values), padding_mask=context_padding_mask)
        if self.config.shift_logits:  # the context token before the canvas predicts its first position
            cache.hidden, cache.positions = x, context_positions.expand_as(context_ids)
        # Otherwise the context's last-layer output is never used: canvas logits only read the cached keys and values.
        return cache

    @torch.no_grad()
    def plan_denoising(
        self,
        canvas_positions: torch.LongTensor,
        cache: DiffillContextCache,
        canvas_padding_mask: torch.Tensor | None = None,
    ) -> DiffillDenoisingPlan:
        """What every denoising step of a (B, N) canvas batch against `cache` shares, computed once per fill.

        `canvas_padding_mask` (B, N), True at real canvas tokens, lets canvases of different lengths share a batch
        (each row right-padded to N); nobody attends a padding position and its logits are meaningless."""
        B, N = canvas_positions.shape
        if cache.batch_size not in (1, B):
            raise ValueError(f"a context cache of batch {cache.batch_size} cannot serve a canvas batch of {B}")
        device = canvas_positions.device
        cos, sin = self._rotary(canvas_positions, cache.keys[0].dtype)  # each (B, N, 1, D)
        attn_mask = None
        if cache.padding_mask is not None or canvas_padding_mask is not None:
            context_known = cache.padding_mask if cache.padding_mask is not None else torch.ones(
                cache.batch_size, cache.length, dtype=torch.bool, device=device)
            context_keys = context_known[:, None, None, :].expand(B, 1, N, cache.length)  # (B, 1, N, C)
            canvas_known = canvas_padding_mask.bool() if canvas_padding_mask is not None else torch.ones(
                B, N, dtype=torch.bool, device=device)
            canvas_keys = canvas_known[:, None, None, :].expand(B, 1, N, N)  # (B, 1, N, N)
            attn_mask = torch.cat([context_keys, canvas_keys], dim=-1)  # (B, 1, N, C + N)
        keys, values = _kv_buffers(cache, B, N)
        return DiffillDenoisingPlan(cache, canvas_positions, cos, sin, attn_mask, keys, values)

    @torch.no_grad()
    def denoise(
        self,
        canvas_ids: torch.LongTensor,
        canvas_positions: torch.LongTensor,
        cache: DiffillContextCache,
        canvas_padding_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits (B, N, V) for the canvas given an encoded context; a batch-1 cache serves any canvas batch.

        One step on its own: a denoising loop plans once (`plan_denoising`) and calls `denoise_planned` per step.
        `canvas_padding_mask` as in `plan_denoising`."""
        positions = canvas_positions.expand(canvas_ids.shape[0], -1)  # (B, N)
        return self.denoise_planned(canvas_ids, self.plan_denoising(positions, cache, canvas_padding_mask))

    @torch.no_grad()
    def denoise_planned(
        self, canvas_ids: torch.LongTensor, plan: DiffillDenoisingPlan, columns: torch.LongTensor | None = None,
        rows: torch.LongTensor | None = None,
    ) -> torch.Tensor:
        """Logits (B, N, V) for the canvas, one denoising step of a plan (which it writes the canvas's keys into).

        With `columns` (n,), the logits (B, n, V) of those canvas positions only: the layers still run over the
        whole canvas (every position is read), the output projection only over these. With `rows` (r,) as well,
        the layers run only over those canvas positions and the ones whose outputs give the columns' logits; every
        other position is attended with the keys and values an earlier step of this plan wrote for it (an
        approximation: they are not recomputed against what changed since)."""
        if canvas_ids.shape != plan.positions.shape:
            raise ValueError(f"a plan for canvases {tuple(plan.positions.shape)} got {tuple(canvas_ids.shape)}")
        N = canvas_ids.shape[1]
        if rows is not None and columns is not None:
            rows = self.canvas_rows_read(rows, columns, N)
        if rows is None or columns is None or rows.numel() == N:
            plan.last_rows = N
            return self._denoise_whole(canvas_ids, plan, columns)
        plan.last_rows = rows.numel()
        x = self.embed_tokens(canvas_ids[:, rows])  # (B, r, E)
        cos, sin = plan.cos[:, rows], plan.sin[:, rows]  # each (B, r, 1, D)
        attn_mask = None if plan.attn_mask is None else plan.attn_mask[:, :, rows]  # (B, 1, r, C + N)
        slots = rows + plan.cache.length  # (r,) where the rows' keys and values go in the buffers
        x = self._canvas_layers(x, cos, sin, attn_mask, plan, slots)
        index_of = torch.full((N,), -1, dtype=torch.long, device=rows.device)
        index_of[rows] = torch.arange(rows.numel(), device=rows.device)  # canvas position -> its row in x
        if not self.config.shift_logits:
            return self.lm_head(self.norm(x[:, index_of[columns]]))  # (B, n, V)
        out = x[:, index_of[(columns - 1).clamp_min(0)]]  # (B, n, E): position p's logits come from p - 1
        if bool((columns == 0).any()):  # the first position's come from the context (rows hold position 0 first)
            before = self._state_before_canvas(x, plan)  # (B, 1, E)
            out = torch.where((columns == 0)[None, :, None], before, out)
        return self.lm_head(self.norm(out))  # (B, n, V)

    def _canvas_layers(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn_mask: torch.Tensor | None,
        plan: DiffillDenoisingPlan, slots: torch.LongTensor,
    ) -> torch.Tensor:
        """Canvas rows x (B, r, E) through every block, their keys and values written into the plan's buffers at
        `slots` (r,): by the compiled blocks where they take the call, else eagerly."""
        compiled = self._compiled_rows(x, cos, sin, attn_mask, slots, plan.keys, plan.values)
        if compiled is not None:
            return compiled
        for block, keys, values in zip(self.layers, plan.keys, plan.values):
            x, _, _ = block(x, cos, sin, attn_mask, (keys, values), slots)
        return x

    def _compiled_context_rows(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, keys: tuple[torch.Tensor, ...],
        values: tuple[torch.Tensor, ...], start: int,
    ) -> torch.Tensor | None:
        """Context rows x (B, T, E) at the buffers' positions start..start+T through the compiled blocks, each row
        attending to the buffers up to its own position (the ones before `start` hold a cached context's), their keys
        and values written there; None where the compiled layers do not take the call."""
        slots = torch.arange(start, start + x.shape[1], device=x.device)  # (T,)
        return self._compiled_rows(x, cos, sin, None, slots, keys, values, context=True)

    def _compiled_rows(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn_mask: torch.Tensor | None,
        slots: torch.LongTensor, keys: tuple[torch.Tensor, ...], values: tuple[torch.Tensor, ...],
        context: bool = False,
    ) -> torch.Tensor | None:
        """Rows x (B, r, E) through the compiled blocks (a step's canvas rows; with `context`, context rows that each
        attend to the buffers up to their own slot), their keys and values written at `slots`; None where the
        compiled layers do not take the call, or fail (they are dropped: from then on the layers run eagerly, and the
        caller's eager blocks write every slot the failed call may have written)."""
        compiled = getattr(self, "compiled_layers", None)
        if compiled is None or (context and compiled.context_runner is None):
            return None
        if not compiled.accepts(x, attn_mask, keys):
            return None
        try:
            return (compiled.context if context else compiled)(x, cos, sin, slots, keys, values)
        except RuntimeError as error:
            logger.warning("the compiled layers failed (%s); the layers run eagerly from now on", error)
            self.compiled_layers = None
            return None

    def canvas_rows_read(self, rows: torch.LongTensor, columns: torch.LongTensor, length: int) -> torch.LongTensor:
        """The canvas positions (r',) a step with `rows` (r,) and `columns` (n,) runs the layers over: the rows and
        those whose outputs give the columns' logits, sorted."""
        needed = torch.zeros(length, dtype=torch.bool, device=rows.device)
        needed[rows] = True
        if self.config.shift_logits:
            needed[(columns - 1).clamp_min(0)] = True  # position 0 is also the fallback of a canvas with no prefix
        else:
            needed[columns] = True
        return needed.nonzero().squeeze(-1)

    def _denoise_whole(
        self, canvas_ids: torch.LongTensor, plan: DiffillDenoisingPlan, columns: torch.LongTensor | None
    ) -> torch.Tensor:
        """Logits (B, N, V), or (B, n, V) at `columns`, from the layers run over every canvas position."""
        x = self.embed_tokens(canvas_ids)  # (B, N, E)
        N, length = canvas_ids.shape[1], plan.keys[0].shape[2]
        slots = torch.arange(length - N, length, device=canvas_ids.device)  # (N,) the buffers' tails
        x = self._canvas_layers(x, plan.cos, plan.sin, plan.attn_mask, plan, slots)
        if self.config.shift_logits:
            before = self._state_before_canvas(x, plan)  # (B, 1, E)
            x = torch.cat([before, x[:, :-1]], dim=1)  # (B, N, E)
        if columns is not None:
            x = x[:, columns]  # (B, n, E)
        return self.lm_head(self.norm(x))  # (B, N or n, V)

    @torch.no_grad()
    def extend_context(
        self, ids: torch.LongTensor, positions: torch.LongTensor, cache: DiffillContextCache
    ) -> DiffillContextCache:
        """The cache of the context followed by `ids` (B, T): the new tokens attend to the cache and causally to each
        other, as if the longer context had been encoded at once (a causal_context model's KV cache, for decoding
        token by token)."""
        if not self.config.causal_context:
            raise ValueError("extend_context needs a causal_context model: earlier context tokens would see the new")
        B, T = ids.shape
        x = self.embed_tokens(ids)  # (B, T, E)
        cos, sin = self._rotary(positions, x.dtype)  # each (B, T, 1, D)
        attn_mask = None
        if T > 1 or cache.padding_mask is not None:
            known = cache.padding_mask if cache.padding_mask is not None else torch.ones(
                cache.batch_size, cache.length, dtype=torch.bool, device=ids.device)
            context_keys = known[:, None, None, :].expand(B, 1, T, cache.length)  # (B, 1, T, C)
            new_keys = torch.ones(T, T, dtype=torch.bool, device=ids.device).tril().expand(B, 1, T, T)
            attn_mask = torch.cat([context_keys, new_keys], dim=-1)  # (B, 1, T, C + T)
        C, room = cache.length, cache.room
        if room is not None and room.batch_size == B and room.length >= C + T and cache.padding_mask is None:
            keys = tuple(k[:, :, : C + T] for k in room.keys)  # views: the block writes the new keys at C..C+T
            values = tuple(v[:, :, : C + T] for v in room.values)
        else:
            room = None
            keys, values = _kv_buffers(cache, B, T)  # each layer's (B, Hkv, C + T, D): the context's, then the new
        compiled = None
        if cache.padding_mask is None and cache.batch_size == B:
            # the room's whole buffers where there is one (contiguous, as the compiled call takes them): each row
            # attends only up to its own slot, so the positions past C + T are never read
            buffers = (room.keys, room.values) if room is not None else (keys, values)
            compiled = self._compiled_context_rows(x, cos, sin, *buffers, start=C)
        if compiled is not None:
            x = compiled
        else:
            for block, layer_keys, layer_values in zip(self.layers, keys, values):
                x, _, _ = block(x, cos, sin, attn_mask, (layer_keys, layer_values))
        padding_mask = None
        if cache.padding_mask is not None:
            padding_mask = torch.cat([cache.padding_mask.expand(B, -1), torch.ones_like(ids, dtype=torch.bool)], 1)
        extended = DiffillContextCache(keys=tuple(keys), values=tuple(values), padding_mask=padding_mask, room=room)
        if self.config.shift_logits and room is not None:
            room.hidden[:, C : C + T] = x
            room.positions[:, C : C + T] = positions
            extended.hidden, extended.positions = room.hidden[:, : C + T], room.positions[:, : C + T]
        elif self.config.shift_logits:
            extended.hidden = torch.cat([cache.hidden.expand(B, -1, -1), x], dim=1)  # (B, C + T, E)
            extended.positions = torch.cat([cache.positions.expand(B, -1), positions.expand(B, T)], dim=1)
        return extended

    @torch.no_grad()
    def reserve_context(self, cache: DiffillContextCache, extra: int) -> DiffillContextCache:
        """The same context with room for `extra` more positions, for decoding token by token: `extend_context` then
        writes each new token's keys, values and output into that room instead of copying the whole context.

        The room is shared along one line of extensions: extending a cache overwrites what an earlier extension of the
        same cache wrote there, so extend only the newest cache (as greedy decoding does)."""
        if cache.padding_mask is not None:
            raise ValueError("reserve_context takes an unpadded context (one row per context)")
        B, C = cache.batch_size, cache.length
        keys, values = _kv_buffers(cache, B, extra)
        for buffer in (*keys, *values):  # the compiled layers read the whole room, masked past each row's position:
            buffer[:, :, C:] = 0  # what they mask must be a number (a weight of 0 times NaN is NaN), not new memory
        room = DiffillContextCache(keys=keys, values=values, padding_mask=None)
        if cache.hidden is not None:
            room.hidden = cache.hidden.new_empty(B, C + extra, cache.hidden.shape[-1])
            room.hidden[:, :C] = cache.hidden
            room.positions = cache.positions.new_zeros(B, C + extra)
            room.positions[:, :C] = cache.positions
        reserved = DiffillContextCache(keys=tuple(k[:, :, :C] for k in keys), values=tuple(v[:, :, :C] for v in values),
                                       padding_mask=None, room=room)
        if room.hidden is not None:
            reserved.hidden, reserved.positions = room.hidden[:, :C], room.positions[:, :C]
        return reserved

    @torch.no_grad()
    def next_token_logits(self, cache: DiffillContextCache) -> torch.Tensor:
        """Logits (B, V) for the token after the context's last position (a shift_logits model; no right padding)."""
        if cache.hidden is None:
            raise ValueError("next_token_logits needs a shift_logits model, whose context outputs predict the next")
        return self.lm_head(self.norm(cache.hidden[:, -1]))  # (B, V)

    def _state_before_canvas(self, x: torch.Tensor, plan: DiffillDenoisingPlan) -> torch.Tensor:
        """(B, 1, E): the output of the context token just before the canvas, or the canvas's first when none is
        (x (B, r, E) holds the canvas's outputs, position 0 first). The context's part is found once per plan (a
        pass over the whole context's hidden states: 0.14 ms a step, before)."""
        if plan.before is None:
            cache = plan.cache
            before = cache.positions == plan.positions[:, :1] - 1  # (B, C)
            if cache.padding_mask is not None:
                before = before & cache.padding_mask
            weights = before.to(cache.hidden.dtype)[..., None]  # (B, C, 1), one 1 per row that has a prefix
            state = (weights * cache.hidden.expand(before.shape[0], -1, -1)).sum(dim=1, keepdim=True)  # (B, 1, E)
            plan.before = state, before.any(dim=-1)  # found: False for a row with an empty prefix
        state, found = plan.before
        if not bool(found.any()):  # no row has a prefix: as in training, the position predicts itself
            return x[:, :1]
        return torch.where(found[:, None, None], state.to(x.dtype), x[:, :1])  # per row: rows of several contexts

    def forward(
        self,
        input_ids: torch.LongTensor,
        position_ids: torch.LongTensor | None = None,
        canvas_mask: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        loss_weights: torch.Tensor | None = None,
        loss_only: bool = False,
        next_token_labels: torch.LongTensor | None = None,
        next_token_weight: float = 1.0,
        canvas_segments: torch.LongTensor | None = None,
        certainty_weight: float = 0.0,
        **kwargs,
    ) -> MaskedLMOutput:
        """One pass over context and canvas together (training); canvas_mask None means all positions are canvas.

        Positions must be in sequence order (prefix, span, suffix) when the config has shift_logits.

        With `loss_only` (and labels), the output layer runs only at labelled positions (the span: about a fifth of
        a training sequence) and no logits are returned; the loss is the same.

        `next_token_labels` (B, T), for dense supervision of a shift_logits model: each labelled context position's
        (shifted) output is also trained to predict its token, as an autoregressive model is; the loss becomes the
        span's loss plus `next_token_weight` times the mean next-token cross-entropy. `canvas_segments` (B, T) marks
        several canvases in one sequence (0: context, k: the k-th canvas), each attending to the context and itself.
        `certainty_weight` (with `loss_only`) adds that times `certainty_loss` at the span: the model is pushed to be
        sure where it is already right, so that the sampler's threshold commits more positions per step.
        """
        B, T = input_ids.shape
        if position_ids is None:
            position_ids = torch.arange(T, device=input_ids.device).expand(B, T)
        x = self.embed_tokens(input_ids)  # (B, T, E)
        cos, sin = self._rotary(position_ids, x.dtype)  # each (B, T, 1, D)
        attn_mask = None  # plain bidirectional attention
        if canvas_mask is not None or attention_mask is not None:
            everywhere = torch.ones_like(input_ids, dtype=torch.bool)
            canvas = everywhere if canvas_mask is None else canvas_mask.bool()
            real = everywhere if attention_mask is None else attention_mask.bool()
            causal = position_ids if self.config.causal_context else None
            attn_mask = infilling_attention_mask(canvas, real, causal, canvas_segments)  # (B, 1, T, T)
        elif self.config.causal_context:
            raise ValueError("a causal_context model needs canvas_mask: it attends differently to context and canvas")
        for block in self.layers:
            x, _, _ = block(x, cos, sin, attn_mask)
        if self.config.shift_logits:  # position t reads the output at t - 1; the first position keeps its own
            x = torch.cat([x[:, :1], x[:, :-1]], dim=1)  # (B, T, E)
        if next_token_labels is not None and not self.config.shift_logits:
            raise ValueError("next_token_labels need a shift_logits model (the output at t - 1 predicts token t)")
        if loss_only and labels is not None:
            loss = self._labelled_loss(x, labels, loss_weights, next_token_labels, next_token_weight, certainty_weight)
            return MaskedLMOutput(loss=loss, logits=None)
        logits = self.lm_head(self.norm(x))  # (B, T, V)
        loss = None if labels is None else masked_diffusion_loss(logits, labels, loss_weights)
        if loss is not None and next_token_labels is not None:
            loss = loss + next_token_weight * masked_diffusion_loss(logits, next_token_labels)
        return MaskedLMOutput(loss=loss, logits=logits)

    @torch.compiler.disable  # its sizes are the batch's labelled counts: compiled, it would recompile at every batch
    def _labelled_loss(
        self, x: torch.Tensor, labels: torch.LongTensor, loss_weights: torch.Tensor | None,
        next_token_labels: torch.LongTensor | None, next_token_weight: float, certainty_weight: float,
    ) -> torch.Tensor:
        """The `loss_only` loss from the blocks' outputs x (B, T, E): the output layer only at labelled positions."""
        labelled = labels != IGNORE_INDEX  # (B, T)
        weights = None if loss_weights is None else loss_weights[labelled]
        span, span_labels = self.norm(x[labelled]), labels[labelled]  # (L, E), (L,)
        if certainty_weight:  # it reads the span's logits
            span_logits = self.lm_head(span)  # (L, V)
            loss = masked_diffusion_loss(span_logits[None], span_labels[None], weights)
            loss = loss + certainty_weight * certainty_loss(span_logits, span_labels)
        else:  # the same loss, the logits never held whole (`output_loss`)
            loss = output_cross_entropy(span, self.lm_head.weight, span_labels, weights) / max(span_labels.numel(), 1)
        if next_token_labels is not None:
            context = next_token_labels != IGNORE_INDEX  # (B, T)
            targets = next_token_labels[context]  # (L',)
            context_loss = output_cross_entropy(self.norm(x[context]), self.lm_head.weight, targets)
            loss = loss + next_token_weight * context_loss / max(targets.numel(), 1)
        return loss

__all__ = [
    "certainty_loss",
    "DiffillContextCache",
    "DiffillDenoisingPlan",
    "DiffillForInfilling",
    "DiffillPreTrainedModel",
    "infilling_attention_mask",
    "masked_diffusion_loss",
]
