"""The one interface to an engine, without torch: what a client may ask, which model, and how to open one.

    spec = ModelSpec(path=None)                     # the embedded model; or a directory, a family, a device...
    engine = open_engine(spec, mode="auto")         # the shared engine when one answers or starts, else in process
    result = engine.fill(InfillRequest(prefix, suffix), on_step=ticket.on_step)

Every kind of engine implements `Engine`: `InfillEngine` runs the model in this process, `SharedEngine` talks to
`diffill engine` over a local socket. A caller holds an `Engine` and never asks which kind it is, so the language
server needs neither torch nor the engine's internals. Importing this module does not import torch.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from infill_engine.request import InfillRequest, InfillResult
from infill_engine.sampler_config import checked_sampler_settings

if TYPE_CHECKING:
    import argparse

logger = logging.getLogger(__name__)

FAMILIES = ("diffill", "diffusion_gemma", "llada", "dream", "mlm")
DEVICES_HELP = "auto, cpu, cuda, cuda:N or mps"
DTYPES = ("auto", "float32", "bfloat16", "float16", "mixed")  # mixed: float32, the blocks' products in bfloat16
ENGINE_MODES = ("inprocess", "shared", "auto", "remote")  # remote: a team server (`diffill http`) at a URL
# Refine: tokens the model gives at least this probability are kept; positions a refined text may grow by.
DEFAULT_KEEP_ABOVE = 0.9
DEFAULT_GROW = 4
MAX_GROW = 64
# llada and dream models: the prefix's and suffix's keys and values are computed again every this many denoising
# steps and reused in between (Fast-dLLM's approximate dual cache, infill_engine/dual_cache.py); 0: every step runs
# the whole sequence. Every 2 steps by default: on a trained Dream-layout model (training/dream_layout.py) it kept
# pass@1 with both sampler settings measured (3.39 -> 3.29 and 3.39 -> 3.48 on all 1,033 holes, 90-94 % of fills
# identical) for 1.25x the fills per second there and 2.0-2.3x per step at a 0.5B model's shapes; every 4 changed
# 16-35 % of the fills and moved pass@1 by -0.49 and +0.29 (docs/BENCHMARKS.md, "Dual cache"). Other families ignore
# it (diffill's context cache is exact; DiffusionGemma caches its prefix).
DEFAULT_DUAL_CACHE = 2
# The embedded model on the CPU in float32 or mixed: its layers compiled ahead of time for this CPU (infill_engine/
# compiled_layers.py). auto: a package in the cache is used, and a server compiles a missing one in the background at
# the lowest priority; off: the layers always run eagerly. auto by default: ghost text through LSP 2.2 ms sooner at
# p50 (5 %) in float32, fills 5-10 % faster (docs/BENCHMARKS.md, "Layers compiled ahead of time"); with them on, a
# CPU with bfloat16 arithmetic runs the model mixed (--dtype auto), a single-line fill 21 ms against 33-35 on AMX
# ("Mixed precision"), 29-34 against 36-37 on AVX-512 BF16 ("On a CPU without AMX"). $DIFFILL_COMPILED_LAYERS
# sets a machine's default (off where nothing should compile: CI, a read-only home); options and settings win.
COMPILED_LAYERS = ("auto", "off")
COMPILED_LAYERS_ENV = "DIFFILL_COMPILED_LAYERS"


def _default_compiled_layers() -> str:
    """auto, or what $DIFFILL_COMPILED_LAYERS says (off, with a warning, for a value that is neither)."""
    value = os.environ.get(COMPILED_LAYERS_ENV, "").strip().lower()
    if not value:
        return "auto"
    if value not in COMPILED_LAYERS:
        logger.warning("%s=%r is not one of %s; the layers run eagerly (off)", COMPILED_LAYERS_ENV,
                       os.environ[COMPILED_LAYERS_ENV], ", ".join(COMPILED_LAYERS))
        return "off"
    return value


DEFAULT_COMPILED_LAYERS = _default_compiled_layers()
# Servers: fills sharing forward passes at once (infill_engine.batched_fill; `diffill http --max-batch-size`), and on
# Ray Serve the requests handed to a replica together.
DEFAULT_MAX_BATCH_SIZE = 8

StepCallback = Callable[[Any], Any]  # called once per denoising step; returning False stops the fill


@dataclass(frozen=True)
class ModelSpec:
    """Which model an engine serves and how it is loaded; equal identities share a shared engine."""

    path: str | None = None  # checkpoint directory or hub id owner/name[@revision]; None: the embedded model
    family: str | None = None  # one of FAMILIES; None: read from config.json
    device: str = "auto"  # auto (CUDA when present, else CPU), cpu, cuda, cuda:N, mps
    dtype: str = "auto"  # one of DTYPES; auto: bfloat16/float16 on GPU, on CPU by size (device.cpu_dtype)
    trust_remote_code: bool = False  # run a checkpoint's own modelling code (never by default)
    factory: str | None = None  # "module:function" building the engine from this spec instead (tests, demos)
    threads: int = field(default=0, compare=False)  # CPU threads for torch; 0: leave torch's choice
    dual_cache: int = DEFAULT_DUAL_CACHE  # llada/dream: refresh the prefix/suffix keys and values every N steps; 0: off
    compiled_layers: str = DEFAULT_COMPILED_LAYERS  # one of COMPILED_LAYERS: the blocks compiled for this CPU

    def __post_init__(self) -> None:
        if self.family is not None and self.family not in FAMILIES:
            raise ValueError(f"unknown model family {self.family!r}; allowed: {', '.join(FAMILIES)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; allowed: {', '.join(DTYPES)}")
        if self.factory is not None and ":" not in self.factory:
            raise ValueError(f"an engine factory is MODULE:FUNCTION (got {self.factory!r})")
        if not isinstance(self.threads, int) or self.threads < 0:
            raise ValueError(f"threads must be an integer >= 0 (got {self.threads!r})")
        if not isinstance(self.dual_cache, int) or isinstance(self.dual_cache, bool) or self.dual_cache < 0:
            raise ValueError(f"dual_cache must be an integer >= 0: refresh every N steps, 0 off "
                             f"(got {self.dual_cache!r})")
        if self.compiled_layers not in COMPILED_LAYERS:
            raise ValueError(f"unknown compiled_layers {self.compiled_layers!r}; allowed: {', '.join(COMPILED_LAYERS)}")

    @property
    def resolved_path(self) -> str | None:
        """The checkpoint directory with `~` expanded and made absolute, or the hub id with its revision as given
        (two revisions are two models); None for the embedded model."""
        from infill_engine.hub import parse_hub_id

        if self.path is None:
            return None
        return self.path if parse_hub_id(self.path) else str(Path(self.path).expanduser().resolve())

    def identity(self) -> dict[str, Any]:
        """What makes two engines interchangeable (threads are not part of it)."""
        identity = asdict(self)
        identity.pop("threads")
        identity["path"] = self.resolved_path
        return identity

    @property
    def key(self) -> str:
        """Short hash of the identity; names the shared engine's socket."""
        from infill_engine.service.address import model_key

        return model_key(self.identity())


# Sampler fields a client sets with their own options (EngineOptions.steps, .canvas_refresh, .seed), not in `sampler`
OWN_SAMPLER_OPTIONS = ("steps", "canvas_refresh", "seed")


@dataclass(frozen=True)
class EngineOptions:
    """A client's sampling and context settings; None keeps the engine's own."""

    steps: int | None = None  # forward passes per block at most
    canvas_refresh: int | None = None  # embedded model: a pass over the whole canvas every N steps (0: every pass)
    seed: int | None = None  # the same seed and context give the same fill
    prefix_tokens: int | None = None  # context budget before the hole
    suffix_tokens: int | None = None  # context budget after the hole
    sampler: tuple[tuple[str, Any], ...] = ()  # (SamplerConfig field, value) pairs over the checkpoint's own

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if name != "sampler" and value is not None and (
                    not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ValueError(f"{name} must be an integer >= 0 or unset (got {value!r})")
        if self.steps == 0:
            raise ValueError("steps must be at least 1")
        if not isinstance(self.sampler, tuple) or not all(isinstance(p, tuple) and len(p) == 2 for p in self.sampler):
            raise ValueError(f"sampler must be (setting, value) pairs (got {self.sampler!r})")
        checked_sampler_settings(dict(self.sampler), "the sampler settings", exclude=OWN_SAMPLER_OPTIONS)

    def as_dict(self) -> dict[str, Any]:
        """The options that are set (`sampler` as an object)."""
        values: dict[str, Any] = {name: value for name, value in asdict(self).items()
                                  if value is not None and name != "sampler"}
        if self.sampler:
            values["sampler"] = dict(self.sampler)
        return values

    @classmethod
    def from_dict(cls, values: Any) -> EngineOptions:
        """Options from a plain mapping (as sent over the wire); ValueError names what is not allowed."""
        if not values:
            return cls()
        allowed = set(cls.__dataclass_fields__)
        if not isinstance(values, dict) or set(values) - allowed:
            raise ValueError(f"engine options may only set {', '.join(sorted(allowed))}")
        sampler = values.get("sampler") or {}
        if not isinstance(sampler, dict):
            raise ValueError(f"engine option sampler must be an object of sampler settings (got {sampler!r})")
        return cls(**{**values, "sampler": tuple(sorted(sampler.items()))})


@dataclass(frozen=True)
class ModelInfo:
    """What a client may know of the model behind an engine."""

    family: str
    path: str
    device: str  # where the model runs: "cpu", "cuda:0", ...
    dtype: str = ""  # what its weights run in: "float32", "bfloat16", ...; "" where the engine does not say

    @property
    def description(self) -> str:
        """Short name for status bars: family and directory (or hub id, for a model in the hub cache)."""
        from infill_engine.hub import repo_id_of

        return f"{self.family}:{repo_id_of(self.path) or Path(self.path).name}"


@runtime_checkable
class Engine(Protocol):
    """Fills and refines holes; in this process or another, the caller cannot tell."""

    def fill(self, request: InfillRequest, on_step: StepCallback | None = None, *,
             document: str | None = None) -> InfillResult:
        """Fill the hole between `request.prefix` and `request.suffix`.

        `document` names the document the request is for, so that a shared engine lets a newer request of the same
        document supersede this one; an engine in this process ignores it. FillCancelled when `on_step` says stop.
        """
        ...

    def refine(self, request: InfillRequest, original: str, renoise: list[tuple[int, int]] | None = None,
               keep_above: float | None = DEFAULT_KEEP_ABOVE, grow: int = DEFAULT_GROW,
               on_step: StepCallback | None = None, *, document: str | None = None) -> InfillResult:
        """Denoise `original` (the text between prefix and suffix) again, keeping what the model is sure of."""
        ...

    def count_tokens(self, text: str) -> int:
        """How many of the model's tokens `text` is."""
        ...

    def describe(self) -> ModelInfo:
        """The model behind the engine."""
        ...

    def configure(self, options: EngineOptions) -> None:
        """Use these sampling and context settings from now on (unset ones: the engine's defaults)."""
        ...

    def close(self) -> None:
        """Let go of the engine (a shared engine keeps running for its other clients)."""
        ...


class OpenError(Exception):
    """No engine could be opened for a spec; the message says why (shown to the user as it is)."""


class NoModelError(OpenError):
    """No model is named and this build ships no embedded one."""


def open_engine(spec: ModelSpec, mode: str = "inprocess", *, url: str | None = None, key: str | None = None,
                key_file: str | None = None, serving: bool = False) -> Engine:
    """An engine for `spec`: "inprocess" loads it here, "shared" uses the shared engine, "auto" tries shared first,
    "remote" uses the team server at `url` (the server's model, not `spec`) with the API key `key`, else the first
    line of `key_file`, else $DIFFILL_API_KEY. `serving`: for a long-lived server (see `load_engine`).

    Raises OpenError (NoModelError when there is no model to load) for every failure a user can fix.
    """
    from infill_engine.loading import ModelLoadError, default_model_path
    from infill_engine.service.api import EngineError

    if mode not in ENGINE_MODES:
        raise OpenError(f"unknown engine mode {mode!r}; allowed: {', '.join(ENGINE_MODES)}")
    if mode == "remote":
        from infill_engine.http.client import HttpEngine, read_api_key

        if not url:
            raise OpenError('engine.mode "remote" needs engine.url, the team server\'s address '
                            "(e.g. http://gpu-box:8012)")
        return HttpEngine(url, read_api_key(key, key_file))
    if spec.path is None and spec.factory is None and default_model_path() is None:
        raise NoModelError("this build of diffill ships no embedded model; set the `model.path` setting (or "
                           "`--model PATH`) to a checkpoint directory or a Hugging Face id (`diffill models`)")
    if mode != "inprocess":
        from infill_engine.service.launcher import SharedEngine

        try:
            return SharedEngine(spec)
        except EngineError as error:
            if mode == "shared":
                raise OpenError(f"no shared engine: {error}") from None
            logger.warning("no shared engine (%s); loading the model in this process", error)
    try:
        return load_engine(spec, serving=serving)
    except (ModelLoadError, ValueError, OSError) as error:
        raise OpenError(str(error)) from None


def load_engine(spec: ModelSpec, *, serving: bool = False) -> Engine:
    """The model of `spec` loaded in this process (imports torch); `serving`: a long-lived server, which compiles
    the embedded model's layers in the background where `spec.compiled_layers` is auto and none are cached."""
    import importlib

    import torch

    from infill_engine.engine import InfillEngine

    if spec.factory:
        module, _, name = spec.factory.partition(":")
        engine = getattr(importlib.import_module(module), name)(spec)
    else:
        engine = InfillEngine.load(spec)
    if spec.threads and engine.describe().device == "cpu":
        torch.set_num_threads(spec.threads)
    if serving and spec.compiled_layers == "auto" and not spec.factory:
        compile_in_background = getattr(getattr(engine, "denoiser", None), "compile_layers_in_background", None)
        if compile_in_background is not None:
            compile_in_background(spec)
    return engine


def half_the_cores() -> int:
    """Half the CPU cores, at least one: the editor and the rest of the machine keep theirs."""
    return max(1, (os.cpu_count() or 2) // 2)


# ------------------------------------------------------------------------------------------ command-line options


def add_model_options(parser: argparse.ArgumentParser, *, threads: str | None = None, factory: bool = False) -> None:
    """The model options of every subcommand that loads a model: `threads` is the --threads help, if it has one;
    `factory` adds --engine-factory (for the server and the shared engine, whose tests script the engine)."""
    parser.add_argument("--model", metavar="PATH|ID",
                        help="model directory, or Hugging Face id OWNER/NAME[@REVISION] (fetched into the hub cache "
                             "once; `diffill models` lists known ones) (default: the embedded model)")
    parser.add_argument("--family", choices=FAMILIES, help="override the family read from config.json")
    parser.add_argument("--device", default="auto", help=f"{DEVICES_HELP} (default: auto)")
    parser.add_argument("--dtype", default="auto", choices=DTYPES, help="(default: auto)")
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="allow a checkpoint's own modelling code (off by default)")
    parser.add_argument("--dual-cache", type=int, default=DEFAULT_DUAL_CACHE, metavar="N",
                        help="llada and dream models: reuse the prefix's and suffix's keys and values, computed again "
                             f"every N steps (2, 4 and 8 were measured); 0 runs the whole sequence every step "
                             f"(default: {DEFAULT_DUAL_CACHE})")
    parser.add_argument("--compiled-layers", default=DEFAULT_COMPILED_LAYERS, choices=COMPILED_LAYERS,
                        help="the embedded model on the CPU: run its layers compiled for this CPU when `diffill "
                             "compile` (or a server, in the background) has cached them; off: always eagerly "
                             f"(default: {DEFAULT_COMPILED_LAYERS}; ${COMPILED_LAYERS_ENV} sets it)")
    if factory:
        parser.add_argument("--engine-factory", metavar="MODULE:FUNCTION",
                            help="build the engine with FUNCTION(spec) from MODULE instead of loading a checkpoint "
                                 "(tests and demos)")
    if threads is not None:
        parser.add_argument("--threads", type=int, default=0, metavar="N", help=threads)


def model_spec_from_args(args: argparse.Namespace, **overrides: Any) -> ModelSpec:
    """The ModelSpec of parsed `add_model_options` options; ValueError for a bad combination."""
    spec = ModelSpec(path=args.model, family=args.family, device=args.device, dtype=args.dtype,
                     trust_remote_code=args.trust_remote_code, factory=getattr(args, "engine_factory", None),
                     threads=getattr(args, "threads", 0) or 0,
                     dual_cache=getattr(args, "dual_cache", DEFAULT_DUAL_CACHE),
                     compiled_layers=getattr(args, "compiled_layers", DEFAULT_COMPILED_LAYERS))
    return replace(spec, **overrides) if overrides else spec
