"""The embedded default model: the context is encoded once per request, each step computes only the canvas.

Because every token carries an explicit position id and padding is never attended, contexts of different lengths
encode together as one right-padded batch (`encode_many`), and the canvases of different requests share a forward
pass against their contexts' keys and values padded to the longest (`merge_contexts`); each row's logits are those
it gets alone, up to floating-point rounding.

A model that reads its context causally (`causal_context`) also keeps the encoded heads of recent prefixes
(`PrefixCache`): the next request, typically the same prefix one keystroke longer, reuses the keys and values of the
head it shares and encodes only its new tail and the suffix (`DiffillForInfilling.extend_context`): the same numbers
as encoding it all, up to floating-point rounding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from infill_engine.adapters.base import ContextArgs, Denoiser, EncodedContext, MergedRows
from infill_engine.special_tokens import SpecialTokens
from infill_engine.device import threads_for_pass
from infill_engine.diffill_model.modeling_diffill import DiffillContextCache, DiffillDenoisingPlan
from infill_engine.prefix_cache import PrefixCache

if TYPE_CHECKING:
    from collections.abc import Callable

    from infill_engine.compiled_layers import BackgroundCompile
    from infill_engine.interface import ModelSpec

MIN_REUSED = 16  # prefix tokens a request must share with a cached one for its keys and values to be reused
COMPILE_WAIT_S = 900  # the longest a benchmark waits for the layers' compile (30-60 s here) before running eagerly


@dataclass
class _CanvasOf:
    """What `predict` needs of an encoded (or merged) context."""

    cache: DiffillContextCache  # keys and values of the context (batch 1, or one row per canvas when merged)
    positions: torch.Tensor  # (1, N) or (B, N) position ids of the canvas
    known: torch.Tensor | None = None  # (B, N) True at real canvas positions when canvases are padded; None: all
    plan: DiffillDenoisingPlan | None = None  # the last canvas shape's, made by the first step of that shape


class DiffillDenoiser(Denoiser):
    """Our own `DiffillForInfilling`: an exact context KV cache (the context never attends to the canvas)."""

    family = "diffill"
    noise = "mask"
    block_mode = "restrict"
    batches_contexts = True
    projects_columns = True
    reuses_context = True  # the steps write only the canvas's keys and values, in the buffers' tails
    reuses_canvas_keys = True  # the buffers' tails keep each canvas position's keys and values between steps

    def __init__(self, model: Any, tokenizer: Any, special: SpecialTokens, path: str) -> None:
        super().__init__(model, tokenizer, special, path)
        # Only a causal context's prefix positions are independent of what follows them: others encode it all.
        self.prefixes: PrefixCache[DiffillContextCache] | None = (
            PrefixCache() if getattr(model.config, "causal_context", False) else None)
        self.positions_encoded = 0  # context positions run through the model, all requests together
        self.positions_reused = 0  # context positions whose keys and values came from the prefix cache
        self.canvas_positions_run = 0  # canvas positions the layers ran over, every step and row together
        self.compiled_layers_state = "off"  # what `diffill doctor` says of the compiled layers (compiled_layers.py)
        self.background_compile: BackgroundCompile | None = None  # a server's compile of them, while it runs

    def load_compiled_layers(self) -> None:
        """Run the layers compiled for this CPU where a package for this model is cached (`diffill compile`)."""
        from infill_engine.compiled_layers import compile_refusal, load_compiled_layers

        refusal = compile_refusal(self.model)
        if refusal is not None:
            self.compiled_layers_state = f"not used: {refusal}"
            return
        self.model.compiled_layers = load_compiled_layers(self.model)
        self.compiled_layers_state = (f"loaded ({self.model.compiled_layers.path})" if self.model.compiled_layers
                                      else "not compiled for this model, PyTorch and CPU yet (`diffill compile`; "
                                           "a server compiles them in the background)")

    def compile_layers_in_background(self, spec: ModelSpec) -> None:
        """A server's: compile the layers in a low-priority child process if none are cached; used once it is done."""
        import sys

        from infill_engine.compiled_layers import BackgroundCompile, compile_refusal

        if getattr(self.model, "compiled_layers", None) is not None or compile_refusal(self.model) is not None:
            return
        command = [sys.executable, "-m", "diffill", "compile", "--device", "cpu", "--dtype", self.precision]
        if spec.path is not None:
            command += ["--model", str(spec.resolved_path)]
        if spec.family is not None:
            command += ["--family", spec.family]
        if spec.trust_remote_code:
            command.append("--trust-remote-code")
        job = BackgroundCompile(self.model, command)
        try:
            running = job.start()
        except OSError as error:
            self.compiled_layers_state = f"not compiled: the background compile did not start ({error})"
            return
        self.compiled_layers_state = job.state
        self.background_compile = job if running else None

    def compile_layers_now(self, spec: ModelSpec, on_start: Callable[[], None] | None = None) -> bool:
        """A benchmark's: where no package is cached for this model, PyTorch and CPU, compile the layers as a server
        would in the background (`diffill compile` in a child process; `on_start` called once it runs), wait for it
        (at most COMPILE_WAIT_S: then it is stopped, counts as failed, and the layers run eagerly) and run them;
        whether a compile ran."""
        import subprocess

        self.compile_layers_in_background(spec)
        job = self.background_compile
        if job is None or job.process is None:
            return False
        if on_start is not None:
            on_start()
        try:
            job.process.wait(timeout=COMPILE_WAIT_S)
        except subprocess.TimeoutExpired:
            job.process.kill()
            job.process.wait()
        self._use_finished_compile()
        return True

    def _use_finished_compile(self) -> None:
        """Once the background compile has finished, run its layers from this fill on."""
        job = self.background_compile
        if job is None:
            return
        compiled = job.poll()
        if job.process is None:  # finished, well or not
            self.background_compile = None
            self.compiled_layers_state = job.state
            if compiled is not None:
                self.model.compiled_layers = compiled

    @torch.no_grad()
    def encode(self, prefix_ids: list[int], suffix_ids: list[int], span_length: int, batch_size: int) -> EncodedContext:
        """Encode prefix and suffix once; positions leave room for the span between them. The head of the prefix
        that a recent request shares is not encoded again (causal-context models)."""
        args = ContextArgs(prefix_ids, suffix_ids, span_length, batch_size)
        return self._encode_after(args, *self._cached_head(prefix_ids))

    def _encode_after(self, args: ContextArgs, shared: int, head: DiffillContextCache | None) -> EncodedContext:
        """Encode a context whose first `shared` prefix tokens are the cached `head` (None: nothing is shared)."""
        prefix_ids, suffix_ids = args.prefix_ids, args.suffix_ids
        device = self.device
        positions = _context_positions(len(prefix_ids), len(suffix_ids), args.span_length, device)[None]  # (1, C)
        new_ids = torch.tensor([list(prefix_ids[shared:]) + list(suffix_ids)], dtype=torch.long, device=device)
        if head is None:
            cache = self.model.encode_context(new_ids, positions)  # (1, C) ids: nothing shared
        elif new_ids.shape[1] == 0:  # the same prefix again and no suffix: nothing new to encode
            cache = _head_of(head, shared)
        else:
            cache = self.model.extend_context(new_ids, positions[:, shared:], _head_of(head, shared))
        self.positions_encoded += new_ids.shape[1]
        self.positions_reused += shared
        if self.prefixes is not None:
            self.prefixes.add(prefix_ids, _head_of(cache, len(prefix_ids), copy=True))
        return self._encoded(args, cache)

    def _cached_head(self, prefix_ids: list[int]) -> tuple[int, DiffillContextCache | None]:
        """The longest cached head of `prefix_ids` worth reusing, and its length; (0, None) when there is none."""
        if self.prefixes is None:
            return 0, None
        shared, head = self.prefixes.longest(prefix_ids)
        if shared < min(MIN_REUSED, len(prefix_ids)):  # a few shared tokens would not pay for a pass of its own
            return 0, None
        return shared, head

    @torch.no_grad()
    def encode_many(self, requests: list[ContextArgs]) -> list[EncodedContext]:
        """Encode several contexts in one forward pass, right-padded to the longest; each keeps its own rows. A request
        sharing a cached prefix head is encoded alone after it instead (cheaper than its place in the padded pass)."""
        heads = [self._cached_head(args.prefix_ids) for args in requests]
        encoded = {index: self._encode_after(args, *head)
                   for index, (args, head) in enumerate(zip(requests, heads)) if head[1] is not None}
        fresh = [index for index in range(len(requests)) if index not in encoded]
        if len(fresh) == 1:
            encoded[fresh[0]] = self._encode_after(requests[fresh[0]], 0, None)
        elif fresh:
            encoded.update(zip(fresh, self._encode_padded([requests[index] for index in fresh])))
        return [encoded[index] for index in range(len(requests))]

    def _encode_padded(self, requests: list[ContextArgs]) -> list[EncodedContext]:
        """Several contexts in one forward pass, right-padded to the longest."""
        device = self.device
        lengths = [len(r.prefix_ids) + len(r.suffix_ids) for r in requests]
        longest = max(lengths)
        filler = self._filler_id()
        ids = torch.full((len(requests), longest), filler, dtype=torch.long, device=device)  # (R, C)
        positions = torch.zeros((len(requests), longest), dtype=torch.long, device=device)  # (R, C)
        known = torch.zeros((len(requests), longest), dtype=torch.bool, device=device)  # (R, C)
        for row, (args, length) in enumerate(zip(requests, lengths)):
            ids[row, :length] = torch.tensor(list(args.prefix_ids) + list(args.suffix_ids), dtype=torch.long)
            positions[row, :length] = _context_positions(len(args.prefix_ids), len(args.suffix_ids),
                                                         args.span_length, device)
            known[row, :length] = True
        cache = self.model.encode_context(ids, positions, known)
        self.positions_encoded += sum(lengths)
        rows = [_row_of(cache, row, length, positions) for row, length in enumerate(lengths)]
        if self.prefixes is not None:
            for args, row in zip(requests, rows):
                self.prefixes.add(args.prefix_ids, _head_of(row, len(args.prefix_ids), copy=True))
        return [self._encoded(args, row) for args, row in zip(requests, rows)]

    def merge_contexts(self, parts: list[MergedRows]) -> EncodedContext:
        """The contexts' keys and values padded to the longest, one row per canvas; canvases padded likewise."""
        device = self.device
        rows = sum(part.rows for part in parts)
        context_length = max(part.context.state.cache.length for part in parts)
        canvas_length = max(part.length for part in parts)
        caches = [part.context.state.cache for part in parts]
        counts = [part.rows for part in parts]
        keys = tuple(_stack_padded([c.keys[layer] for c in caches], counts, context_length)
                     for layer in range(len(caches[0].keys)))  # each (B, H, C, D)
        values = tuple(_stack_padded([c.values[layer] for c in caches], counts, context_length)
                       for layer in range(len(caches[0].values)))
        context_known = torch.zeros((rows, context_length), dtype=torch.bool, device=device)  # (B, C)
        positions = torch.zeros((rows, canvas_length), dtype=torch.long, device=device)  # (B, N)
        canvas_known = torch.zeros((rows, canvas_length), dtype=torch.bool, device=device)  # (B, N)
        start = 0
        for part, cache in zip(parts, caches):
            stop = start + part.rows
            context_known[start:stop, : cache.length] = True
            first = int(part.context.state.positions[0, 0])
            positions[start:stop] = torch.arange(first, first + canvas_length, device=device)
            canvas_known[start:stop, : part.length] = True
            start = stop
        merged = DiffillContextCache(keys=keys, values=values, padding_mask=context_known)
        if caches[0].hidden is not None:  # shift_logits: the context's outputs and positions, padded the same way
            merged.hidden = _stack_padded([c.hidden[:, None] for c in caches], counts, context_length)[:, 0]
            merged.positions = _stack_padded([c.positions[:, None, :, None] for c in caches], counts,
                                             context_length, fill=-1)[:, 0, :, 0]
        state = _CanvasOf(merged, positions, canvas_known)
        return EncodedContext([], [], canvas_length, rows, state)

    def predict(
        self, context: EncodedContext, canvas: torch.Tensor, self_conditioning: torch.Tensor | None = None,
        columns: torch.Tensor | None = None, rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits (B, N, V) of the canvas against the cached context; (B, n, V) at `columns` (n,) only if given; the
        layers over `rows` (r,) only if given, as `Denoiser.reuses_canvas_keys` says."""
        state: _CanvasOf = context.state
        if state.plan is None or state.plan.shape != canvas.shape:  # once per fill and canvas shape
            self._use_finished_compile()
            positions = state.positions.expand(canvas.shape[0], -1)  # (B, N)
            state.plan = self.model.plan_denoising(positions, state.cache, state.known)
            rows = None  # a new plan holds no canvas keys and values yet
        with threads_for_pass(canvas.device, canvas.numel()):
            logits = self.model.denoise_planned(canvas, state.plan, columns, rows).float()
        self.canvas_positions_run += canvas.shape[0] * state.plan.last_rows
        return logits

    def _encoded(self, args: ContextArgs, cache: DiffillContextCache) -> EncodedContext:
        prefix_length = len(args.prefix_ids)
        canvas_positions = torch.arange(prefix_length, prefix_length + args.span_length, device=self.device)[None]
        return EncodedContext(list(args.prefix_ids), list(args.suffix_ids), args.span_length, args.batch_size,
                              _CanvasOf(cache, canvas_positions))  # (1, N) positions

    def _filler_id(self) -> int:
        """A token id for padding positions (never attended; read from the tokenizer's special tokens)."""
        for token in (self.special.pad_id, self.special.mask_id, *self.special.end_of_span_ids):
            if token is not None:
                return token
        raise ValueError(f"{self.path}: the tokenizer names no pad, mask or end-of-span token to pad with")


def _context_positions(prefix_length: int, suffix_length: int, span_length: int, device: torch.device) -> torch.Tensor:
    """(C,) position ids of prefix then suffix, leaving room for the span between them."""
    return torch.cat([torch.arange(prefix_length, device=device),
                      torch.arange(suffix_length, device=device) + prefix_length + span_length])


def _row_of(cache: DiffillContextCache, row: int, length: int, positions: torch.Tensor) -> DiffillContextCache:
    """Row `row` of a padded batch's cache, cut to its own `length` (views, no copy): a cache as if encoded alone."""
    keys = tuple(k[row : row + 1, :, :length] for k in cache.keys)
    values = tuple(v[row : row + 1, :, :length] for v in cache.values)
    single = DiffillContextCache(keys=keys, values=values, padding_mask=None)
    if cache.hidden is not None:
        single.hidden, single.positions = cache.hidden[row : row + 1, :length], positions[row : row + 1, :length]
    return single


def _head_of(cache: DiffillContextCache, length: int, copy: bool = False) -> DiffillContextCache:
    """The first `length` context positions of an unpadded cache: the encoding of that head alone, for a causal
    context. Views, or with `copy` tensors of their own (what the prefix cache keeps: not the suffix, nor the rest of
    a padded batch, is held on to)."""
    def cut(tensor: torch.Tensor, dim: int) -> torch.Tensor:
        head = tensor.narrow(dim, 0, length)
        return head.clone() if copy else head

    head = DiffillContextCache(keys=tuple(cut(k, 2) for k in cache.keys), values=tuple(cut(v, 2) for v in cache.values),
                               padding_mask=None)
    if cache.hidden is not None:
        head.hidden, head.positions = cut(cache.hidden, 1), cut(cache.positions, 1)
    return head


def _stack_padded(tensors: list[torch.Tensor], counts: list[int], length: int, fill: float = 0) -> torch.Tensor:
    """Each (1, H, C_i, D) tensor right-padded along dim 2 to `length` and repeated counts[i] times: (sum, H, L, D)."""
    rows = []
    for tensor, count in zip(tensors, counts):
        pad = length - tensor.shape[2]
        if pad:
            shape = (tensor.shape[0], tensor.shape[1], pad, *tensor.shape[3:])
            tensor = torch.cat([tensor, torch.full(shape, fill, dtype=tensor.dtype, device=tensor.device)], dim=2)
        rows.append(tensor.expand(count, *tensor.shape[1:]))
    return torch.cat(rows, dim=0)
