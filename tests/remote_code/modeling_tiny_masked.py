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
