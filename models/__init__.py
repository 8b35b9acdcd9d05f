"""From-scratch BERT-family encoders that load real checkpoints and reproduce transformers' own models.

Eight families (``models.FAMILIES``, by ``model_type``): BERT (``bert``), RoBERTa (``roberta``), XLM-R
(``xlm-roberta``), DistilBERT (``distilbert``), ALBERT (``albert``), ELECTRA (``electra``), DeBERTa-v2/v3
(``deberta-v2``) and ModernBERT (``modernbert``).
Adding a family: one ``Family`` entry in ``models/families.py`` (docs/architecture.md, "Where each kind of change
goes")."""

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
