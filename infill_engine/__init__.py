"""diffill's infill engine: fills the span between a prefix and a suffix with a diffusion language model.

It knows nothing of editors or LSP. Importing this package is cheap (no torch); the names below load on first use.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "Engine": "infill_engine.interface",
    "EngineOptions": "infill_engine.interface",
    "ModelInfo": "infill_engine.interface",
    "ModelSpec": "infill_engine.interface",
    "open_engine": "infill_engine.interface",
    "InfillEngine": "infill_engine.engine",
    "InfillRequest": "infill_engine.engine",
    "InfillResult": "infill_engine.engine",
    "Candidate": "infill_engine.engine",
    "SamplerConfig": "infill_engine.sampler",
    "FillCancelled": "infill_engine.request",
    "ContextConfig": "infill_engine.canvas",
    "FillStats": "infill_engine.stats",
    "load_denoiser": "infill_engine.loading",
    "ModelLoadError": "infill_engine.loading",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import the public names lazily, so that `import infill_engine` does not import torch."""
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'infill_engine' has no attribute {name!r}")
