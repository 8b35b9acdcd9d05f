"""Which checkpoints bertscope reads: one ``Family`` per ``config.json`` ``model_type``.

A family says two things: how its ``config.json`` becomes ``EncoderConfig`` fields, and where each tensor of
its state dict goes in ``Encoder`` (a table of regular expressions). ``convert.convert_by_rules`` applies the
table, fuses Q/K/V and copies shared (ALBERT) weights to every layer; nothing there is family-specific.

To add a family: write its config builder and key rules (in its own module if they are long) and add an entry
to ``FAMILIES``. A family whose modules differ from BERT's (DeBERTa-v2/v3, ModernBERT) names, instead of key
rules, its own state-dict converter and ``Encoder`` subclass (``"module:name"`` strings, imported when used, so
that this table does not import the model code). Every family then goes through the same loader
(``loading.from_state_dict``: convert, build ``encoder_class``, check every tensor).

Rules are ``(pattern, target)`` pairs matched in order against the whole key: ``target`` is
a ``re`` replacement naming the ``Encoder`` parameter, or None for a tensor known and dropped on purpose.

Target names: ``embed.{word,pos,token_type,ln,proj}``, ``pooler.dense``, ``mlm_head.{dense,ln,bias,decoder}``,
``blocks.L.{attn.out,ln1,mlp.fc_in,mlp.fc_out,ln2}`` and ``blocks.L.attn.PART`` with PART one of the family's
``qkv_names`` (fused into ``blocks.L.attn.qkv``). ``groups.G.*`` instead of ``blocks.L.*`` stands for the
weights layer group ``G`` shares (copied to every layer ``L`` with ``config.layer_group(L) == G``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bertscope.models.convert import convert_by_rules

Rule = tuple[str, str | None]

_WB = r"(weight|bias)"


@dataclass(frozen=True)
class Family:
    """How to read one architecture's checkpoints.

    ``config_fields(hf_config_dict) -> dict`` gives ``EncoderConfig`` keyword arguments. ``encoder_rules`` map
    keys of the base model (after the prefix a task model adds, e.g. ``roberta.``); ``head_rules`` map the
    task model's own top-level keys (the masked-LM head); keys starting with ``ignored_heads`` are other task
    heads, dropped on purpose. ``qkv_names`` are the family's names of the query, key and value projections.
    ``marker`` is the base model's key whose prefix locates the encoder inside a task model's state dict.

    ``converter`` (optional, ``"module:function"``): ``function(state, config) -> (mapped, has_pooler, has_mlm)``
    replaces the rule-based conversion. ``encoder`` (``"module:Class"``): the ``Encoder`` (sub)class to build,
    called as ``Class(config, pooler=..., mlm_head=...)``.
    """

    model_type: str
    config_fields: Callable[[dict[str, Any]], dict[str, Any]]
    encoder_rules: tuple[Rule, ...]
    head_rules: tuple[Rule, ...] = ()
    ignored_heads: tuple[str, ...] = ()
    qkv_names: tuple[str, str, str] = ("query", "key", "value")
    marker: str = "embeddings.word_embeddings.weight"
    converter: str | None = None
    encoder: str = "bertscope.models.encoder:Encoder"

    def encoder_class(self) -> type:
        """The ``Encoder`` (sub)class this family builds."""
        return _resolve(self.encoder)

    def convert_state_dict(self, state: dict[str, Any], config: Any) -> tuple[dict[str, Any], bool, bool]:
        """(mapped state, has_pooler, has_mlm): the family's converter, or the rule-based one."""
        if self.converter is not None:
            return _resolve(self.converter)(state, config)
        return convert_by_rules(self, state, config)

    def map_encoder_key(self, key: str) -> tuple[bool, str | None]:
        """(matched, target) for a key of the base model."""
        return _apply(self.encoder_rules, key)

    def map_head_key(self, key: str) -> tuple[bool, str | None]:
        """(matched, target) for a task model's top-level key; ignored heads match with target None."""
        if key.startswith(self.ignored_heads):
            return True, None
        return _apply(self.head_rules, key)


def _resolve(ref: str) -> Any:
    """``"package.module:name"`` -> the object."""
    import importlib

    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def _apply(rules: tuple[Rule, ...], key: str) -> tuple[bool, str | None]:
    for pattern, target in rules:
        m = re.fullmatch(pattern, key)
        if m:
            return True, None if target is None else m.expand(target)
    return False, None


# ====================================================================== shared pieces
def _check_encoder_only(config: dict[str, Any]) -> None:
    pos_type = config.get("position_embedding_type", "absolute")
    if pos_type not in (None, "absolute"):
        raise ValueError(f"position_embedding_type={pos_type!r} is not supported (only 'absolute', as in BERT)")
    if config.get("is_decoder") or config.get("add_cross_attention"):
        raise ValueError("decoder / cross-attention configs are not supported: bertscope is encoder-only")


def _bert_fields(config: dict[str, Any]) -> dict[str, Any]:
    """The fields BERT, RoBERTa, XLM-R, ALBERT and ELECTRA name alike in config.json."""
    _check_encoder_only(config)
    return dict(
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
        model_type=config.get("model_type", "bert"),
    )


_BERT_EMBED: tuple[Rule, ...] = (
    (r"embeddings\.word_embeddings\.weight", r"embed.word.weight"),
    (r"embeddings\.position_embeddings\.weight", r"embed.pos.weight"),
    (r"embeddings\.token_type_embeddings\.weight", r"embed.token_type.weight"),
    (rf"embeddings\.LayerNorm\.{_WB}", r"embed.ln.\1"),
    (r"embeddings\.(position_ids|token_type_ids)", None),  # buffers, not weights
)
_BERT_LAYERS: tuple[Rule, ...] = (
    (rf"encoder\.layer\.(\d+)\.attention\.self\.(query|key|value)\.{_WB}", r"blocks.\1.attn.\2.\3"),
    (rf"encoder\.layer\.(\d+)\.attention\.output\.dense\.{_WB}", r"blocks.\1.attn.out.\2"),
    (rf"encoder\.layer\.(\d+)\.attention\.output\.LayerNorm\.{_WB}", r"blocks.\1.ln1.\2"),
    (rf"encoder\.layer\.(\d+)\.intermediate\.dense\.{_WB}", r"blocks.\1.mlp.fc_in.\2"),
    (rf"encoder\.layer\.(\d+)\.output\.dense\.{_WB}", r"blocks.\1.mlp.fc_out.\2"),
    (rf"encoder\.layer\.(\d+)\.output\.LayerNorm\.{_WB}", r"blocks.\1.ln2.\2"),
)
_POOLER: tuple[Rule, ...] = ((rf"pooler\.dense\.{_WB}", r"pooler.dense.\1"),)


def _mlm_rules(prefix: str, dense: str, ln: str, decoder: str, bias: tuple[str, ...]) -> tuple[Rule, ...]:
    """A masked-LM head ``decoder(LN(act(dense(h)))) + bias`` stored under the given names."""
    p = re.escape(prefix)
    return (
        (rf"{p}{re.escape(dense)}\.{_WB}", r"mlm_head.dense.\1"),
        (rf"{p}{re.escape(ln)}\.{_WB}", r"mlm_head.ln.\1"),
        *((rf"{p}{re.escape(b)}", "mlm_head.bias") for b in bias),
        (rf"{p}{re.escape(decoder)}\.weight", "mlm_head.decoder"),
    )


_TASK_HEADS = ("classifier.", "qa_outputs.")

# ====================================================================== BERT
BERT = Family(
    model_type="bert",
    config_fields=_bert_fields,
    encoder_rules=_BERT_EMBED + _BERT_LAYERS + _POOLER,
    head_rules=_mlm_rules("cls.predictions.", "transform.dense", "transform.LayerNorm", "decoder",
                          ("bias", "decoder.bias")),
    ignored_heads=("cls.seq_relationship.", "lm_head.", *_TASK_HEADS),
)


# ====================================================================== RoBERTa, XLM-RoBERTa
def _roberta_fields(config: dict[str, Any]) -> dict[str, Any]:
    fields = _bert_fields(config)
    fields.update(position_ids="padding_aware", pad_token_id=config.get("pad_token_id", 1), mlm_activation="gelu",
                  type_vocab_size=config.get("type_vocab_size", 1))
    return fields


_ROBERTA_HEAD = _mlm_rules("lm_head.", "dense", "layer_norm", "decoder", ("bias", "decoder.bias"))
ROBERTA = Family(
    model_type="roberta",
    config_fields=_roberta_fields,
    encoder_rules=_BERT_EMBED + _BERT_LAYERS + _POOLER,
    head_rules=_ROBERTA_HEAD,
    ignored_heads=_TASK_HEADS,
)
XLM_ROBERTA = Family(
    model_type="xlm-roberta",
    config_fields=_roberta_fields,
    encoder_rules=_BERT_EMBED + _BERT_LAYERS + _POOLER,
    head_rules=_ROBERTA_HEAD,
    ignored_heads=_TASK_HEADS,
)


# ====================================================================== DistilBERT
def _distilbert_fields(config: dict[str, Any]) -> dict[str, Any]:
    _check_encoder_only(config)
    return dict(
        vocab_size=config["vocab_size"],
        d_model=config["dim"],
        n_layers=config["n_layers"],
        n_heads=config["n_heads"],
        d_mlp=config["hidden_dim"],
        max_positions=config["max_position_embeddings"],
        type_vocab_size=0,
        layer_norm_eps=1e-12,  # hard-coded in transformers' DistilBERT
        activation=config.get("activation", "gelu"),
        hidden_dropout=config.get("dropout", 0.1),
        attention_dropout=config.get("attention_dropout", 0.1),
        pad_token_id=config.get("pad_token_id", 0) or 0,
        model_type="distilbert",
    )


_DL = r"transformer\.layer\.(\d+)\."
DISTILBERT = Family(
    model_type="distilbert",
    config_fields=_distilbert_fields,
    encoder_rules=(
        (r"embeddings\.word_embeddings\.weight", r"embed.word.weight"),
        (r"embeddings\.position_embeddings\.weight", r"embed.pos.weight"),
        (rf"embeddings\.LayerNorm\.{_WB}", r"embed.ln.\1"),
        (r"embeddings\.position_ids", None),
        (rf"{_DL}attention\.(q_lin|k_lin|v_lin)\.{_WB}", r"blocks.\1.attn.\2.\3"),
        (rf"{_DL}attention\.out_lin\.{_WB}", r"blocks.\1.attn.out.\2"),
        (rf"{_DL}sa_layer_norm\.{_WB}", r"blocks.\1.ln1.\2"),
        (rf"{_DL}ffn\.lin1\.{_WB}", r"blocks.\1.mlp.fc_in.\2"),
        (rf"{_DL}ffn\.lin2\.{_WB}", r"blocks.\1.mlp.fc_out.\2"),
        (rf"{_DL}output_layer_norm\.{_WB}", r"blocks.\1.ln2.\2"),
    ),
    head_rules=_mlm_rules("", "vocab_transform", "vocab_layer_norm", "vocab_projector", ("vocab_projector.bias",)),
    ignored_heads=("pre_classifier.", *_TASK_HEADS),
    qkv_names=("q_lin", "k_lin", "v_lin"),
)


# ====================================================================== ALBERT
def _albert_fields(config: dict[str, Any]) -> dict[str, Any]:
    inner = config.get("inner_group_num", 1)
    if inner != 1:
        raise ValueError(f"ALBERT with inner_group_num={inner} is not supported (only 1, as in every released "
                         "ALBERT checkpoint)")
    groups = config.get("num_hidden_groups", 1)
    fields = _bert_fields(config)
    if fields["n_layers"] % groups:
        raise ValueError(f"ALBERT num_hidden_groups={groups} must divide num_hidden_layers={fields['n_layers']}")
    fields.update(d_embed=config.get("embedding_size", 128), layer_groups=groups,
                  activation=config.get("hidden_act", "gelu_new"))
    return fields


_AL = r"encoder\.albert_layer_groups\.(\d+)\.albert_layers\.0\."
ALBERT = Family(
    model_type="albert",
    config_fields=_albert_fields,
    encoder_rules=_BERT_EMBED + (
        (rf"encoder\.embedding_hidden_mapping_in\.{_WB}", r"embed.proj.\1"),
        (rf"{_AL}attention\.(query|key|value)\.{_WB}", r"groups.\1.attn.\2.\3"),
        (rf"{_AL}attention\.dense\.{_WB}", r"groups.\1.attn.out.\2"),
        (rf"{_AL}attention\.LayerNorm\.{_WB}", r"groups.\1.ln1.\2"),
        (rf"{_AL}ffn\.{_WB}", r"groups.\1.mlp.fc_in.\2"),
        (rf"{_AL}ffn_output\.{_WB}", r"groups.\1.mlp.fc_out.\2"),
        (rf"{_AL}full_layer_layer_norm\.{_WB}", r"groups.\1.ln2.\2"),
        (rf"pooler\.{_WB}", r"pooler.dense.\1"),
    ),
    head_rules=_mlm_rules("predictions.", "dense", "LayerNorm", "decoder", ("bias", "decoder.bias")),
    ignored_heads=("sop_classifier.", *_TASK_HEADS),
)


# ====================================================================== ELECTRA
def _electra_fields(config: dict[str, Any]) -> dict[str, Any]:
    fields = _bert_fields(config)
    embedding_size = config.get("embedding_size", fields["d_model"])
    fields.update(d_embed=None if embedding_size == fields["d_model"] else embedding_size, mlm_activation="gelu")
    return fields


ELECTRA = Family(
    model_type="electra",
    config_fields=_electra_fields,
    encoder_rules=_BERT_EMBED + _BERT_LAYERS + ((rf"embeddings_project\.{_WB}", r"embed.proj.\1"),),
    head_rules=(
        (rf"generator_predictions\.dense\.{_WB}", r"mlm_head.dense.\1"),
        (rf"generator_predictions\.LayerNorm\.{_WB}", r"mlm_head.ln.\1"),
        (r"generator_lm_head\.bias", "mlm_head.bias"),
        (r"generator_lm_head\.weight", "mlm_head.decoder"),
    ),
    ignored_heads=("discriminator_predictions.", "sequence_summary.", *_TASK_HEADS),
)


# ====================================================================== DeBERTa-v2/v3, ModernBERT
def _deberta_fields(config: dict[str, Any]) -> dict[str, Any]:
    return _resolve("bertscope.models.deberta:config_fields")(config)  # named like its encoder and converter


def _modernbert_fields(config: dict[str, Any]) -> dict[str, Any]:
    return _resolve("bertscope.models.modernbert:config_fields")(config)


DEBERTA_V2 = Family(
    model_type="deberta-v2",
    config_fields=_deberta_fields,
    encoder_rules=(),
    converter="bertscope.models.deberta:convert_state_dict",
    encoder="bertscope.models.deberta:DebertaEncoder",
)
MODERNBERT = Family(
    model_type="modernbert",
    config_fields=_modernbert_fields,
    encoder_rules=(),
    converter="bertscope.models.modernbert:convert_state_dict",
    encoder="bertscope.models.modernbert:ModernBertEncoder",
)

# ====================================================================== the table
FAMILIES: dict[str, Family] = {
    f.model_type: f
    for f in (BERT, ROBERTA, XLM_ROBERTA, DISTILBERT, ALBERT, ELECTRA, DEBERTA_V2, MODERNBERT)
}


def supported_model_types() -> list[str]:
    """Every ``model_type`` bertscope can load (the keys of ``FAMILIES``), sorted."""
    return sorted(FAMILIES)


def family_for(model_type: str) -> Family:
    """The ``Family`` for a ``config.json`` ``model_type``; a ``ValueError`` naming the supported ones if none."""
    if model_type not in FAMILIES:
        raise ValueError(
            f"config has model_type={model_type!r}, which bertscope does not implement; supported model types: "
            f"{', '.join(supported_model_types())}"
        )
    return FAMILIES[model_type]
