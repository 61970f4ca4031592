"""What diffill would use on this machine, and whether each part loads (`diffill doctor`)."""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

from infill_engine.interface import DEFAULT_COMPILED_LAYERS


def diagnose(
    model: str | None, family: str | None, device: str, dtype: str, trust_remote_code: bool,
    compiled_layers: str = DEFAULT_COMPILED_LAYERS,
) -> dict[str, dict[str, Any]]:
    """A report per part: runtime, device, model, tokenizer, grammars; each with `ok` (`compiled_layers`: whether
    the model's compiled layers are looked for, as `--compiled-layers` says)."""
    import torch
    import transformers

    from infill_engine import syntax
    from infill_engine.device import choose_device, dtype_choice
    from infill_engine.loading import (
        ModelLoadError,
        compiles_layers,
        default_model_path,
        inspect_model,
        load_denoiser,
        read_config,
        stored_weights,
    )
    from infill_engine.packed_weights import packed_layers, packing_refusal

    report: dict[str, dict[str, Any]] = {
        "runtime": {
            "ok": True,
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "cuda available": torch.cuda.is_available(),
            "threads": torch.get_num_threads(),
        }
    }
    path = model or default_model_path()
    try:
        torch_device = choose_device(device)
        local = _local_directory(str(path)) if path is not None else None
        weights = stored_weights(local) if local is not None else None
        config = read_config(local) if local is not None else {}
        compiled = compiles_layers(str(config.get("model_type", "")), compiled_layers)
        chosen, why = dtype_choice(torch_device, dtype, weights, compiled)
        report["device"] = {"ok": True, "device": str(torch_device), "dtype": chosen, "dtype because": why}
    except (ValueError, ModelLoadError) as error:
        report["device"] = {"ok": False, "error": str(error)}
        device = "cpu"

    report["model"] = {"ok": False, "path": str(path) if path else "(none: no --model and no embedded model)"}
    if model is not None and not _hub_model(model, device, report):
        path = None  # a hub id that is not downloaded: judged by its catalogue entry, nothing is fetched
    if path is not None:
        try:
            info = inspect_model(path, family)
            report["model"].update(family=info.family, model_type=info.model_type,
                                   needs_remote_code=info.needs_remote_code,
                                   **({"loaded_as": "Qwen2, bidirectional"} if info.reads_as_qwen2 else {}))
            denoiser = load_denoiser(path, family=family, device=device, dtype=dtype,
                                     trust_remote_code=trust_remote_code, compiled_layers=compiled_layers)
            special = denoiser.special
            report["model"].update(
                ok=True, parameters=sum(p.numel() for p in denoiser.model.parameters()), noise=denoiser.noise,
                loaded_on=str(denoiser.device), dtype=denoiser.precision,
                **{"MKL-packed layers": packed_layers(denoiser.model)},
            )
            refusal = packing_refusal(denoiser.model)
            if refusal is not None:
                report["model"]["not packed because"] = refusal
            if hasattr(denoiser, "compiled_layers_state"):
                report["model"]["compiled layers"] = denoiser.compiled_layers_state
            report["tokenizer"] = {
                "ok": True,
                "class": type(denoiser.tokenizer).__name__,
                "size": len(denoiser.tokenizer),
                "mask id": special.mask_id,
                "end-of-span ids": list(special.end_of_span_ids),
                "pad id": special.pad_id,
            }
        except ModelLoadError as error:
            report["model"]["error"] = str(error)
    grammars: dict[str, Any] = {"ok": True}
    for language in syntax.SUPPORTED_LANGUAGES:
        try:
            grammars[language] = syntax.check_fill("x = 1\n", 0, 0, "", language).checker
        except Exception as error:  # noqa: BLE001 - the report names any failure
            grammars[language] = f"fails: {error}"
            grammars["ok"] = False
    report["grammars"] = grammars
    return report


def _hub_model(model: str, device: str, report: dict[str, dict[str, Any]]) -> bool:
    """For a hub id: the `fit` section when the catalogue knows it; whether it is cached (so it may be loaded)."""
    from infill_engine.catalogue import find
    from infill_engine.fit import fit_verdict, gpu_gib, ram_gib
    from infill_engine.hub import cached_snapshot, fetch_command, parse_hub_id

    hub_id = parse_hub_id(model)
    if hub_id is None:
        return True
    known = find(model)
    if known is not None:
        report["fit"] = fit_verdict(known, ram_gib(), gpu_gib() if device != "cpu" else None)
    if cached_snapshot(hub_id) is not None:
        return True
    report["model"].update(ok=True, cached=False, catalogued=known is not None,
                           note=f"not downloaded (nothing was fetched); `{fetch_command(hub_id)}` fetches it")
    return False


def _local_directory(model: str) -> Path | None:
    """The directory a model path or hub id names on this machine (a hub id's cached snapshot), None if none."""
    from infill_engine.hub import cached_snapshot, parse_hub_id

    if Path(model).is_dir():
        return Path(model)
    hub_id = parse_hub_id(model)
    return cached_snapshot(hub_id) if hub_id is not None else None
