"""Configuration of the embedded masked-diffusion infilling model."""

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig


@strict
class DiffillConfig(PreTrainedConfig):
    """Hyperparameters of `DiffillForInfilling`; the defaults describe the small embedded model."""

    model_type = "diffill"

    vocab_size: int = 8192  # tokenizer vocabulary, special tokens included
    hidden_size: int = 256  # width C of the residual stream
    num_hidden_layers: int = 6  # number of transformer blocks
    num_attention_heads: int = 4  # heads H; the head size D = C / H must be even for RoPE
    num_key_value_heads: int | None = None  # key/value heads (grouped-query attention); None: one per head
    intermediate_size: int = 704  # width of the SwiGLU hidden layer (about 8/3 C, rounded to a multiple of 64)
    max_position_embeddings: int = 2048  # longest prefix + canvas + suffix seen in training (positions 0..2047)
    rope_theta: float | int = 10_000.0  # base wavelength of the rotary position embeddings
    rms_norm_eps: float = 1e-6  # epsilon inside every RMSNorm
    initializer_range: float = 0.02  # std of the normal init of linear and embedding weights
    tie_word_embeddings: bool = True  # the output projection shares the input embedding matrix
    # Set for a model that starts from an autoregressive one (see causal_conversion.py):
    shift_logits: bool = False  # the output at position p predicts the token at p + 1, as the causal LM did (Dream)
    causal_context: bool = False  # context tokens attend only to context at earlier or equal positions
    # The autoregressive twin (training/fim_objective.py): with shift_logits and causal_context, trained on
    # fill-in-the-middle sequences that are all context (no canvas); generated token by token (fim_generation.py).
    autoregressive: bool = False
    # Special token ids are copied from the tokenizer by the training code; the model never assumes their values.
    mask_token_id: int | None = None  # the token that fills not-yet-decoded canvas positions
    end_of_span_token_id: int | None = None  # the token that ends a span shorter than its canvas
    pad_token_id: int | None = None  # the token at padding positions (never attended)

    def validate_architecture(self) -> None:
        """Check that the heads split the width evenly into rotary-compatible (even) head sizes."""
        super().validate_architecture()
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be a multiple of num_attention_heads "
                f"({self.num_attention_heads})"
            )
        kv_heads = self.num_key_value_heads or self.num_attention_heads
        if self.num_attention_heads % kv_heads != 0:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of num_key_value_heads "
                f"({kv_heads})"
            )
        if (self.hidden_size // self.num_attention_heads) % 2 != 0:
            raise ValueError(
                f"the head size hidden_size / num_attention_heads = {self.hidden_size // self.num_attention_heads} "
                "must be even for rotary position embeddings"
            )


__all__ = ["DiffillConfig"]
