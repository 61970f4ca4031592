"""The project's embedded masked-diffusion code model, registered with the transformers Auto classes on import."""

from transformers import AutoConfig, AutoModelForMaskedLM

from .configuration_diffill import DiffillConfig
from .modeling_diffill import (
    DiffillContextCache,
    DiffillForInfilling,
    DiffillPreTrainedModel,
    infilling_attention_mask,
    masked_diffusion_loss,
)

# exist_ok: importing twice (or reloading this module) re-registers the same names instead of raising.
AutoConfig.register(DiffillConfig.model_type, DiffillConfig, exist_ok=True)
AutoModelForMaskedLM.register(DiffillConfig, DiffillForInfilling, exist_ok=True)

__all__ = [
    "DiffillConfig",
    "DiffillContextCache",
    "DiffillForInfilling",
    "DiffillPreTrainedModel",
    "infilling_attention_mask",
    "masked_diffusion_loss",
]
