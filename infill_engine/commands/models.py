"""`diffill models`: the catalogue of known diffusion code models, with sizes, scores, settings and cache state."""

from __future__ import annotations

import argparse
import json
from typing import Any

HELP = "list known diffusion code models: hub id, family, licence, memory, infilling scores, settings, cached"
UNCONFIRMED = "unconfirmed"


def add_arguments(models: argparse.ArgumentParser) -> None:
    """The options of `diffill models`."""
    models.add_argument("--json", action="store_true", help="print JSON, with the source of every fact")


def describe(model: Any) -> dict[str, Any]:
    """One catalogue entry as plain data: each fact, "unconfirmed" where it has no source, and the cache state."""
    settings = model.settings
    return {
        "key": model.key,
        "name": model.name,
        "hub_id": model.hub_id,
        "family": model.family,
        "licence": model.licence if model.confirmed("licence") else UNCONFIRMED,
        "parameters_b": model.parameters if model.confirmed("parameters") else UNCONFIRMED,
        "memory_gib": {"bf16": _gib(model.memory_gib(2)), "int8": _gib(model.memory_gib(1)),
                       "note": "weights only, computed from the parameter count"},
        "scores": [{"benchmark": s.benchmark, "value": s.value, "protocol": s.protocol, "source": s.source}
                   for s in model.scores],
        "settings": None if settings is None else {**settings.sampler_fields(),
                                                   "source": settings.source or UNCONFIRMED},
        "sources": model.sources,
        "notes": model.notes,
        "cached": model.cached(),
    }


def table(rows: list[dict[str, Any]]) -> str:
    """The catalogue as a text table, one model a line, then the notes."""
    header = ("hub id", "family", "licence", "params", "bf16", "int8", "HumanEval-Infill", "settings", "cached")
    lines = [header]
    for row in rows:
        params = row["parameters_b"]
        lines.append((
            row["hub_id"], row["family"], row["licence"],
            f"{params:g}B" if isinstance(params, float) else params,
            _size(row["memory_gib"]["bf16"]), _size(row["memory_gib"]["int8"]),
            _score(row["scores"]), _settings(row["settings"]), "yes" if row["cached"] else "no",
        ))
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(header))]
    text = ["  ".join(str(cell).ljust(width) for cell, width in zip(line, widths)).rstrip() for line in lines]
    text.append("")
    text.append("memory: weights only, computed from the parameter count (2 bytes/parameter at bf16, 1 at int8).")
    text.append("HumanEval-Infill: single-line pass@1 averaged over fixed lengths (oracle length in brackets);"
                " sources in docs/MODELS.md or --json.")
    text.append("use one: diffill fill FILE:LINE:COL --model HUB_ID; check it first: diffill doctor --model HUB_ID")
    return "\n".join(text)


def run(args: argparse.Namespace) -> int:
    """Print the catalogue."""
    from infill_engine.catalogue import MODELS

    rows = [describe(model) for model in MODELS]
    print(json.dumps(rows, indent=2) if args.json else table(rows))
    return 0


def _gib(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _size(value: float | None) -> str:
    return UNCONFIRMED if value is None else f"{value:.1f} GiB"


def _score(scores: list[dict[str, Any]]) -> str:
    values = [s for s in scores if s["benchmark"].startswith("HumanEval-Infilling")]
    if not values:
        return "unconfirmed"
    fixed = [s["value"] for s in values if "oracle" not in s["protocol"]]
    oracle = [s["value"] for s in values if "oracle" in s["protocol"]]
    return " ".join([f"{v:g}" for v in fixed] + [f"({v:g})" for v in oracle])


def _settings(settings: dict[str, Any] | None) -> str:
    if settings is None:
        return "family default"
    mark = "" if settings["source"] != UNCONFIRMED else " (unconfirmed)"
    return f"{settings['steps']} steps, block {settings['block_size']}, {settings['commit']}{mark}"
