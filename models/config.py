"""`EncoderConfig`: every number that fixes the shape and arithmetic of an encoder."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

NormPlacement = Literal["post", "pre"]
PositionEncoding = Literal["learned", "sinusoidal"]
PositionIds = Literal["sequential", "padding_aware"]

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

    The other BERT-family checkpoints (see ``models.families``) are further switches:

    - ``position_ids``: ``"sequential"`` numbers positions 0, 1, ... (BERT, DistilBERT, ALBERT, ELECTRA);
      ``"padding_aware"`` is RoBERTa's: real tokens count up from ``pad_token_id + 1`` and padding tokens get
      position ``pad_token_id`` (``create_position_ids_from_input_ids``), so only ``max_length`` tokens fit.
    - ``d_embed``: width of the embedding tables when they are projected to ``d_model`` after the embedding
      LayerNorm (ALBERT's factorised embeddings, ELECTRA with ``embedding_size != hidden_size``); None means
      no projection (the tables are ``d_model`` wide). The masked-LM head then maps back to ``d_embed``.
    - ``layer_groups``: ALBERT's parameter sharing. None gives every layer its own weights; ``g`` makes layer
      ``L`` use group ``L * g // n_layers``'s weights (ALBERT's usual ``g = 1``: one layer's weights for all).
    - ``type_vocab_size = 0``: no token-type (segment) embeddings (DistilBERT).
    - ``mlm_activation``: the masked-LM head's activation when it differs from ``activation`` (RoBERTa's and
      ELECTRA's heads always use the exact GELU).
    - ``model_type``: the ``config.json`` ``model_type`` this config was built from (informational).
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
    position_ids: PositionIds = "sequential"
    d_embed: int | None = None
    layer_groups: int | None = None
    mlm_activation: str | None = None
    model_type: str = "bert"
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
        if self.position_ids not in ("sequential", "padding_aware"):
            raise ValueError(f"position_ids must be 'sequential' or 'padding_aware', got {self.position_ids!r}")
        if self.max_length <= 0:
            raise ValueError(
                f"max_positions ({self.max_positions}) leaves no room for tokens after the padding offset "
                f"({self.max_positions - self.max_length})"
            )
        if self.d_embed is not None and self.d_embed <= 0:
            raise ValueError(f"EncoderConfig.d_embed must be positive or None, got {self.d_embed}")
        if self.layer_groups is not None and not 1 <= self.layer_groups <= self.n_layers:
            raise ValueError(f"layer_groups must be None or in 1..n_layers ({self.n_layers}), got {self.layer_groups}")
        if self.mlm_activation is not None and self.mlm_activation not in ACTIVATIONS:
            raise ValueError(f"mlm_activation {self.mlm_activation!r} is not supported; choose one of {ACTIVATIONS}")
        for name in ("hidden_dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @property
    def d_vocab_embed(self) -> int:
        """Width of the token/position/type embedding tables (``d_embed`` if projected, else ``d_model``)."""
        return self.d_model if self.d_embed is None else self.d_embed

    @property
    def position_offset(self) -> int:
        """Position id of the first token: 0, or ``pad_token_id + 1`` with RoBERTa's padding-aware ids."""
        return self.pad_token_id + 1 if self.position_ids == "padding_aware" else 0

    @property
    def max_length(self) -> int:
        """Longest input in tokens: the position table's rows after the offset."""
        return self.max_positions - self.position_offset

    def layer_group(self, layer: int) -> int:
        """Index of the parameter group layer ``layer`` uses (its own index when nothing is shared)."""
        return layer if self.layer_groups is None else layer * self.layer_groups // self.n_layers

    def replace(self, **changes: Any) -> EncoderConfig:
        """A copy with some fields changed (the config is frozen)."""
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------------ Hugging Face interop
    @classmethod
    def from_hf(cls, config: Any, **overrides: Any) -> EncoderConfig:
        """Build from a Hugging Face ``config.json`` path, a dict of it, or a ``PretrainedConfig``.

        ``model_type`` picks the family's config builder (``models.families``); an unsupported type raises a
        ``ValueError`` listing the supported ones. ``overrides`` set fields directly (e.g.
        ``norm_placement="pre"``).
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
        from bertscope.models.families import family_for

        fields = family_for(config.get("model_type", "bert")).config_fields(config)
        fields.update(overrides)
        return cls(**fields)

    def to_hf(self) -> Any:
        """The equivalent ``transformers.BertConfig`` (only meaningful for the BERT variant)."""
        from transformers import BertConfig

        if self.model_type != "bert":
            raise ValueError(f"to_hf builds a BertConfig; this config is a {self.model_type!r} encoder")

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

