"""From-scratch BERT-family encoders that load real checkpoints (BERT, RoBERTa, XLM-R, DistilBERT, ALBERT, ELECTRA)
and reproduce transformers' own models."""

from bertscope.models.config import EncoderConfig
from bertscope.models.encoder import Encoder, sinusoidal_table
from bertscope.models.families import FAMILIES, Family, supported_model_types
from bertscope.models.loading import CheckpointError, from_hf_model, from_state_dict, load, random_encoder

__all__ = [
    "CheckpointError",
    "Encoder",
    "EncoderConfig",
    "FAMILIES",
    "Family",
    "from_hf_model",
    "from_state_dict",
    "load",
    "random_encoder",
    "sinusoidal_table",
    "supported_model_types",
]
