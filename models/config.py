"""`EncoderConfig`: every number that fixes the shape and arithmetic of an encoder."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

NormPlacement = Literal["post", "pre"]
PositionEncoding = Literal["learned", "sinusoidal"]

ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "gelu_fast")


@dataclass(frozen=True)
class EncoderConfig:
    """Configuration of a BERT-family encoder.

    The defaults are ``bert-base-uncased``. The three variant switches default to real BERT:

    - ``norm_placement``: ``"post"`` is BERT (``LN(x + sublayer(x))``); ``"pre"`` is the tutorials'
      ``x + sublayer(LN(x))``, with a final LayerNorm after the last block.
    - ``position_encoding``: ``"learned"`` is BERT's trained table; ``"sinusoidal"`` is the fixed table
      ``PE[p, 2i] = sin(p / 10000^(2i/d))``, ``PE[p, 2i+1] = cos(p / 10000^(2i/d))``.
    - ``attention_projections``: ``True`` is BERT's learned Q/K/V/O; ``False`` is the tutorials' raw
      attention, where Q = K = V = the layer input (split into heads) and there is no output projection.
    """

    vocab_size: int = 30522
    d_model: int = 768
    n_layers: int = 12
    n_heads: int = 12
    d_mlp: int = 3072
    max_positions: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    activation: str = "gelu"
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    norm_placement: NormPlacement = "post"
    position_encoding: PositionEncoding = "learned"
    attention_projections: bool = True
    pad_token_id: int = 0
    # ---- other architectures (defaults leave BERT unchanged) ------------------------------------------------
    # ``arch`` names the family whose modules ``Encoder`` subclasses build: "bert" here; "deberta-v2" is
    # ``models.deberta.DebertaEncoder``, "modernbert" is ``models.modernbert.ModernBertEncoder``.
    arch: str = "bert"
    # DeBERTa-v2/v3 (transformers' DebertaV2Config names)
    relative_attention: bool = False
    max_relative_positions: int = -1
    position_buckets: int = -1
    pos_att_type: tuple[str, ...] = ()
    share_att_key: bool = False
    norm_rel_ebd: str = "none"
    position_biased_input: bool = True
    # ModernBERT (ModernBertConfig names; the biases are on for BERT)
    layer_types: tuple[str, ...] = ()
    local_attention: int = 128
    global_rope_theta: float = 160000.0
    local_rope_theta: float = 10000.0
    attention_bias: bool = True
    mlp_bias: bool = True
    norm_bias: bool = True
    head_bias: bool = True
    decoder_bias: bool = True
    head_activation: str = "gelu"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "d_mlp", "max_positions"):
            if getattr(self, name) <= 0:
                raise ValueError(f"EncoderConfig.{name} must be positive, got {getattr(self, name)}")
        if self.type_vocab_size < 0:
            raise ValueError(f"EncoderConfig.type_vocab_size must be >= 0, got {self.type_vocab_size}")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})"
            )
        if self.norm_placement not in ("post", "pre"):
            raise ValueError(f"norm_placement must be 'post' or 'pre', got {self.norm_placement!r}")
        if self.position_encoding not in ("learned", "sinusoidal"):
            raise ValueError(
                f"position_encoding must be 'learned' or 'sinusoidal', got {self.position_encoding!r}"
            )
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation {self.activation!r} is not supported; choose one of {ACTIVATIONS}")
        for name in ("hidden_dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    def replace(self, **changes: Any) -> EncoderConfig:
        """A copy with some fields changed (the config is frozen)."""
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------------ Hugging Face interop
    @classmethod
    def from_hf(cls, config: Any, **overrides: Any) -> EncoderConfig:
        """Build from a Hugging Face ``config.json`` path, a dict of it, or a ``BertConfig``.

        ``overrides`` set fields directly (e.g. ``norm_placement="pre"``).
        """
        if isinstance(config, (str, Path)):
            path = Path(config)
            if path.is_dir():
                path = path / "config.json"
            if not path.is_file():
                raise FileNotFoundError(f"no config.json at {path}")
            config = json.loads(path.read_text(encoding="utf-8"))
        elif not isinstance(config, dict):
            config = config.to_dict()
        model_type = config.get("model_type", "bert")
        family = _family_config_builder(model_type)
        if family is not None:
            return family(config, **overrides)
        if model_type not in ("bert",):
            raise ValueError(
                f"config has model_type={model_type!r}; bertscope implements BERT encoders "
                "(model_type 'bert'). Other architectures need their own implementation."
            )
        pos_type = config.get("position_embedding_type", "absolute")
        if pos_type != "absolute":
            raise ValueError(
                f"position_embedding_type={pos_type!r} is not supported (only 'absolute', as in BERT)"
            )
        if config.get("is_decoder") or config.get("add_cross_attention"):
            raise ValueError("decoder / cross-attention BERT configs are not supported: bertscope is encoder-only")
        fields = dict(
            vocab_size=config["vocab_size"],
            d_model=config["hidden_size"],
            n_layers=config["num_hidden_layers"],
            n_heads=config["num_attention_heads"],
            d_mlp=config["intermediate_size"],
            max_positions=config["max_position_embeddings"],
            type_vocab_size=config.get("type_vocab_size", 2),
            layer_norm_eps=config.get("layer_norm_eps", 1e-12),
            activation=config.get("hidden_act", "gelu"),
            hidden_dropout=config.get("hidden_dropout_prob", 0.1),
            attention_dropout=config.get("attention_probs_dropout_prob", 0.1),
            pad_token_id=config.get("pad_token_id", 0) or 0,
        )
        fields.update(overrides)
        return cls(**fields)

    def to_hf(self) -> Any:
        """The equivalent ``transformers.BertConfig`` (only meaningful for the BERT variant)."""
        from transformers import BertConfig

        return BertConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.d_model,
            num_hidden_layers=self.n_layers,
            num_attention_heads=self.n_heads,
            intermediate_size=self.d_mlp,
            max_position_embeddings=self.max_positions,
            type_vocab_size=self.type_vocab_size,
            layer_norm_eps=self.layer_norm_eps,
            hidden_act=self.activation,
            hidden_dropout_prob=self.hidden_dropout,
            attention_probs_dropout_prob=self.attention_dropout,
            pad_token_id=self.pad_token_id,
        )


def _family_config_builder(model_type: str) -> Any:
    """``config_from_hf(dict, **overrides)`` of a family with its own module (DeBERTa-v2/v3, ModernBERT), or None."""
    if model_type == "deberta-v2":
        from bertscope.models.deberta import config_from_hf

        return config_from_hf
    if model_type == "modernbert":
        from bertscope.models.modernbert import config_from_hf

        return config_from_hf
    return None
