"""Tiny stand-ins for checkpoints that ship their own modelling code (Dream, LLaDA), used through `auto_map`.

Real Dream / DiffuCoder / LLaDA checkpoints carry `modeling_*.py` files that transformers imports only with
`trust_remote_code=True`. These tiny bidirectional transformers are copied into a temporary checkpoint directory
by the tests so that loading goes through exactly that path, offline.
"""

import torch
from torch import nn
from transformers import PreTrainedConfig, PreTrainedModel
from transformers.modeling_outputs import MaskedLMOutput


class TinyDreamConfig(PreTrainedConfig):
    model_type = "Dream"

    vocab_size: int = 64
    hidden_size: int = 32
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    max_position_embeddings: int = 512
    mask_token_id: int | None = None


class TinyLLaDAConfig(TinyDreamConfig):
    model_type = "llada"


class _TinyBidirectionalLM(PreTrainedModel):
    base_model_prefix = "tiny"

    def __init__(self, config):
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        layer = nn.TransformerEncoderLayer(config.hidden_size, config.num_attention_heads, 2 * config.hidden_size,
                                           dropout=0.0, batch_first=True)
        self.layers = nn.TransformerEncoder(layer, config.num_hidden_layers, enable_nested_tensor=False)
        self.head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_output_embeddings(self):
        return self.head

    def forward(self, input_ids=None, attention_mask=None, **kwargs):
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        hidden = self.embed(input_ids) + self.position(positions)[None]
        return MaskedLMOutput(logits=self.head(self.layers(hidden)))


class TinyDreamModel(_TinyBidirectionalLM):
    config_class = TinyDreamConfig


class TinyLLaDAModel(_TinyBidirectionalLM):
    config_class = TinyLLaDAConfig


# ------------------------------------------------------------------------------------------- Dream's architecture
# Dream (and LLaDA, in a different layout) is a Llama/Qwen2 block stack read bidirectionally: RMSNorm, rotary
# positions from `position_ids`, grouped-query attention with no causal mask, SwiGLU. Like Dream's own code, keys
# and values go through a transformers `Cache` (`past_key_values`) after the rotary embedding, so a forward can run a
# few positions against cached ones: what the dual cache (infill_engine/dual_cache.py) needs.


def _rotate_half(x):
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


class _RopeBlock(nn.Module):
    def __init__(self, config, index):
        super().__init__()
        self.index = index
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        hidden, bias = config.hidden_size, config.attention_bias
        self.input_layernorm = nn.RMSNorm(hidden, eps=1e-6)
        self.q_proj = nn.Linear(hidden, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, hidden, bias=False)
        self.post_attention_layernorm = nn.RMSNorm(hidden, eps=1e-6)
        self.gate_proj = nn.Linear(hidden, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, hidden, bias=False)

    def forward(self, hidden, cos, sin, cache):
        batch, length, _ = hidden.shape
        x = self.input_layernorm(hidden)
        q = self.q_proj(x).view(batch, length, self.heads, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        k = self.k_proj(x).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, D)
        v = self.v_proj(x).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        if cache is not None:
            k, v = cache.update(k, v, self.index)  # (B, Hkv, C + T, D)
        repeat = self.heads // self.kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        attended = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=False)  # (B, H, T, D)
        hidden = hidden + self.o_proj(attended.transpose(1, 2).reshape(batch, length, -1))
        x = self.post_attention_layernorm(hidden)
        return hidden + self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class _TinyRopeLM(PreTrainedModel):
    base_model_prefix = "tiny"

    def __init__(self, config):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.blocks = nn.ModuleList(_RopeBlock(config, i) for i in range(config.num_hidden_layers))
        self.norm = nn.RMSNorm(config.hidden_size, eps=1e-6)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_output_embeddings(self):
        return self.lm_head

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, use_cache=False,
                **kwargs):
        from transformers import DynamicCache
        from transformers.modeling_outputs import CausalLMOutputWithPast

        if use_cache and past_key_values is None:
            past_key_values = DynamicCache()
        if position_ids is None:
            start = past_key_values.get_seq_length() if past_key_values is not None else 0
            position_ids = torch.arange(start, start + input_ids.shape[1], device=input_ids.device)[None]
        head_dim = self.config.hidden_size // self.config.num_attention_heads
        # computed here, not kept as a buffer: from_pretrained leaves buffers that are not in the weights unset
        inv_freq = 1.0 / (self.config.rope_theta ** (torch.arange(0, head_dim, 2, device=input_ids.device) / head_dim))
        angles = position_ids[:, :, None].float() * inv_freq[None, None]  # (B, T, D/2)
        angles = torch.cat([angles, angles], dim=-1)[:, None]  # (B, 1, T, D)
        cos, sin = angles.cos(), angles.sin()
        hidden = self.embed_tokens(input_ids)
        for block in self.blocks:
            hidden = block(hidden, cos, sin, past_key_values)
        logits = self.lm_head(self.norm(hidden))
        return CausalLMOutputWithPast(logits=logits, past_key_values=past_key_values if use_cache else None)


class TinyRopeDreamConfig(PreTrainedConfig):
    model_type = "Dream"

    vocab_size: int = 64
    hidden_size: int = 32
    intermediate_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    attention_bias: bool = True  # Qwen2, and so Dream, have q/k/v biases
    rope_theta: float = 10_000.0
    max_position_embeddings: int = 512
    mask_token_id: int | None = None
    # Weights drawn wider than a trained model's init (0.02), so that random attention is peaked, not uniform: with
    # uniform attention neither positions nor a stale cache would change any output, and tests could not tell.
    initializer_range: float = 0.3


class TinyRopeLLaDAConfig(TinyRopeDreamConfig):
    model_type = "llada"

    attention_bias: bool = False


class TinyRopeDreamModel(_TinyRopeLM):
    config_class = TinyRopeDreamConfig


class TinyRopeLLaDAModel(_TinyRopeLM):
    config_class = TinyRopeLLaDAConfig
