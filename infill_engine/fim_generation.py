"""The autoregressive twin at inference: the fill-in-the-middle prompt, and greedy decoding with a KV cache.

The twin (`diffill train --autoregressive`, `training/fim_objective.py`) is a `DiffillForInfilling` of the same size
and tokenizer as the diffusion model, with causal attention everywhere, trained on prefix-suffix-middle sequences:

    <|fim_prefix|> prefix <|fim_suffix|> suffix <|fim_middle|> middle <|endofspan|>

`fim_prompt` lays that out for training and for inference alike (as `canvas.layout_canvas` does for the diffusion
model). `generate_fim` encodes the prompt once (`encode_context`) and then writes one token per forward pass, each
pass running the layers over the new token only against the cached keys and values (`extend_context`, into buffers
reserved once for the whole middle: `reserve_context`, so no token copies the context); with
`use_cache=False` every token re-runs the whole sequence through `forward`, the path training takes, which is what
the tests compare the cache against.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from infill_engine.canvas import ContextConfig, trim_context
from infill_engine.special_tokens import END_OF_SPAN_TOKEN, FIM_TOKENS

logger = logging.getLogger(__name__)

FIM_SENTINELS = len(FIM_TOKENS)  # positions the prompt's sentinels take


@dataclass(frozen=True)
class FimTokens:
    """The twin's sentinel ids, read from its tokenizer (never literals)."""

    prefix_id: int  # <|fim_prefix|>: the prefix follows
    suffix_id: int  # <|fim_suffix|>: the suffix follows
    middle_id: int  # <|fim_middle|>: the middle follows, ended by end_id
    end_id: int  # <|endofspan|>: the middle ends here (the diffusion model's end-of-span token, same meaning)
    pad_id: int  # padding in batches
    never_ids: tuple[int, ...]  # special ids the middle never holds (sentinels, pad, mask, end of text)


def fim_tokens(tokenizer: Any) -> FimTokens:
    """The sentinel, end and pad ids of a twin's tokenizer; ValueError when it lacks the FIM tokens."""
    vocab = tokenizer.get_vocab()
    missing = [token for token in (*FIM_TOKENS, END_OF_SPAN_TOKEN) if token not in vocab]
    if missing or tokenizer.pad_token_id is None:
        raise ValueError(f"not an autoregressive twin's tokenizer: it lacks {', '.join(missing) or 'a pad token'} "
                         "(train one with `diffill train --autoregressive`)")
    end_id = int(vocab[END_OF_SPAN_TOKEN])
    specials = {int(i) for i in getattr(tokenizer, "all_special_ids", [])} | {int(vocab[t]) for t in FIM_TOKENS}
    return FimTokens(
        prefix_id=int(vocab[FIM_TOKENS[0]]), suffix_id=int(vocab[FIM_TOKENS[1]]), middle_id=int(vocab[FIM_TOKENS[2]]),
        end_id=end_id, pad_id=int(tokenizer.pad_token_id), never_ids=tuple(sorted(specials - {end_id})),
    )


def fim_prompt(prefix_ids: list[int], suffix_ids: list[int], tokens: FimTokens) -> list[int]:
    """The prefix-suffix-middle prompt; the middle's tokens follow it."""
    return [tokens.prefix_id, *prefix_ids, tokens.suffix_id, *suffix_ids, tokens.middle_id]


def fim_context_budget(max_positions: int, max_new_tokens: int, context: ContextConfig) -> ContextConfig:
    """The context budget for a fill of up to `max_new_tokens`, shrunk (as the diffusion engine shrinks it) so that
    sentinels, prefix, suffix and middle fit the model's positions."""
    room = max_positions - max_new_tokens - FIM_SENTINELS
    if room < 0:
        raise ValueError(f"a fill of {max_new_tokens} tokens does not fit this model's {max_positions} positions")
    prefix_tokens, suffix_tokens = context.prefix_tokens, context.suffix_tokens
    if prefix_tokens + suffix_tokens > room:
        suffix_tokens = min(suffix_tokens, room // 4)
        prefix_tokens = room - suffix_tokens
    return ContextConfig(prefix_tokens=prefix_tokens, suffix_tokens=suffix_tokens)


def first_suffix_line(suffix: str) -> str:
    """The suffix's first line with text in it, stripped ("" when it has none): what a middle must not repeat."""
    return next((line.strip() for line in suffix.split("\n") if line.strip()), "")


def cut_at_suffix_line(text: str, suffix_line: str) -> str | None:
    """`text` up to the first whole line of it (ended by a line break) that repeats `suffix_line`; None when no line
    does. A fill that writes the line following the hole has written past the hole."""
    if not suffix_line:
        return None
    start = 0
    while (end := text.find("\n", start)) != -1:
        if text[start:end].strip() == suffix_line:
            return text[:start]
        start = end + 1
    return None


@dataclass
class FimFill:
    """What the twin wrote for one hole, and what it cost."""

    text: str
    token_ids: list[int]
    forward_passes: int  # one for the prompt, then one per written token after the first
    ended: bool  # the model wrote the end token (else it stopped at max_new_tokens, a line break or the suffix)
    ms: dict[str, float] = field(default_factory=dict)  # tokenize, encode (the prompt), decode (the tokens), total


class FimGenerator:
    """Greedy fill-in-the-middle with an autoregressive twin and its tokenizer."""

    def __init__(
        self, model: Any, tokenizer: Any, context: ContextConfig | None = None, *, precision: str = "float32",
        compiled_layers: str = "off",
    ) -> None:
        if not getattr(model.config, "autoregressive", False):
            raise ValueError("not an autoregressive twin: its config lacks autoregressive=true")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.tokens = fim_tokens(tokenizer)
        self.context = context or ContextConfig()
        self.max_positions = int(model.config.max_position_embeddings)
        self.device = next(model.parameters()).device
        self._never = torch.tensor(self.tokens.never_ids, dtype=torch.long, device=self.device)
        self.precision = precision  # as loaded: float32, mixed, bfloat16 (for reports)
        self.compiled_layers = compiled_layers  # whether its layers run compiled, and why not (for reports)

    @torch.no_grad()
    def fill(
        self, prefix: str, suffix: str, max_new_tokens: int = 64, use_cache: bool = True, single_line: bool = False,
        min_tokens: int = 1, stop_at_suffix: bool = False,
    ) -> FimFill:
        """Greedily write the middle between `prefix` and `suffix`.

        Args:
            max_new_tokens: the most tokens written (the diffusion engine's span positions).
            use_cache: decode each token against the cached keys and values; False re-runs the whole sequence.
            single_line: stop at the first line break (the text is cut there), as ghost text does.
            min_tokens: the end token is not allowed before this many tokens (an empty fill is never offered).
            stop_at_suffix: stop once a written line repeats the suffix's first line with text, and drop that line
                (as editors' fill-in-the-middle clients cut a completion that runs into the code after the cursor).
        """
        start = time.perf_counter()
        ms: dict[str, float] = {}
        budget = fim_context_budget(self.max_positions, max_new_tokens, self.context)
        trimmed = trim_context(self.tokenizer, prefix, suffix, budget)
        prompt = torch.tensor([fim_prompt(trimmed.prefix_ids, trimmed.suffix_ids, self.tokens)], device=self.device)
        ms["tokenize"] = (time.perf_counter() - start) * 1000
        written: list[int] = []
        ended = False
        forwards = 1
        encode_start = time.perf_counter()
        if use_cache:
            positions = torch.arange(prompt.shape[1], device=self.device)[None]  # (1, P)
            cache = self.model.encode_context(prompt, positions)
            logits = self.model.next_token_logits(cache)  # (1, V)
            cache = self.model.reserve_context(cache, max_new_tokens)  # each token's keys written in place
        else:
            logits = self._uncached_logits(prompt)
        ms["encode"] = (time.perf_counter() - encode_start) * 1000
        decode_start = time.perf_counter()
        suffix_line = first_suffix_line(suffix) if stop_at_suffix else ""
        cut: str | None = None
        while True:
            token = self._choose(logits, allow_end=len(written) >= min_tokens)
            if token == self.tokens.end_id:
                ended = True
                break
            written.append(token)
            breaks_line = "\n" in self.tokenizer.decode([token])
            if breaks_line and suffix_line:
                cut = cut_at_suffix_line(self.tokenizer.decode(written), suffix_line)
            if len(written) >= max_new_tokens or (single_line and breaks_line) or cut is not None:
                break
            forwards += 1
            if use_cache:
                position = torch.tensor([[prompt.shape[1] + len(written) - 1]], device=self.device)  # (1, 1)
                cache = self.model.extend_context(torch.tensor([[token]], device=self.device), position, cache)
                logits = self.model.next_token_logits(cache)
            else:
                logits = self._uncached_logits(torch.cat([prompt, torch.tensor([written], device=self.device)], 1))
        ms["decode"] = (time.perf_counter() - decode_start) * 1000
        text = self.tokenizer.decode(written) if cut is None else cut
        if single_line and "\n" in text:
            text = text[: text.index("\n")]
        ms["total"] = (time.perf_counter() - start) * 1000
        return FimFill(text=text, token_ids=written, forward_passes=forwards, ended=ended, ms=ms)

    def _choose(self, logits: torch.Tensor, allow_end: bool) -> int:
        """The argmax of one row of logits (1, V), never a special id, and the end token only when allowed."""
        scores = logits[0].clone()  # (V,)
        scores[self._never] = float("-inf")
        if not allow_end:
            scores[self.tokens.end_id] = float("-inf")
        return int(scores.argmax())

    def _uncached_logits(self, ids: torch.LongTensor) -> torch.Tensor:
        """Next-token logits (1, V) from one training-path pass over the whole sequence.

        A shift_logits model's output at position t predicts token t from position t - 1, so one padding position is
        appended and its output read: causal attention keeps it from changing any earlier position.
        """
        padded = torch.cat([ids, torch.full_like(ids[:, :1], self.tokens.pad_id)], dim=1)  # (1, T + 1)
        real = torch.ones_like(padded, dtype=torch.bool)
        real[:, -1] = False
        output = self.model(input_ids=padded, canvas_mask=torch.zeros_like(real), attention_mask=real)
        return output.logits[:, -1]  # (1, V)


def load_twin(
    path: str, device: str = "cpu", context: ContextConfig | None = None, dtype: str = "float32",
    compiled_layers: str = "off",
) -> FimGenerator:
    """A generator over the autoregressive twin saved at `path` (a checkpoint or an export), loaded as the diffusion
    model is (`loading.load_denoiser`: the same `dtype` choice, packed weights, and its layers compiled where
    `compiled_layers` is auto and `diffill compile --model PATH` has cached them), so that the two compare fairly."""
    from infill_engine.loading import load_denoiser

    denoiser = load_denoiser(path, family="diffill", device=device, dtype=dtype, compiled_layers=compiled_layers)
    return FimGenerator(denoiser.model, denoiser.tokenizer, context, precision=denoiser.precision,
                        compiled_layers=getattr(denoiser, "compiled_layers_state", "off"))
