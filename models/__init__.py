"""From-scratch BERT-family encoders that load real checkpoints and reproduce ``transformers.BertModel``."""

from bertscope.models.config import EncoderConfig
from bertscope.models.encoder import Encoder, sinusoidal_table
from bertscope.models.loading import CheckpointError, from_hf_model, from_state_dict, load, random_encoder

__all__ = [
    "CheckpointError",
    "Encoder",
    "EncoderConfig",
    "from_hf_model",
    "from_state_dict",
    "load",
    "random_encoder",
    "sinusoidal_table",
]
