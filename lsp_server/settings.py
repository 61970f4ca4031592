"""The server's settings: nested keyword-only dataclasses with defaults, validated in one place.

Editors send settings as JSON, through `initializationOptions` at start-up and `workspace/didChangeConfiguration`
later, either bare or under a top-level `diffill` key. Keys are camelCase (`trustRemoteCode`); snake_case is
accepted too. A bad value never stops the server: `parse_settings` keeps the default for that key and returns a
message naming it, which the server shows with `window/showMessage`. Every setting is documented in the README.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields, is_dataclass, replace
from typing import Any

from infill_engine.interface import (
    COMPILED_LAYERS,
    DEFAULT_COMPILED_LAYERS,
    DEFAULT_DUAL_CACHE,
    DEFAULT_KEEP_ABOVE,
    DTYPES,
    ENGINE_MODES,
    FAMILIES,
    OWN_SAMPLER_OPTIONS,
    EngineOptions,
    ModelSpec,
)
from infill_engine.request import MAX_CANDIDATES, MAX_SPAN_TOKENS
from infill_engine.sampler_config import checked_sampler_settings

DEVICES = ("auto", "cpu", "cuda", "mps")  # or "cuda:N"


Check = Callable[[Any], Any]  # returns the (normalised) value or raises ValueError saying what is allowed


def _integer(low: int, high: int) -> Check:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"must be an integer from {low} to {high}")
        return value

    return check


def _number(low: float, high: float) -> Check:
    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise ValueError(f"must be a number from {low} to {high}")
        return float(value)

    return check


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("must be true or false")
    return value


def _choice(*allowed: str) -> Check:
    def check(value: Any) -> str:
        if value not in allowed:
            raise ValueError(f"must be one of {', '.join(repr(a) for a in allowed)}")
        return value

    return check


def _optional(inner: Check) -> Check:
    def check(value: Any) -> Any:
        return None if value is None else inner(value)

    return check


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError("must be a non-empty string")
    return value


def _device(value: Any) -> str:
    if not isinstance(value, str) or not (value in DEVICES or re.fullmatch(r"cuda:[0-9]+", value)):
        raise ValueError(f"must be one of {', '.join(DEVICES)} or 'cuda:N'")
    return value


def _url(value: Any) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"https?://[^\s/]+(/\S*)?", value.strip()):
        raise ValueError("must be an http:// or https:// address, e.g. \"http://gpu-box:8012\"")
    return value.strip()


def _names(value: Any) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ValueError("must be a list of language names (LSP languageIds), e.g. [\"python\", \"rust\"]")
    return tuple(v.strip().lower() for v in value)


class SamplerOverrides(dict):  # type: ignore[type-arg]
    """A read-only, hashable object of sampler settings (field -> value), so that the settings stay immutable and
    print as JSON objects."""

    def _read_only(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("sampler overrides are read-only; parse new settings instead")

    __setitem__ = __delitem__ = __ior__ = _read_only  # type: ignore[assignment]
    clear = pop = popitem = setdefault = update = _read_only  # type: ignore[assignment]

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted(self.items())))


def _sampler_overrides(value: Any) -> SamplerOverrides:
    """Any other SamplerConfig fields, keys in either spelling."""
    if not isinstance(value, Mapping):
        raise ValueError('must be an object of sampler settings, e.g. {"threshold": 0.8, "endBias": -1}')
    checked = checked_sampler_settings({_snake(str(key)): item for key, item in value.items()},
                                       exclude=OWN_SAMPLER_OPTIONS, spell=_camel)
    return SamplerOverrides(sorted(checked.items()))


def _setting(default: Any, check: Check) -> Any:
    """A field with its default and the check its values must pass."""
    return field(default=default, metadata={"check": check})


@dataclass(frozen=True, kw_only=True)
class ModelSettings:
    """Which checkpoint to load and where it runs."""

    path: str | None = _setting(None, _optional(_text))  # directory or hub id owner/name[@rev]; None: embedded
    family: str | None = _setting(None, _optional(_choice(*FAMILIES)))  # None: read from config.json
    device: str = _setting("auto", _device)  # auto: CUDA when present, else CPU
    dtype: str = _setting("auto", _choice(*DTYPES))  # auto: bf16/fp16 on GPU, on CPU by size (cpu_dtype)
    trust_remote_code: bool = _setting(False, _boolean)  # run a checkpoint's own modelling code (never by default)
    threads: int = _setting(0, _integer(0, 256))  # CPU threads for torch; 0: half the cores, at least one
    dual_cache: int = _setting(DEFAULT_DUAL_CACHE, _integer(0, 1024))  # llada/dream: cache refreshed every N steps; 0 off
    # the embedded model on the CPU, its layers compiled for this CPU: auto or off; None: the machine's default (auto
    # unless $DIFFILL_COMPILED_LAYERS says off)
    compiled_layers: str | None = _setting(None, _optional(_choice(*COMPILED_LAYERS)))

    @classmethod
    def of_spec(cls, spec: ModelSpec) -> ModelSettings:
        """The settings of a command line's ModelSpec (`diffill serve --model ... --compiled-layers ...`)."""
        return cls(path=spec.path, family=spec.family, device=spec.device, dtype=spec.dtype,
                   trust_remote_code=spec.trust_remote_code, threads=spec.threads, dual_cache=spec.dual_cache,
                   compiled_layers=spec.compiled_layers)

    def spec(self, factory: str | None = None) -> ModelSpec:
        """The engine's ModelSpec of these settings (`factory`: `diffill serve --engine-factory`)."""
        from infill_engine.interface import half_the_cores

        return ModelSpec(path=self.path, family=self.family, device=self.device, dtype=self.dtype,
                         trust_remote_code=self.trust_remote_code, factory=factory,
                         threads=self.threads or half_the_cores(), dual_cache=self.dual_cache,
                         compiled_layers=self.compiled_layers or DEFAULT_COMPILED_LAYERS)


@dataclass(frozen=True, kw_only=True)
class SamplingSettings:
    """The denoising loop."""

    steps: int | None = _setting(None, _optional(_integer(1, 512)))  # forward passes per block; None: the family's
    canvas_refresh: int | None = _setting(None, _optional(_integer(0, 512)))  # embedded model: the whole canvas
    # every N passes, in between only its open and just-changed positions; 0: every pass; None: the engine's
    seed: int = _setting(0, _integer(0, 2**31 - 1))  # the same seed and context give the same suggestion
    overrides: SamplerOverrides = _setting(SamplerOverrides(), _sampler_overrides)  # any other SamplerConfig
    # field (threshold, endBias, tailFloor, temperatureStart, ...) over the checkpoint's own settings


@dataclass(frozen=True, kw_only=True)
class CompletionSettings:
    """Ghost text (`textDocument/inlineCompletion`) and completion items (`textDocument/completion`)."""

    enabled: bool = _setting(True, _boolean)
    candidates: int = _setting(2, _integer(1, MAX_CANDIDATES))  # canvases when asked for (Invoked, completion items)
    automatic_candidates: int = _setting(1, _integer(1, MAX_CANDIDATES))  # canvases for ghost text while typing
    require_content: str = _setting("asked", _choice("asked", "always", "never"))  # which fills must write more
    # than whitespace (the span may not end before it): those the user asked for (Invoked, completion items), every
    # fill, or none. It finds a suggestion where the model would rather write nothing, at about twice the time
    max_tokens: int = _setting(64, _integer(1, MAX_SPAN_TOKENS))  # span positions at a line end or in an empty block
    line_tokens: int = _setting(24, _integer(1, MAX_SPAN_TOKENS))  # span positions when the cursor is mid-line
    debounce_ms: int = _setting(0, _integer(0, 5000))  # wait this long; a newer request in the meantime wins (keys typed
    # at the cursor join it: typing through)
    cache_entries: int = _setting(250, _integer(0, 100_000))  # LRU of suggestions by context; 0 turns caching off
    budget_ms: int | None = _setting(250, _optional(_integer(0, 60_000)))  # ms of model work per fill, then the best
    # passing candidate so far is shown and repairs are skipped; null: no limit
    asked_budget_ms: int | None = _setting(1000, _optional(_integer(0, 60_000)))  # the same for a fill the user
    # asked for (Invoked ghost text, completion items), which waits for it
    prefetch_accepted: bool = _setting(True, _boolean)  # once ghost text is shown, fill in the background where
    # the cursor will be if it is accepted, so that the request after Tab is answered from the cache
    prefetch_delay_ms: int = _setting(150, _integer(0, 5000))  # the prefetch waits this long after the ghost text is
    # shown (a key in the meantime stops it unstarted, so that it does not hold the model while the user types on);
    # a request that needs its result starts it at once
    type_through: bool = _setting(True, _boolean)  # keys typed at a running fill's cursor let it finish; the latest
    # key's request answers with the rest of a suggestion that starts with them, else fills afresh


@dataclass(frozen=True, kw_only=True)
class RewriteSettings:
    """The code actions: rewrite, refine, fill here, quick fixes."""

    max_tokens: int = _setting(256, _integer(1, MAX_SPAN_TOKENS))  # span positions for a rewrite or a body fill
    candidates: int = _setting(2, _integer(1, MAX_CANDIDATES))  # canvases per rewrite; the best passing one is used
    keep_above: float = _setting(DEFAULT_KEEP_ABOVE, _number(0.0, 1.0))  # refine: tokens the model gives at least this are kept
    quick_fixes: bool = _setting(True, _boolean)  # offer model-made fixes for syntax diagnostics


@dataclass(frozen=True, kw_only=True)
class ContextSettings:
    """How much text the model sees."""

    prefix_tokens: int = _setting(1024, _integer(0, 1_000_000))  # before the cursor (shrunk to fit the model)
    suffix_tokens: int = _setting(256, _integer(0, 1_000_000))  # after the cursor (shrunk to fit the model)
    other_documents: bool = _setting(True, _boolean)  # add similar chunks of other open documents when there is room
    chunk_lines: int = _setting(24, _integer(4, 1000))  # lines per chunk of another document
    max_chunks: int = _setting(3, _integer(0, 64))  # chunks of other documents at most


@dataclass(frozen=True, kw_only=True)
class DiagnosticsSettings:
    """Syntax diagnostics from tree-sitter."""

    enabled: bool = _setting(True, _boolean)
    debounce_ms: int = _setting(300, _integer(0, 60_000))  # after the last change of a document


@dataclass(frozen=True, kw_only=True)
class EngineSettings:
    """Where the model runs."""

    mode: str = _setting("auto", _choice(*ENGINE_MODES))  # auto: the shared engine, else in-process (README)
    url: str | None = _setting(None, _optional(_url))  # mode "remote": the team server, e.g. http://gpu-box:8012
    key: str | None = _setting(None, _optional(_text))  # mode "remote": its API key (else keyFile, else $DIFFILL_API_KEY)
    key_file: str | None = _setting(None, _optional(_text))  # mode "remote": a file whose first line is the API key


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Everything the server can be told."""

    model: ModelSettings = field(default_factory=ModelSettings)
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    completion: CompletionSettings = field(default_factory=CompletionSettings)
    rewrite: RewriteSettings = field(default_factory=RewriteSettings)
    context: ContextSettings = field(default_factory=ContextSettings)
    diagnostics: DiagnosticsSettings = field(default_factory=DiagnosticsSettings)
    engine: EngineSettings = field(default_factory=EngineSettings)
    languages: tuple[str, ...] = _setting((), _names)  # languageIds the server acts on; empty: every language

    def enabled_for(self, language_id: str | None) -> bool:
        """Whether the server acts on documents of this LSP languageId."""
        return not self.languages or (language_id or "").lower() in self.languages

    def engine_options(self) -> EngineOptions:
        """The sampling and context settings the engine is configured with."""
        return EngineOptions(steps=self.sampling.steps, seed=self.sampling.seed,
                             canvas_refresh=self.sampling.canvas_refresh,
                             sampler=tuple(self.sampling.overrides.items()),
                             prefix_tokens=self.context.prefix_tokens, suffix_tokens=self.context.suffix_tokens)


def _snake(key: str) -> str:
    """trustRemoteCode -> trust_remote_code (snake_case stays as it is)."""
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", key).lower()


def _camel(name: str) -> str:
    """trust_remote_code -> trustRemoteCode, the spelling the README documents."""
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _default(spec: Field[Any]) -> Any:
    """A field's default value (made by its factory for nested sections)."""
    if spec.default_factory is not MISSING:
        return spec.default_factory()
    return spec.default


def _parse_section(cls: type, raw: Mapping[str, Any], path: str, problems: list[str]) -> Any:
    """An instance of the dataclass `cls` from `raw`, defaults kept for missing and invalid keys."""
    known = {f.name: f for f in fields(cls)}
    values: dict[str, Any] = {}
    for key, value in raw.items():
        name = _snake(str(key))
        where = f"{path}{key}"
        if name not in known:
            problems.append(f"unknown setting {where!r} ignored")
            continue
        spec = known[name]
        default = _default(spec)
        if is_dataclass(default):
            if name == "model" and isinstance(value, str):
                value = {"path": value}  # shorthand: "model": "/path/to/checkpoint"
            if not isinstance(value, Mapping):
                problems.append(f"setting {where!r} must be an object; using the defaults")
                continue
            values[name] = _parse_section(type(default), value, f"{where}.", problems)
            continue
        try:
            values[name] = spec.metadata["check"](value)
        except ValueError as error:
            problems.append(f"setting {where!r} {error} (got {value!r}); using the default {_shown(default)}")
    return cls(**values)


def _shown(default: Any) -> str:
    """A default as JSON, the way the README writes it."""
    return json.dumps(list(default) if isinstance(default, tuple) else default)


def unwrap(raw: Any) -> Any:
    """Settings sent under a top-level "diffill" key, as VS Code does, or bare."""
    if isinstance(raw, Mapping) and isinstance(raw.get("diffill"), Mapping):
        return raw["diffill"]
    return raw


def concerns_us(raw: Any) -> bool:
    """Whether pushed settings are meant for diffill: a `diffill` section, or at least one of its sections' names.

    Some clients push every server's settings to every server; those are ignored rather than reported key by key.
    """
    if raw is None:
        return False
    if not isinstance(raw, Mapping) or isinstance(raw.get("diffill"), Mapping):
        return True
    known = {spec.name for spec in fields(Settings)}
    return any(_snake(str(key)) in known for key in raw)


def _sent(raw: Mapping[str, Any], section: str, key: str) -> bool:
    """Whether the editor's settings name `section.key` (in either spelling)."""
    inner = next((value for name, value in raw.items() if _snake(str(name)) == section), None)
    return isinstance(inner, Mapping) and any(_snake(str(name)) == key for name in inner)


def parse_settings(raw: Any, base: Settings | None = None) -> tuple[Settings, list[str]]:
    """Settings from editor JSON, and one message per key that was wrong (its default is used instead).

    `base` supplies values that the editor did not send (for example `--model` from the command line).
    """
    problems: list[str] = []
    raw = unwrap(raw)
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        return base or Settings(), [f"settings must be a JSON object (got {type(raw).__name__}); using the defaults"]
    parsed = _parse_section(Settings, raw, "", problems)
    if base is not None:  # `diffill serve --model/--device/--dtype/...`: each model key the editor did not send
        unsent = {f.name: getattr(base.model, f.name) for f in fields(ModelSettings) if not _sent(raw, "model", f.name)}
        parsed = replace(parsed, model=replace(parsed.model, **unsent))
    if base is not None and not _sent(raw, "engine", "mode"):  # `diffill serve --engine-mode`
        parsed = replace(parsed, engine=replace(parsed.engine, mode=base.engine.mode))
    if parsed.completion.line_tokens > parsed.completion.max_tokens:
        problems.append("setting 'completion.lineTokens' is larger than 'completion.maxTokens'; using maxTokens")
        parsed = replace(parsed, completion=replace(parsed.completion, line_tokens=parsed.completion.max_tokens))
    return parsed, problems


def documented_settings() -> list[tuple[str, Any]]:
    """(camelCase dotted key, default) of every setting, in declaration order (the README table lists these)."""
    rows: list[tuple[str, Any]] = []

    def walk(cls: type, path: str) -> None:
        for spec in fields(cls):
            default = _default(spec)
            if is_dataclass(default):
                walk(type(default), f"{path}{_camel(spec.name)}.")
            else:
                rows.append((f"{path}{_camel(spec.name)}", _shown(default)))

    walk(Settings, "")
    return rows
