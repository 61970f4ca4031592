"""The catalogue of known diffusion code models: hub id, family, licence, size, published infilling scores, the
sampler settings each needs, and where every fact comes from (`diffill models`, docs/MODELS.md).

The catalogue is data. A fact whose `sources` entry is missing could not be confirmed and is shown as
"unconfirmed"; a number that was not found is None, never guessed. Memory is computed from the parameter count
(weights only: 2 bytes a parameter at bf16, 1 at int8), not measured. This module does not import torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from infill_engine.hub import HubId, cached_snapshot, parse_hub_id, repo_id_of

GIB = 1024**3
OPEN_DLLM = "https://github.com/pengzhangzhi/Open-dLLM#code-infilling"  # read in its mirror zeyuanyin/Open-dLLM
DREAMON_README = "https://github.com/DreamLM/DreamOn#quickstart"  # read in its copy yizhang-afk/dreamon
DREAMON_EVAL = "https://github.com/DreamLM/DreamOn/blob/main/eval/configs/eval_infill.yaml"
GEMMA_DEFAULTS = ("https://github.com/huggingface/transformers/blob/v5.24.0/src/transformers/models/diffusion_gemma/"
                  "generation_diffusion_gemma.py")
FIXED_LENGTHS = "pass@1, averaged over fixed canvas lengths (DreamOn's protocol)"


@dataclass(frozen=True)
class Score:
    """One published infilling result."""

    benchmark: str  # "HumanEval-Infilling single-line", "SantaCoder-FIM"
    value: float  # pass@1 or exact match, in percent
    protocol: str  # how the span length was chosen, and the metric
    source: str  # URL


@dataclass(frozen=True)
class Settings:
    """Sampler settings a model is run with by default (`SamplerConfig` fields; the rest keep the family's)."""

    steps: int  # forward passes per block at most
    block_size: int  # span positions denoised together
    commit: str  # "threshold", "schedule", "factor" or "entropy_bound"
    extra: dict[str, Any] = field(default_factory=dict)  # other SamplerConfig fields (order, threshold, ...)
    source: str | None = None  # URL; None: unconfirmed (our reading of the authors' code)

    def sampler_fields(self) -> dict[str, Any]:
        """The `SamplerConfig` fields these settings set."""
        return {"steps": self.steps, "block_size": self.block_size, "commit": self.commit, **self.extra}


@dataclass(frozen=True)
class CatalogueModel:
    """A diffusion code model worth using, and what is known about it."""

    key: str  # short name for the command line
    name: str
    hub_id: str  # owner/name on the Hugging Face hub
    family: str  # diffill's family: "dream", "llada", "diffusion_gemma"
    licence: str | None
    parameters: float | None  # billions, all of them (a mixture of experts keeps every expert in memory)
    scores: tuple[Score, ...] = ()
    settings: Settings | None = None  # None: the family's defaults
    sources: dict[str, str] = field(default_factory=dict)  # fact name (hub_id, licence, parameters) -> URL
    notes: str = ""

    def confirmed(self, fact: str) -> bool:
        """Whether `fact` ("hub_id", "licence", "parameters") has a source."""
        return fact in self.sources

    def memory_gib(self, bytes_per_parameter: int) -> float | None:
        """Weights at this many bytes a parameter, in GiB (computed, not measured); None without a count."""
        return None if self.parameters is None else self.parameters * 1e9 * bytes_per_parameter / GIB

    def cached(self) -> bool:
        """Whether the default revision is in the local hub cache (checked on disk, no network)."""
        return cached_snapshot(HubId(self.hub_id)) is not None


MODELS: tuple[CatalogueModel, ...] = (
    CatalogueModel(
        key="open-dcoder-0.5b", name="Open-dCoder 0.5B", hub_id="fredzzp/open-dcoder-0.5B", family="dream",
        licence=None, parameters=0.5,
        scores=(Score("HumanEval-Infilling single-line", 32.5, FIXED_LENGTHS, OPEN_DLLM),
                Score("HumanEval-Infilling single-line", 77.4, "pass@1 at the oracle (true) length", OPEN_DLLM),
                Score("SantaCoder-FIM", 29.6, "exact match, averaged over fixed lengths", OPEN_DLLM)),
        sources={"hub_id": OPEN_DLLM, "parameters": OPEN_DLLM},
        notes="Qwen2.5-Coder-0.5B adapted to masked diffusion; the smallest real model here",
    ),
    CatalogueModel(
        key="diffucoder-7b", name="DiffuCoder 7B Base", hub_id="apple/DiffuCoder-7B-Base", family="dream",
        licence="apple-amlr", parameters=7.6,
        scores=(Score("HumanEval-Infilling single-line", 54.8, FIXED_LENGTHS, OPEN_DLLM),
                Score("SantaCoder-FIM", 38.8, "exact match, averaged over fixed lengths", OPEN_DLLM)),
        sources={"hub_id": "https://huggingface.co/apple/DiffuCoder-7B-Base/tree/main",
                 "licence": "https://huggingface.co/apple/DiffuCoder-7B-Base/commit/"
                            "a2c33054cbe99b9ab7af074f09b1d13943157ff1",
                 "parameters": "https://huggingface.co/apple/DiffuCoder-7B-Base/tree/main"},
        notes="from Qwen2.5-Coder-7B; parameters derived from 15.2 GB of bf16 weights; remote code",
    ),
    CatalogueModel(
        key="dream-coder-7b", name="Dream-Coder 7B Instruct", hub_id="Dream-org/Dream-Coder-v0-Instruct-7B",
        family="dream", licence="apache-2.0", parameters=7.6,
        scores=(Score("HumanEval-Infilling single-line", 55.3, FIXED_LENGTHS, OPEN_DLLM),
                Score("SantaCoder-FIM", 40.0, "exact match, averaged over fixed lengths", OPEN_DLLM)),
        sources={"hub_id": "https://huggingface.co/Dream-org/Dream-Coder-v0-Instruct-7B/tree/main",
                 "licence": "https://huggingface.co/Dream-org/Dream-Coder-v0-Instruct-7B/tree/main",
                 "parameters": "https://huggingface.co/Dream-org/Dream-Coder-v0-Instruct-7B/tree/main"},
        notes="parameters derived from 15.2 GB of bf16 weights; the scores' source says Dream-Coder-7B without "
              "naming base or instruct; remote code",
    ),
    CatalogueModel(
        key="dreamon-7b", name="DreamOn 7B", hub_id="Dream-org/DreamOn-v0-7B", family="dream",
        licence=None, parameters=7.6,
        settings=Settings(steps=128, block_size=64, commit="threshold",
                          extra={"order": "entropy", "threshold": 1.0, "temperature_start": 0.1,
                                 "temperature_end": 0.1},
                          source=DREAMON_EVAL),
        sources={"hub_id": DREAMON_README, "parameters": "https://arxiv.org/html/2602.01326v1"},
        notes="variable-length infilling: <|expand|>/<|delete|> grow and shrink the span (diffill's growing-span "
              "sampler); starts from 4 masks, at most 64 tokens, one token per step; parameters: Dream-Coder-7B's "
              "(the paper builds on it with no architectural change); remote code",
    ),
    CatalogueModel(
        key="llada-8b", name="LLaDA 8B Base", hub_id="GSAI-ML/LLaDA-8B-Base", family="llada",
        licence="mit", parameters=8.0,
        scores=(Score("HumanEval-Infilling single-line", 48.3, FIXED_LENGTHS, OPEN_DLLM),
                Score("SantaCoder-FIM", 35.1, "exact match, averaged over fixed lengths", OPEN_DLLM)),
        settings=Settings(steps=32, block_size=32, commit="schedule", extra={"order": "confidence"}),
        sources={"hub_id": "https://huggingface.co/GSAI-ML/LLaDA-8B-Base/blame/main/README.md",
                 "licence": "https://huggingface.co/GSAI-ML/LLaDA-8B-Base/blame/main/README.md",
                 "parameters": "https://huggingface.co/GSAI-ML/LLaDA-8B-Base/blame/main/README.md"},
        notes="trained from scratch, no logit shift; settings are LLaDA generate()'s low_confidence remasking with "
              "blocks of 32 and one token per step, as called in a third-party repository (unconfirmed as the "
              "authors' recommendation); remote code",
    ),
    CatalogueModel(
        key="coda-1.7b", name="CoDA 1.7B Base", hub_id="Salesforce/CoDA-v0-Base", family="dream",
        licence="cc-by-nc-4.0", parameters=1.7,
        sources={"hub_id": "https://huggingface.co/Salesforce/CoDA-v0-Base/blob/main/README.md",
                 "licence": "https://huggingface.co/Salesforce/CoDA-v0-Base/blob/main/README.md",
                 "parameters": "https://huggingface.co/papers/2510.03270"},
        notes="non-commercial licence; no published infilling score found; remote code",
    ),
    CatalogueModel(
        key="diffusiongemma-26b", name="DiffusionGemma 26B-A4B IT", hub_id="google/diffusiongemma-26B-A4B-it",
        family="diffusion_gemma", licence=None, parameters=26.0,
        settings=Settings(steps=48, block_size=256, commit="entropy_bound",
                          extra={"entropy_bound": 0.1, "temperature_start": 0.8, "temperature_end": 0.4},
                          source=GEMMA_DEFAULTS),
        sources={"hub_id": "https://huggingface.co/tableborn/activity/all",
                 "parameters": "https://huggingface.co/tableborn/activity/all"},
        notes="mixture of experts, about 4B active, every expert in memory; native in transformers 5; no "
              "fill-in-the-middle mode or infilling score published",
    ),
)


def find(name: str) -> CatalogueModel | None:
    """The catalogued model with this key or hub id (any revision, any case); None if unknown."""
    hub_id = parse_hub_id(name)
    wanted = (hub_id.repo_id if hub_id else name).lower()
    return next((m for m in MODELS if wanted in (m.key, m.hub_id.lower())), None)


def for_checkpoint(path: str | os.PathLike[str]) -> CatalogueModel | None:
    """The catalogued model a loaded checkpoint directory is: a hub-cache snapshot, or a directory named like it."""
    repo_id = repo_id_of(path)
    if repo_id is not None:
        return find(repo_id)
    name = os.path.basename(os.path.normpath(str(path))).lower()
    return next((m for m in MODELS if name == m.hub_id.split("/")[1].lower()), None)
