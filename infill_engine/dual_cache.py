"""Fast-dLLM's approximate dual cache, for models that would run the whole sequence again at every step (LLaDA, Dream).

In a masked-diffusion model the prefix and suffix attend to the canvas, so their keys and values change whenever the
canvas does, and no cache of them is exact. Fast-dLLM (Wu et al. 2025, `generate_with_dual_cache`) observes that
they change little from one step to the next: it runs the whole sequence once per block, keeps the prefix's and the
suffix's keys and values, and for the block's other steps runs only the block against them. Here the span is one
canvas, so the refresh comes every `refresh_every` steps instead of once per block:

    refresh (one full forward):  [ prefix | canvas | suffix ]  -> the step's logits (exact) and every layer's K, V
    cached step:                 [ canvas ] at its own positions, attending to [ kept prefix and suffix K, V ; its own ]

Attention is bidirectional, so the order of the keys does not matter: the kept keys already carry their rotary
position, and the canvas runs through the model's own `forward` with `position_ids` and a cache, as an
autoregressive model runs after its prompt. For a model that reads position i from output i - 1 (Dream), the last
prefix token runs with the canvas: its output predicts the first span position.

All this asks of the modelling code is what Dream's does: keys and values pass through transformers' `Cache.update`
after the rotary embedding, no causal mask is applied, and positions come from `position_ids`. A model whose code does
otherwise (LLaDA's own code keeps plain tuples and rotates keys by their index among all keys) is found out once, by
a probe right after the first refresh: the cached forward of the same canvas must give the full forward's logits. If
it does not, the cache is turned off for that model with a warning, and every step runs the whole sequence as before.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache

logger = logging.getLogger(__name__)

# The probe's bound on max |cached - full| / max |full| logits: float32 agrees to rounding; half precision to its
# own rounding of different matmul shapes. A model that ignores the cache or the positions is off by order 1.
PROBE_TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-8}
PROBE_TOLERANCE_HALF = 5e-2


class ContextCache(DynamicCache):
    """The prefix and suffix keys and values of every layer, kept as they are while canvases attend to them."""

    def __init__(self, full: DynamicCache, keep: torch.Tensor) -> None:
        super().__init__()
        for index, layer in enumerate(full.layers):
            super().update(layer.keys.index_select(-2, keep), layer.values.index_select(-2, keep), index)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The kept keys and values followed by the step's own, without storing the step's (B, H, C + Q, D)."""
        layer = self.layers[layer_idx]
        return torch.cat([layer.keys, key_states], dim=-2), torch.cat([layer.values, value_states], dim=-2)


@dataclass
class DualCacheState:
    """One request's cache between steps: the kept keys and values and the steps since they were computed."""

    cache: ContextCache | None = None  # None: the next step refreshes
    batch: int = 0  # rows the cache was computed for
    length: int = 0  # canvas positions it was computed for (a growing span changes them: the suffix moves)
    steps_since_refresh: int = 0  # the refresh counts as one; at `refresh_every` the next step refreshes
    refreshes: int = 0  # full forwards run for this request
    cached_steps: int = 0  # canvas-only forwards run for this request


class DualCache:
    """Runs a bidirectional model's steps against kept prefix and suffix keys and values, refreshed every N steps."""

    def __init__(self, model: Any, refresh_every: int, shift_logits: bool, name: str) -> None:
        if not isinstance(refresh_every, int) or isinstance(refresh_every, bool) or refresh_every < 1:
            raise ValueError(f"refresh_every must be an integer >= 1 (got {refresh_every!r})")
        self.model = model
        self.refresh_every = refresh_every
        self.shift_logits = shift_logits
        self.name = name  # the model's path, for log lines
        self.usable: bool | None = None  # None until the probe after the first refresh has run
        self._cache_argument = _cache_argument(model)

    def predict(
        self, state: DualCacheState, lead: torch.Tensor, canvas: torch.Tensor, trail: torch.Tensor
    ) -> torch.Tensor:
        """Logits (B, N, V) of the span positions of `lead | canvas | trail`: a full forward when a refresh is due,
        else the canvas against the kept keys and values."""
        batch, length = canvas.shape
        due = (state.cache is None or (state.batch, state.length) != (batch, length)
               or state.steps_since_refresh >= self.refresh_every)
        if due or self.usable is False:
            return self._full_span(self._refresh(state, lead, canvas, trail), lead.shape[1], length)
        state.steps_since_refresh += 1
        state.cached_steps += 1
        return self._cached_forward(state.cache, lead, canvas)[:, :length]

    def _full_span(self, logits: torch.Tensor, lead_length: int, span_length: int) -> torch.Tensor:
        """The (B, N, V) span logits of a full forward's (B, T, V)."""
        start = lead_length - 1 if self.shift_logits else lead_length
        return logits[:, start : start + span_length]

    # ------------------------------------------------------------------------------------------------ internals
    def _refresh(
        self, state: DualCacheState, lead: torch.Tensor, canvas: torch.Tensor, trail: torch.Tensor
    ) -> torch.Tensor:
        """One full forward: the step's exact logits (B, T, V); the context's keys and values kept for later steps."""
        batch, length = canvas.shape
        ids = torch.cat([lead.expand(batch, -1), canvas, trail.expand(batch, -1)], dim=1)  # (B, T)
        if self.usable is False:
            state.cache = None
            state.refreshes += 1
            return self.model(input_ids=ids).logits
        output = self.model(input_ids=ids, use_cache=True)
        full = _returned_cache(output)
        state.cache = None if full is None else ContextCache(full, self._kept_positions(lead, length, trail))
        state.batch, state.length = batch, length
        state.steps_since_refresh = 1  # the refresh is the first of its N steps
        state.refreshes += 1
        if self.usable is None:
            self.usable = self._probe(state.cache, lead, canvas, output.logits)
        if not self.usable:
            state.cache = None
        return output.logits

    def _kept_positions(self, lead: torch.Tensor, span_length: int, trail: torch.Tensor) -> torch.Tensor:
        """(C,) indices of the positions whose keys and values are kept: the lead (less its last token when that
        token runs with the canvas) and the trail."""
        lead_length, device = lead.shape[1], lead.device
        kept_lead = lead_length - 1 if self.shift_logits else lead_length
        suffix_start = lead_length + span_length
        return torch.cat([torch.arange(kept_lead, device=device),
                          torch.arange(suffix_start, suffix_start + trail.shape[1], device=device)])

    def _cached_forward(self, cache: ContextCache, lead: torch.Tensor, canvas: torch.Tensor) -> torch.Tensor:
        """The fresh positions (the last lead token when shifted, then the canvas) against the kept ones: (B, Q, V)."""
        batch, length = canvas.shape
        lead_length = lead.shape[1]
        fresh = torch.cat([lead[:, -1:].expand(batch, -1), canvas], dim=1) if self.shift_logits else canvas  # (B, Q)
        first = lead_length - fresh.shape[1] + length  # position of the first fresh token
        positions = torch.arange(first, first + fresh.shape[1], device=canvas.device)[None].expand(batch, -1)
        return self.model(input_ids=fresh, position_ids=positions, use_cache=True,
                          **{self._cache_argument: cache}).logits

    @torch.no_grad()
    def _probe(
        self, cache: ContextCache | None, lead: torch.Tensor, canvas: torch.Tensor, full_logits: torch.Tensor
    ) -> bool:
        """Whether the cached forward of `canvas` gives the full forward's logits (checked once per model)."""
        if cache is None:
            logger.warning("%s: dual cache off: the model returns no key/value cache from use_cache=True; every "
                           "step runs the whole sequence", self.name)
            return False
        try:
            cached = self._cached_forward(cache, lead, canvas)[:, : canvas.shape[1]]
        except Exception as error:  # noqa: BLE001 - any failure means this modelling code cannot take the cache
            logger.warning("%s: dual cache off: a cached forward failed (%s); every step runs the whole sequence",
                           self.name, error)
            return False
        full = self._full_span(full_logits, lead.shape[1], canvas.shape[1]).float()
        difference = float((cached.float() - full).abs().max() / full.abs().max().clamp_min(1e-6))
        tolerance = PROBE_TOLERANCE.get(full_logits.dtype, PROBE_TOLERANCE_HALF)
        if difference > tolerance:
            logger.warning("%s: dual cache off: right after a refresh the cached step differs from the full one by "
                           "%.3g of the largest logit (allowed %.3g): the modelling code does not read positions "
                           "from position_ids with a cache, or masks the cache; every step runs the whole sequence",
                           self.name, difference, tolerance)
            return False
        logger.info("%s: dual cache on, refreshed every %d steps (probe: %.2g of the largest logit)",
                    self.name, self.refresh_every, difference)
        return True


def _cache_argument(model: Any) -> str:
    """The keyword the model's forward takes its key/value cache by: `cache` (transformers 5) or `past_key_values`."""
    try:
        parameters = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in parameters and "past_key_values" not in parameters else "past_key_values"


def _returned_cache(output: Any) -> DynamicCache | None:
    """The key/value cache a forward returned, if it is one whose layers can be read (transformers' `Cache`)."""
    cache = getattr(output, "cache", None)  # transformers 5 outputs (reading past_key_values there warns)
    if cache is None:
        cache = getattr(output, "past_key_values", None)
    if cache is None or not hasattr(cache, "layers") or not cache.layers:
        return None
    return cache
