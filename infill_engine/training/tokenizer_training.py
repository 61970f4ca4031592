"""The embedded model's tokenizer: byte-level BPE trained on the corpus, whose decode(encode(text)) is the text.

Byte-level BPE maps every byte to a symbol before merging, so tabs, runs of spaces, trailing spaces, CR LF line
ends and any Unicode text are encoded without loss; there is no normaliser and no prefix space, and decoding never
"cleans up" spaces. Indentation is meaning in code: a tokenizer that changed it would corrupt every fill.
"""

from __future__ import annotations

import logging
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from infill_engine.special_tokens import END_OF_SPAN_TOKEN, END_OF_TEXT_TOKEN, MASK_TOKEN, PAD_TOKEN

logger = logging.getLogger(__name__)

SPECIAL_TOKENS = (PAD_TOKEN, MASK_TOKEN, END_OF_SPAN_TOKEN, END_OF_TEXT_TOKEN)
DEFAULT_VOCAB_SIZE = 8192
MAX_TOKEN_CHARS = 24  # longer merges are rare runs like '=====' that waste vocabulary


def train_tokenizer(
    texts: Iterable[str], vocab_size: int = DEFAULT_VOCAB_SIZE, min_frequency: int = 2
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer with the project's special tokens on `texts`."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + len(SPECIAL_TOKENS):
        raise ValueError(
            f"vocab_size must be at least {len(alphabet) + len(SPECIAL_TOKENS)} (256 bytes and "
            f"{len(SPECIAL_TOKENS)} special tokens), got {vocab_size}"
        )
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=alphabet,
        max_token_length=MAX_TOKEN_CHARS,
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    logger.info("trained a byte-level BPE tokenizer of %d tokens", tokenizer.get_vocab_size())
    return wrap_tokenizer(tokenizer)


def wrap_tokenizer(tokenizer: Tokenizer) -> PreTrainedTokenizerFast:
    """A transformers tokenizer over `tokenizer` with pad, mask, end-of-text and end-of-span registered."""
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token=PAD_TOKEN,
        mask_token=MASK_TOKEN,
        eos_token=END_OF_TEXT_TOKEN,
        clean_up_tokenization_spaces=False,  # never touch whitespace on decode
        model_max_length=1_000_000,  # documents are cut by the training code, not by the tokenizer
    )
    fast.add_special_tokens({"additional_special_tokens": [END_OF_SPAN_TOKEN]})
    return fast


def chars_and_tokens(tokenizer: PreTrainedTokenizerFast, documents: Iterable[tuple[str, str]]) -> dict[str, tuple[int, int]]:
    """Total characters and tokens of `(group, text)` pairs, by group, in one tokenizing pass over the texts."""
    totals: dict[str, tuple[int, int]] = {}
    batch: list[tuple[str, str]] = []

    def flush() -> None:
        if batch:
            encoded = tokenizer([text for _, text in batch], add_special_tokens=False)["input_ids"]
            for (group, text), ids in zip(batch, encoded):
                chars, tokens = totals.get(group, (0, 0))
                totals[group] = (chars + len(text), tokens + len(ids))
            batch.clear()

    for group, text in documents:
        batch.append((group, text))
        if len(batch) == 64:
            flush()
    flush()
    return totals
