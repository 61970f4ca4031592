"""Loading a checkpoint from disk and choosing the adapter for its family.

The family is read from the checkpoint's `config.json` (`model_type` and `architectures`); `family=` overrides it.
Custom modelling code in a checkpoint (`auto_map`) runs only when the caller passes `trust_remote_code=True`.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the adapters import torch; loading's constants and checks must not
    from infill_engine.adapters.base import Denoiser

logger = logging.getLogger(__name__)

from infill_engine.interface import (  # noqa: E402 - one list of families, torch-free
    DEFAULT_COMPILED_LAYERS,
    DEFAULT_DUAL_CACHE,
    FAMILIES,
)
# model_type (lower case) -> family, for the checkpoints we know
KNOWN_MODEL_TYPES = {
    "diffill": "diffill",
    "diffusion_gemma": "diffusion_gemma",
    "llada": "llada",
    "llada_moe": "llada",
    "llada2_moe": "llada",
    "dream": "dream",
    "coda": "dream",
    "open_dcoder": "dream",
}
SHIFTED_FAMILIES = {"dream"}
DUAL_CACHE_FAMILIES = {"llada", "dream"}  # bidirectional LMs run whole each step, which the dual cache approximates
PACKAGED_MODEL = Path(__file__).parent / "model"  # the embedded default checkpoint, when one is shipped
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")  # weights formats that unpickle: never loaded
# Dream, Dream-Coder, DiffuCoder and Open-dCoder are Qwen2.5 weights read bidirectionally: a `dream` checkpoint whose
# weights are exactly Qwen2's is loaded through transformers' own Qwen2 with `is_causal=False`, so its own modelling
# code never runs and the dual cache applies. These config values carry over; the rest are Qwen2's defaults.
QWEN2_CONFIG_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps",
                     "rope_theta", "rope_scaling", "rope_parameters", "tie_word_embeddings", "attention_dropout",
                     "pad_token_id", "bos_token_id", "eos_token_id", "mask_token_id")


class ModelLoadError(Exception):
    """A model directory is missing, incomplete, corrupt or of an unsupported family."""


@dataclass(frozen=True)
class ModelInfo:
    """What a checkpoint is, read from its config without loading weights."""

    path: str
    family: str
    model_type: str
    architectures: tuple[str, ...]
    needs_remote_code: bool
    reads_as_qwen2: bool = False  # a `dream` checkpoint with Qwen2's weights: loaded as bidirectional Qwen2


@dataclass(frozen=True)
class StoredWeights:
    """What a checkpoint's weights files hold, read from their headers before anything is loaded."""

    parameters: int
    dtype: str  # the safetensors dtype that most parameters are stored in: "F32", "BF16", "F16", ...


def default_model_path() -> Path | None:
    """The shipped checkpoint inside the package, or None when this build has none."""
    return PACKAGED_MODEL if (PACKAGED_MODEL / "config.json").is_file() else None


def read_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The checkpoint's config.json as a dict, with clear errors for a missing or broken directory."""
    directory = Path(path)
    if not directory.exists():
        raise ModelLoadError(f"model directory {str(directory)!r} does not exist")
    if not directory.is_dir():
        raise ModelLoadError(f"{str(directory)!r} is not a directory; a model is a directory with config.json")
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise ModelLoadError(f"{str(directory)!r} is not a model directory: it has no config.json")
    try:
        return json.loads(config_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ModelLoadError(f"{config_file} is not valid JSON ({error}); the checkpoint is corrupt") from error


def detect_family(config: dict[str, Any]) -> str:
    """Which adapter family a config belongs to: from model_type, then from the architecture names."""
    model_type = str(config.get("model_type", "")).lower()
    if model_type in KNOWN_MODEL_TYPES:
        return KNOWN_MODEL_TYPES[model_type]
    architectures = " ".join(config.get("architectures") or []).lower()
    for marker, family in (("llada", "llada"), ("dream", "dream"), ("diffucoder", "dream"), ("coda", "dream")):
        if marker in architectures:
            return family
    if architectures.endswith("formaskedlm") or "formaskedlm" in architectures:
        return "mlm"
    raise ModelLoadError(
        f"cannot tell which diffusion family model_type {model_type!r} (architectures: {architectures or 'none'}) "
        f"belongs to; pass a family explicitly, one of: {', '.join(FAMILIES)}"
    )


def inspect_model(path: str | os.PathLike[str], family: str | None = None) -> ModelInfo:
    """Read a checkpoint's family and needs without loading its weights."""
    config = read_config(path)
    if family is not None and family not in FAMILIES:
        raise ModelLoadError(f"unknown model family {family!r}; allowed: {', '.join(FAMILIES)}")
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = str(config.get("model_type", ""))
    family = family or detect_family(config)
    as_qwen2 = family == "dream" and has_qwen2_weights(path, config)
    native = model_type in CONFIG_MAPPING or model_type == "diffill" or as_qwen2
    return ModelInfo(
        path=str(path),
        family=family,
        model_type=model_type,
        architectures=tuple(config.get("architectures") or ()),
        needs_remote_code=bool(config.get("auto_map")) and not native,
        reads_as_qwen2=as_qwen2,
    )


def qwen2_weight_names(config: dict[str, Any]) -> set[str]:
    """The tensor names of transformers' Qwen2ForCausalLM for a config (the output layer's when it is not tied)."""
    names = {"model.embed_tokens.weight", "model.norm.weight"}
    layer = ["input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.o_proj.weight",
             *(f"self_attn.{p}_proj.{w}" for p in "qkv" for w in ("weight", "bias")),
             *(f"mlp.{p}_proj.weight" for p in ("gate", "up", "down"))]
    names |= {f"model.layers.{i}.{name}" for i in range(int(config.get("num_hidden_layers") or 0)) for name in layer}
    return names if config.get("tie_word_embeddings") else names | {"lm_head.weight"}


def safetensors_headers(path: str | os.PathLike[str]) -> dict[str, dict[str, Any]] | None:
    """Every tensor of a checkpoint's safetensors files, by name: its header entry (dtype, shape, offsets); None
    when a file is unreadable or not safetensors (the load says so later)."""
    tensors: dict[str, dict[str, Any]] = {}
    try:
        for weights in sorted(Path(path).glob("*.safetensors")):
            with open(weights, "rb") as handle:
                size = int.from_bytes(handle.read(8), "little")
                if not 0 < size <= 100 << 20:  # the format caps its header at 100 MB
                    return None
                header = json.loads(handle.read(size))
            tensors.update({name: entry for name, entry in header.items() if name != "__metadata__"})
        return tensors
    except (OSError, ValueError, AttributeError):
        return None


def safetensors_names(path: str | os.PathLike[str]) -> set[str]:
    """The tensor names of a checkpoint's safetensors weights, read from the index or the files' headers."""
    index = Path(path) / "model.safetensors.index.json"
    try:
        if index.is_file():
            return set(json.loads(index.read_text(encoding="utf-8")).get("weight_map") or {})
    except (OSError, ValueError, AttributeError):
        return set()
    return set(safetensors_headers(path) or {})


def stored_weights(path: str | os.PathLike[str]) -> StoredWeights | None:
    """How many parameters a checkpoint's safetensors files hold and the dtype most are stored in; None when they
    cannot be read."""
    from collections import Counter

    headers = safetensors_headers(path)
    if not headers:
        return None
    by_dtype: Counter[str] = Counter()
    try:
        for entry in headers.values():
            by_dtype[str(entry["dtype"])] += math.prod(int(n) for n in entry["shape"])
    except (KeyError, TypeError, ValueError):
        return None
    return StoredWeights(parameters=sum(by_dtype.values()), dtype=by_dtype.most_common(1)[0][0])


def has_qwen2_weights(path: str | os.PathLike[str], config: dict[str, Any]) -> bool:
    """Whether a checkpoint's weights are exactly Qwen2's for its config (a tied output layer may be stored too)."""
    if not config.get("num_hidden_layers"):
        return False
    names, expected = safetensors_names(path), qwen2_weight_names(config)
    return names == expected or (bool(config.get("tie_word_embeddings")) and names == expected | {"lm_head.weight"})


def resolve_checkpoint(path: str) -> str:
    """The local directory of a checkpoint directory or a hub id (downloaded into the hub cache if needed)."""
    from infill_engine.hub import HubError, resolve_model_path

    try:
        return resolve_model_path(path)
    except HubError as error:
        raise ModelLoadError(str(error)) from None


def load_denoiser(
    path: str | os.PathLike[str] | None = None,
    family: str | None = None,
    device: str = "auto",
    dtype: str = "auto",
    trust_remote_code: bool = False,
    dual_cache: int = DEFAULT_DUAL_CACHE,
    compiled_layers: str = DEFAULT_COMPILED_LAYERS,
) -> "Denoiser":
    """Load a checkpoint directory or hub id (the shipped model when `path` is None) behind its family's adapter;
    `dual_cache` N >= 1: llada and dream models refresh their prefix/suffix keys and values every N steps;
    `compiled_layers` auto: a diffill model uses its layers compiled for this CPU when they are cached."""
    from infill_engine.device import choose_device, dtype_choice, torch_dtype

    if path is not None:
        path = resolve_checkpoint(str(path))
    if path is None:
        path = default_model_path()
        if path is None:
            raise ModelLoadError(
                "no model configured and this build ships no embedded model; name a model directory (the --model "
                "flag, or the server's model setting)"
            )
    info = inspect_model(path, family)
    if info.needs_remote_code and not trust_remote_code:
        raise ModelLoadError(
            f"{info.path} ({info.model_type}) ships its own modelling code (auto_map in config.json), which diffill "
            "runs only when you allow it: turn on trust_remote_code (the --trust-remote-code flag, or the server's "
            "trustRemoteCode setting) if you trust this checkpoint"
        )
    torch_device = choose_device(device)
    precision = dtype_choice(torch_device, dtype, stored_weights(info.path),
                             compiled=compiles_layers(info.model_type, compiled_layers))[0]
    try:
        model, tokenizer = _load_weights(info, torch_dtype(precision), trust_remote_code)
    except ModelLoadError:
        raise
    except Exception as error:  # noqa: BLE001 - any failure here is the checkpoint's (corrupt, truncated, alien)
        raise ModelLoadError(f"could not load the model in {info.path}: {error}") from error
    model.to(torch_device).eval()
    _own_memory(model)
    if precision == "mixed":
        _mix_precision(model, info)
    _pack_weights(model, info)
    denoiser = _wrap(info, model, tokenizer, dual_cache)
    if compiled_layers == "auto" and hasattr(denoiser, "load_compiled_layers"):
        denoiser.load_compiled_layers()
    return denoiser


def compiles_layers(model_type: str, compiled_layers: str) -> bool:
    """Whether a model of this config.json `model_type` runs layers compiled for the CPU where a package is cached
    (the diffill family's, `compiled_layers.py`) under this `compiled_layers` setting."""
    return compiled_layers == "auto" and model_type.lower() == "diffill"


def _load_weights(info: ModelInfo, dtype: Any, trust_remote_code: bool) -> tuple[Any, Any]:
    """The model and tokenizer objects of a checkpoint, through the transformers classes of its family."""
    import transformers

    if not any(Path(info.path).glob("*.safetensors")):
        pickled = sorted(p.name for p in Path(info.path).iterdir() if p.suffix in PICKLE_SUFFIXES)
        raise ModelLoadError(
            f"{info.path} has a config.json but no weights in safetensors format (*.safetensors)"
            + (f"; diffill never loads pickled weights ({', '.join(pickled)}), which can run code: convert them to "
               "safetensors with a tool you trust" if pickled else "")
        )
    options: dict[str, Any] = {"dtype": dtype, "use_safetensors": True}  # never a pickle (*.bin, *.pt)
    if info.family == "diffusion_gemma":
        model = transformers.DiffusionGemmaForBlockDiffusion.from_pretrained(info.path, **options)
    elif info.family == "diffill":
        import infill_engine.diffill_model  # noqa: F401  (registers the classes with the Auto classes)
        from infill_engine.diffill_model.delta import is_delta_model, load_delta_model

        if is_delta_model(info.path):  # the trained part of a model whose base is a pip dependency
            return load_delta_model(info.path, dtype)
        model = transformers.AutoModelForMaskedLM.from_pretrained(info.path, **options)
    elif info.family == "mlm":
        model = transformers.AutoModelForMaskedLM.from_pretrained(
            info.path, trust_remote_code=trust_remote_code, **options
        )
    elif info.reads_as_qwen2:
        model = transformers.Qwen2ForCausalLM.from_pretrained(info.path, config=bidirectional_qwen2_config(info),
                                                              **options)
        return model, _tokenizer_without_remote_code(info.path, trust_remote_code)
    else:
        auto_map = read_config(info.path).get("auto_map") or {}
        auto_class = transformers.AutoModel
        if "AutoModelForCausalLM" in auto_map or not auto_map:
            auto_class = transformers.AutoModelForCausalLM
        model = auto_class.from_pretrained(info.path, trust_remote_code=trust_remote_code, **options)
    tokenizer = transformers.AutoTokenizer.from_pretrained(info.path, trust_remote_code=trust_remote_code)
    return model, tokenizer


def bidirectional_qwen2_config(info: ModelInfo) -> Any:
    """transformers' Qwen2Config of a Dream-family checkpoint, reading the sequence bidirectionally."""
    from transformers import Qwen2Config

    config = read_config(info.path)
    qwen2 = Qwen2Config(**{key: config[key] for key in QWEN2_CONFIG_KEYS if config.get(key) is not None})
    qwen2.is_causal = False  # Dream reads the whole sequence both ways
    return qwen2


def _tokenizer_without_remote_code(path: str, trust_remote_code: bool) -> Any:
    """The tokenizer of a checkpoint loaded as Qwen2: its own class where its code may run, else the fast tokenizer
    of its tokenizer.json (what Dream's `DreamTokenizer` wraps), so that no code of the checkpoint's runs."""
    import transformers

    if not trust_remote_code and (Path(path) / "tokenizer.json").is_file():
        return transformers.PreTrainedTokenizerFast.from_pretrained(path)
    return transformers.AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)


def _own_memory(model: Any) -> None:
    """Copy weights left on the CPU out of the checkpoint's memory map into memory of their own.

    safetensors files are memory-mapped, and on the CPU transformers keeps the mapped pages as the weights: a weights
    file truncated or rewritten in place while the model runs (an export into the served directory, a copy over it)
    would then kill the process with SIGBUS at the next forward pass. One tensor at a time, so the peak is one tensor.
    """
    import torch

    with torch.no_grad():
        for tensor in itertools.chain(model.parameters(), model.buffers()):
            if tensor.device.type == "cpu":
                tensor.data = tensor.data.clone()


def _mix_precision(model: Any, info: ModelInfo) -> None:
    """Give the model's linear layers but the output layer bfloat16 weights (`mixed_precision`)."""
    from infill_engine.mixed_precision import mix_precision

    try:
        layers = mix_precision(model)
    except ValueError as error:
        raise ModelLoadError(f"{info.path}: {error}") from None
    logger.info("%s: %d linear layers in bfloat16 (mixed precision)", info.path, layers)


def _pack_weights(model: Any, info: ModelInfo) -> None:
    """Keep a small float32 CPU model's Linear weights in MKL's packed layout too (`packed_weights`): steps 6-9 %
    cheaper."""
    from infill_engine.packed_weights import pack_linear_weights

    layers = pack_linear_weights(model)
    if layers:
        logger.info("%s: %d linear layers packed for MKL's sgemm", info.path, layers)


def _wrap(info: ModelInfo, model: Any, tokenizer: Any, dual_cache: int = DEFAULT_DUAL_CACHE) -> "Denoiser":
    """The adapter object for a loaded model."""
    from infill_engine.adapters.diffill import DiffillDenoiser
    from infill_engine.adapters.diffusion_gemma import DiffusionGemmaDenoiser
    from infill_engine.adapters.masked import MaskedDenoiser
    from infill_engine.special_tokens import resolve_special_tokens

    special = resolve_special_tokens(tokenizer, model.config, getattr(model, "generation_config", None))
    if info.family == "diffusion_gemma":
        return DiffusionGemmaDenoiser(model, tokenizer, special, info.path)
    if info.family == "diffill":
        return DiffillDenoiser(model, tokenizer, special, info.path)
    try:
        return MaskedDenoiser(
            model,
            tokenizer,
            special,
            info.path,
            family=info.family,
            shift_logits=info.family in SHIFTED_FAMILIES,
            wrap_with_cls_sep=info.family == "mlm",
            refresh_every=dual_cache if info.family in DUAL_CACHE_FAMILIES else 0,
        )
    except ValueError as error:
        raise ModelLoadError(str(error)) from error
