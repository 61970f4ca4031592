"""Special tokens: the strings diffill's own models use, and the ids a denoiser needs, read from the model's tokenizer
and config (never literals).

The strings are defined here once, in a module without torch, for the tokenizer trainer, the conversion of causal
language models and the loader alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The special tokens of diffill's own tokenizers (the embedded model's, and those added to a converted causal LM).
PAD_TOKEN = "<|pad|>"
MASK_TOKEN = "<|mask|>"
END_OF_SPAN_TOKEN = "<|endofspan|>"  # the span ends here; what follows it on the canvas is dropped
END_OF_TEXT_TOKEN = "<|endoftext|>"
# Fill-in-the-middle sentinels of the autoregressive twin (training/fim_objective.py, fim_generation.py): added to
# its copy of the tokenizer only, in this order, in StarCoder's prefix-suffix-middle layout. The diffusion models
# never see them.
FIM_PREFIX_TOKEN = "<|fim_prefix|>"
FIM_SUFFIX_TOKEN = "<|fim_suffix|>"
FIM_MIDDLE_TOKEN = "<|fim_middle|>"
FIM_TOKENS = (FIM_PREFIX_TOKEN, FIM_SUFFIX_TOKEN, FIM_MIDDLE_TOKEN)

# Names under which diffusion checkpoints register their mask token, in order of preference. These are token
# *strings* looked up in the tokenizer's vocabulary; the ids always come from the tokenizer.
MASK_TOKEN_NAMES = ("<|mdm_mask|>", MASK_TOKEN, "<mask>", "[MASK]")
# Our own end-of-span token (diffill models are trained with it); other models end a span with their EOS.
END_OF_SPAN_TOKEN_NAMES = (END_OF_SPAN_TOKEN,)
# DreamOn's length-control tokens: a masked position predicted as expand becomes two masked positions, one
# predicted as delete is removed (https://github.com/DreamLM/DreamOn). Ids come from the generation config
# (expand_token_id, delete_token_id) or the tokenizer's vocabulary.
EXPAND_TOKEN_NAMES = ("<|expand|>",)
DELETE_TOKEN_NAMES = ("<|delete|>",)


@dataclass(frozen=True)
class SpecialTokens:
    """Token ids with a role in the canvas, resolved once at load time."""

    mask_id: int | None  # the noise token of masked-diffusion models; None for uniform-noise models
    end_of_span_ids: tuple[int, ...]  # any of these ends the span; what follows is dropped
    pad_id: int | None  # padding in batches and after the end of a span
    bos_id: int | None  # put before an empty prefix when the model reads logits shifted by one
    cls_id: int | None  # encoder MLMs wrap the sequence in [CLS] ... [SEP]
    sep_id: int | None
    ids_never_generated: tuple[int, ...]  # special ids the denoiser must never write into a span
    expand_id: int | None = None  # DreamOn: this masked position becomes two; None for fixed-length models
    delete_id: int | None = None  # DreamOn: this position is removed from the span


def _vocab_id(tokenizer: Any, names: tuple[str, ...]) -> int | None:
    """The id of the first of `names` that the tokenizer knows as a whole token."""
    vocab = tokenizer.get_vocab()
    for name in names:
        if name in vocab:
            return int(vocab[name])
    return None


def _as_ids(value: Any) -> tuple[int, ...]:
    """Normalise an id, a list of ids or None to a tuple."""
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value)
    return (int(value),)


def resolve_special_tokens(tokenizer: Any, config: Any, generation_config: Any = None) -> SpecialTokens:
    """Read mask, end-of-span, pad and wrapper ids from a tokenizer, a model config and a generation config."""
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    mask_id = getattr(tokenizer, "mask_token_id", None)
    if mask_id is None:
        mask_id = _vocab_id(tokenizer, MASK_TOKEN_NAMES)
    if mask_id is None:
        for source in (config, text_config, generation_config):
            if source is not None and getattr(source, "mask_token_id", None) is not None:
                mask_id = int(source.mask_token_id)
                break

    end_of_span = _vocab_id(tokenizer, END_OF_SPAN_TOKEN_NAMES)
    if end_of_span is not None:
        end_ids: tuple[int, ...] = (end_of_span,)
    else:
        end_ids = _as_ids(getattr(tokenizer, "eos_token_id", None))
        for source in (generation_config, text_config):
            if source is not None:
                end_ids += tuple(i for i in _as_ids(getattr(source, "eos_token_id", None)) if i not in end_ids)
        if not end_ids:
            end_ids = _as_ids(getattr(tokenizer, "sep_token_id", None))

    pad_id = getattr(tokenizer, "pad_token_id", None)
    if pad_id is None:
        pad_id = getattr(text_config, "pad_token_id", None)
    bos_id = getattr(tokenizer, "bos_token_id", None)
    if bos_id is None:
        bos_id = getattr(text_config, "bos_token_id", None)

    never = {int(i) for i in getattr(tokenizer, "all_special_ids", [])} - set(end_ids)
    for token_id in (mask_id, pad_id, bos_id):
        if token_id is not None:
            never.add(int(token_id))
    never -= set(end_ids)
    expand_id, delete_id = _length_control_ids(tokenizer, generation_config)
    return SpecialTokens(
        mask_id=None if mask_id is None else int(mask_id),
        end_of_span_ids=end_ids,
        pad_id=None if pad_id is None else int(pad_id),
        bos_id=None if bos_id is None else int(bos_id),
        cls_id=getattr(tokenizer, "cls_token_id", None),
        sep_id=getattr(tokenizer, "sep_token_id", None),
        ids_never_generated=tuple(sorted((never | {i for i in (expand_id, delete_id) if i is not None}) - set(end_ids))),
        expand_id=expand_id,
        delete_id=delete_id,
    )


def _length_control_ids(tokenizer: Any, generation_config: Any) -> tuple[int | None, int | None]:
    """DreamOn's expand and delete ids (both, or neither): from the generation config, else the vocabulary."""
    expand = getattr(generation_config, "expand_token_id", None) if generation_config is not None else None
    delete = getattr(generation_config, "delete_token_id", None) if generation_config is not None else None
    if expand is None:
        expand = _vocab_id(tokenizer, EXPAND_TOKEN_NAMES)
    if delete is None:
        delete = _vocab_id(tokenizer, DELETE_TOKEN_NAMES)
    if expand is None or delete is None:
        return None, None
    return int(expand), int(delete)
