"""Tiny random-weight checkpoints of every supported family, built on the fly and saved like real ones.

Each builder writes a directory with `save_pretrained` (config, safetensors weights, tokenizer) and returns its
path; tests then load it through `infill_engine.loading`, the path a user's checkpoint takes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from infill_engine.special_tokens import END_OF_SPAN_TOKEN, END_OF_TEXT_TOKEN, MASK_TOKEN, PAD_TOKEN

CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "def scale(values, factor):\n    return [v * factor for v in values]\n",
    "for i in range(10):\n    print(i, i * i)\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "function add(a, b) {\n  return a + b;\n}\n",
    "if (x > 0) { y = compute(x, [1, 2, 3]); }\n",
    "fn main() { let v = vec![1, 2]; println!(\"{}\", v.len()); }\n",
    "result = compute(a, b)\nprint(result)\n",
    "import os\nimport sys\n\nvalues = {'a': 1, 'b': (2, 3)}\n",
]


def diffill_tokenizer() -> PreTrainedTokenizerFast:
    """A tiny tokenizer with the embedded model's special tokens (for scripted engines)."""
    from infill_engine.special_tokens import END_OF_SPAN_TOKEN, END_OF_TEXT_TOKEN, MASK_TOKEN, PAD_TOKEN

    return build_tokenizer({"pad": PAD_TOKEN, "mask": MASK_TOKEN, "eos": END_OF_TEXT_TOKEN,
                            "end_of_span": END_OF_SPAN_TOKEN})


def build_tokenizer(specials: dict[str, str], vocab_size: int = 200) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on a few lines of code; `specials` maps role -> token string."""
    ordered = list(dict.fromkeys(specials.values()))
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    # The alphabet is printable ASCII, space, tab and line feed (not all 256 bytes), so that even a random-weight
    # model writes printable text: the syntax gate rejects control characters and U+FFFD from partial byte sequences.
    byte_chars = pre_tokenizers.ByteLevel.alphabet()  # the byte-to-character map's image
    printable = [chr(c) for c in range(0x21, 0x7F)] + ["\u0120", "\u0109", "\u010a"]  # + space, tab, LF as mapped
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=ordered, show_progress=False,
        initial_alphabet=[c for c in printable if c in byte_chars],
    )
    tokenizer.train_from_iterator(CORPUS * 3, trainer=trainer)
    roles = {f"{role}_token": token for role, token in specials.items() if role in
             ("mask", "pad", "eos", "bos", "cls", "sep", "unk")}
    extra = [t for role, t in specials.items() if f"{role}_token" not in roles]
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, **roles)
    if extra:
        fast.add_special_tokens({"additional_special_tokens": extra})
    return fast


def _save(model, tokenizer, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def build_diffill(directory: Path, seed: int = 0, hidden: int = 32, layers: int = 2, **options: Any) -> Path:
    """The embedded model's own architecture at a tiny size (`options`: other DiffillConfig fields)."""
    from infill_engine.diffill_model import DiffillConfig, DiffillForInfilling

    tokenizer = build_tokenizer({"pad": PAD_TOKEN, "mask": MASK_TOKEN, "eos": END_OF_TEXT_TOKEN,
                                 "end_of_span": END_OF_SPAN_TOKEN})
    torch.manual_seed(seed)
    config = DiffillConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=2,
        intermediate_size=2 * hidden, max_position_embeddings=1024,
        mask_token_id=tokenizer.mask_token_id, pad_token_id=tokenizer.pad_token_id,
        end_of_span_token_id=tokenizer.convert_tokens_to_ids(END_OF_SPAN_TOKEN), **options,
    )
    return _save(DiffillForInfilling(config), tokenizer, directory)


def build_llama(directory: Path, seed: int = 0) -> Path:
    """A tiny random Llama causal LM with grouped-query attention, whose tokenizer has no mask token."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_tokenizer({"eos": END_OF_TEXT_TOKEN})
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
    )
    return _save(LlamaForCausalLM(config).eval(), tokenizer, directory)


def build_diffusion_gemma(directory: Path, seed: int = 0, canvas_length: int = 16) -> Path:
    """A tiny DiffusionGemma (text MoE plus a minimal vision tower, which the class always builds)."""
    from transformers import (
        DiffusionGemmaConfig,
        DiffusionGemmaForBlockDiffusion,
        DiffusionGemmaTextConfig,
        Gemma4VisionConfig,
    )

    tokenizer = build_tokenizer({"pad": "<pad>", "eos": "<eos>", "bos": "<bos>"})
    ids = {name: tokenizer.convert_tokens_to_ids(name) for name in ("<pad>", "<eos>", "<bos>")}
    text = DiffusionGemmaTextConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, global_head_dim=16, num_experts=4,
        top_k_experts=2, moe_intermediate_size=16, sliding_window=64,
        layer_types=["sliding_attention", "full_attention"], max_position_embeddings=1024,
        pad_token_id=ids["<pad>"], eos_token_id=ids["<eos>"], bos_token_id=ids["<bos>"],
    )
    vision = Gemma4VisionConfig(hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=1,
                                num_key_value_heads=1, head_dim=8, position_embedding_size=16)
    torch.manual_seed(seed)
    model = DiffusionGemmaForBlockDiffusion(DiffusionGemmaConfig(text_config=text, vision_config=vision,
                                                                 canvas_length=canvas_length))
    model.generation_config.pad_token_id = ids["<pad>"]
    model.generation_config.eos_token_id = ids["<eos>"]
    return _save(model, tokenizer, directory)


def build_bert(directory: Path, seed: int = 0) -> Path:
    """A tiny encoder masked LM (BERT), the family any AutoModelForMaskedLM checkpoint goes through."""
    from transformers import BertConfig, BertForMaskedLM

    tokenizer = build_tokenizer({"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"})
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=512, pad_token_id=tokenizer.pad_token_id)
    return _save(BertForMaskedLM(config), tokenizer, directory)


def build_remote_code(directory: Path, family: str, seed: int = 0, extra_tokens: tuple[str, ...] = (),
                      rope: bool = False) -> Path:
    """A Dream- or LLaDA-style checkpoint whose modelling code ships in the directory (auto_map); `extra_tokens`
    are added as special tokens (DreamOn's <|expand|> and <|delete|>); `rope`: Dream's own architecture (rotary
    positions, grouped-query attention, a key/value cache) instead of a plain encoder."""
    from tests.remote_code.modeling_tiny_masked import (
        TinyDreamConfig,
        TinyDreamModel,
        TinyLLaDAConfig,
        TinyLLaDAModel,
        TinyRopeDreamConfig,
        TinyRopeDreamModel,
        TinyRopeLLaDAConfig,
        TinyRopeLLaDAModel,
    )

    if family == "dream":
        tokenizer = build_tokenizer({"eos": "<|endoftext|>", "pad": "<|endoftext|>", "mask": "<|mask|>",
                                     **{f"extra_{i}": token for i, token in enumerate(extra_tokens)}})
        config_class, model_class = (TinyRopeDreamConfig, TinyRopeDreamModel) if rope else (TinyDreamConfig,
                                                                                             TinyDreamModel)
    else:
        tokenizer = build_tokenizer({"eos": "<|eot_id|>", "pad": "<|eot_id|>", "bos": "<|startoftext|>",
                                     "mdm_mask": "<|mdm_mask|>"})
        config_class, model_class = (TinyRopeLLaDAConfig, TinyRopeLLaDAModel) if rope else (TinyLLaDAConfig,
                                                                                             TinyLLaDAModel)
    torch.manual_seed(seed)
    model = model_class(config_class(vocab_size=len(tokenizer)))
    _save(model, tokenizer, directory)
    source = Path(__file__).parent / "remote_code" / "modeling_tiny_masked.py"
    shutil.copy(source, directory / "modeling_tiny_masked.py")
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text())
    config["auto_map"] = {
        "AutoConfig": f"modeling_tiny_masked.{config_class.__name__}",
        "AutoModel": f"modeling_tiny_masked.{model_class.__name__}",
    }
    config_path.write_text(json.dumps(config, indent=2))
    return directory


NEVER_RUN = "raise RuntimeError('a checkpoint loaded as Qwen2 must never run its own modelling code')\n"


def build_dream_qwen2(directory: Path, seed: int = 0, tie: bool = False) -> Path:
    """A checkpoint laid out as Dream's, DiffuCoder's and Open-dCoder's are: Qwen2's weights, `model_type` "Dream",
    its own modelling and tokenizer classes named in `auto_map` (here code that raises when run), and the rotary
    base as a top-level `rope_theta`, as those config files have it."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = build_tokenizer({"eos": "<|endoftext|>", "pad": "<|endoftext|>", "mask": "<|mask|>"})
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=tie, rope_theta=50_000.0)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():  # peaked rather than flat predictions, as in test_dual_cache's tiny models
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.normal_(0.0, 0.3)
    _save(model, tokenizer, directory)
    saved = json.loads((directory / "config.json").read_text())
    saved = {key: value for key, value in saved.items() if key not in ("rope_parameters", "model_type")}
    saved.update(model_type="Dream", architectures=["DreamModel"], rope_theta=50_000.0,
                 mask_token_id=tokenizer.mask_token_id,
                 auto_map={"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"})
    (directory / "config.json").write_text(json.dumps(saved, indent=2))
    tokenizer_config = json.loads((directory / "tokenizer_config.json").read_text())
    tokenizer_config.update(tokenizer_class="DreamTokenizer",
                            auto_map={"AutoTokenizer": ["tokenization_dream.DreamTokenizer", None]})
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    for name in ("configuration_dream.py", "modeling_dream.py", "tokenization_dream.py"):
        (directory / name).write_text(NEVER_RUN)
    return directory


def copy_stdlib_sources(directory: Path, modules: tuple[str, ...]) -> Path:
    """`directory` holding the source files of these standard-library modules (real Python to train on)."""
    import importlib
    import inspect

    for name in modules:
        shutil.copy(inspect.getsourcefile(importlib.import_module(name)), directory / f"{name}.py")
    return directory
