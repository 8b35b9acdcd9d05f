"""DeBERTa-v2/v3 (``model_type`` "deberta-v2"): BERT's post-LN blocks with disentangled attention.

The attention score of query i and key j is the sum of up to three terms, each divided by
``sqrt(d_head * scale_factor)`` with ``scale_factor = 1 + [c2p used] + [p2c used]``:

- content-to-content ``c2c[i, j] = q_i . k_j``;
- content-to-position ``c2p[i, j] = q_i . Kr[delta(i, j)]``: the query against the projected relative-position
  embedding of the key's offset;
- position-to-content ``p2c[i, j] = k_j . Qr[delta(j, i)]``: the key against the projected relative embedding of
  the reverse offset;

where ``delta(i, j) = clamp(bucket(i - j) + span, 0, 2 span - 1)`` indexes the ``[2 span, d_model]`` table of
relative embeddings (log-bucketed beyond ``position_buckets / 2``; LayerNorm-ed once per forward when
``norm_rel_ebd`` has "layer_norm"). ``Kr``/``Qr`` use the content key/query projections when ``share_att_key``,
else their own ``pos_key_proj``/``pos_query_proj``. Absolute positions are added to the embeddings only if
``position_biased_input``. The embedding output is multiplied by the attention mask (padding rows are zero) and
both padded queries and padded keys are masked, as transformers does. Matches
``transformers.DebertaV2Model`` (eager attention).

Shapes: ``b`` batch, ``q``/``k`` query/key position, ``r`` relative-embedding row (``2 span``), ``h`` head,
``d`` d_head, ``m`` d_model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from bertscope.hooks.hook_points import HookedModule, HookPoint
from bertscope.models.config import EncoderConfig
from bertscope.models.encoder import Attention, Block, Encoder, LayerNorm, MLMHead
from bertscope.models.family_common import attention_output, hook_order
from einops import rearrange
from torch import nn

MODEL_TYPE = "deberta-v2"


# ====================================================================== config
def config_fields(config: dict[str, Any]) -> dict[str, Any]:
    """``EncoderConfig`` fields from a DeBERTa-v2/v3 ``config.json`` dict (transformers' defaults where a key is
    absent).

    Refuses what this implementation does not cover: the convolution layer (``conv_kernel_size``), an embedding
    size other than ``hidden_size`` (``embed_proj``), a custom ``attention_head_size``.
    """
    if config.get("model_type") != MODEL_TYPE:
        raise ValueError(f"not a DeBERTa-v2/v3 config: model_type={config.get('model_type')!r}")
    if (config.get("conv_kernel_size") or 0) > 0:
        raise ValueError(
            f"DeBERTa conv layer (conv_kernel_size={config['conv_kernel_size']}) is not implemented in bertscope; "
            "DeBERTa-v3 checkpoints do not use it (DeBERTa-v2 xlarge/xxlarge do)"
        )
    d = config.get("hidden_size", 1536)
    if config.get("embedding_size", d) != d:
        raise ValueError(f"DeBERTa embedding_size ({config['embedding_size']}) != hidden_size ({d}) is not supported")
    n_heads = config.get("num_attention_heads", 24)
    if config.get("attention_head_size", d // n_heads) != d // n_heads:
        raise ValueError("DeBERTa attention_head_size other than hidden_size / num_attention_heads is not supported")
    pos_att = config.get("pos_att_type") or ()
    if isinstance(pos_att, str):
        pos_att = [x.strip() for x in pos_att.lower().split("|")]
    unknown = [t for t in pos_att if t not in ("c2p", "p2c")]
    if unknown:
        raise ValueError(f"pos_att_type entries must be 'c2p' or 'p2c', got {unknown}")
    fields = dict(
        arch=MODEL_TYPE,
        model_type=MODEL_TYPE,
        vocab_size=config.get("vocab_size", 128100),
        d_model=d,
        n_layers=config.get("num_hidden_layers", 24),
        n_heads=n_heads,
        d_mlp=config.get("intermediate_size", 6144),
        max_positions=config.get("max_position_embeddings", 512),
        type_vocab_size=config.get("type_vocab_size", 0),
        layer_norm_eps=config.get("layer_norm_eps", 1e-7),
        activation=config.get("hidden_act", "gelu"),
        hidden_dropout=config.get("hidden_dropout_prob", 0.1),
        attention_dropout=config.get("attention_probs_dropout_prob", 0.1),
        pad_token_id=config.get("pad_token_id", 0) or 0,
        relative_attention=bool(config.get("relative_attention", False)),
        max_relative_positions=config.get("max_relative_positions", -1),
        position_buckets=config.get("position_buckets", -1),
        pos_att_type=tuple(pos_att),
        share_att_key=bool(config.get("share_att_key", False)),
        norm_rel_ebd=str(config.get("norm_rel_ebd", "none")),
        position_biased_input=bool(config.get("position_biased_input", True)),
    )
    return fields


def relative_span(cfg: EncoderConfig) -> int:
    """``span``: the relative table has ``2 span`` rows (``position_buckets`` if set, else
    ``max_relative_positions``, else ``max_positions``)."""
    if cfg.position_buckets > 0:
        return cfg.position_buckets
    return cfg.max_relative_positions if cfg.max_relative_positions >= 1 else cfg.max_positions


def log_bucket(relative: torch.Tensor, bucket_size: int, max_position: int) -> torch.Tensor:
    """DeBERTa's log buckets: offsets with ``|r| <= bucket_size // 2`` stay exact; beyond, ``sign(r) * (mid +
    ceil(log(|r| / mid) / log((max_position - 1) / mid) * (mid - 1)))`` (float32 arithmetic, as the reference)."""
    mid = bucket_size // 2
    sign = torch.sign(relative)
    near = (relative < mid) & (relative > -mid)
    magnitude = torch.where(near, torch.tensor(mid - 1).type_as(relative), relative.abs())
    ratio = torch.log(magnitude / mid) / torch.log(torch.tensor((max_position - 1) / mid))
    far = torch.ceil(ratio * (mid - 1)) + mid
    return torch.where(magnitude <= mid, relative.type_as(far), far * sign).long()


def relative_positions(n: int, cfg: EncoderConfig, device: torch.device) -> torch.Tensor:
    """``bucket(i - j)`` for query i and key j, ``[q, k]`` long. Log buckets need ``position_buckets``; their
    ``max_position`` is ``max_relative_positions``, or ``max_positions`` when that is unset (< 1), as transformers
    resolves it (DeBERTa-v3 checkpoints ship ``max_relative_positions: -1`` with 256 buckets)."""
    idx = torch.arange(n, device=device)
    rel = idx[:, None] - idx[None, :]
    max_position = cfg.max_relative_positions if cfg.max_relative_positions >= 1 else cfg.max_positions
    if cfg.position_buckets > 0 and max_position > 0:
        rel = log_bucket(rel, cfg.position_buckets, max_position)
    return rel


def _position_scores(x: torch.Tensor, pos: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``out[b, h, i, j] = x[b, h, i] . pos[index[i, j], h]`` for ``x`` ``[b, h, p, d]``, ``pos`` ``[r, h, d]``,
    ``index`` ``[p, p']`` -> ``[b, h, p, p']``. One matmul per head over every (batch, position) row, then the
    gather of each pair's relative row."""
    b, h = x.shape[:2]
    scores = torch.bmm(rearrange(x, "b h p d -> h (b p) d"), rearrange(pos, "r h d -> h d r"))  # [h, b p, r]
    scores = rearrange(scores, "h (b p) r -> h b p r", b=b)
    return rearrange(torch.gather(scores, -1, index.expand(h, b, -1, -1)), "h b p k -> b h p k")


@dataclass
class DebertaContext:
    """What every layer needs, computed once per forward: ``keep`` ``[b, 1, q, k]`` bool (real query and real
    key) or None; ``rel`` ``[r, m]`` relative embeddings; ``rows`` the rows of ``rel`` this sequence length can
    reach (offsets ``-(n-1)..n-1`` after bucketing and clamping: ``2n - 1`` of the ``2 span`` rows when
    ``n <= span``); ``c2p_index`` ``[q, k]`` and ``p2c_index`` ``[k, q]`` index ``rel[rows]`` (``delta(i, j)``
    and, for the key side, ``delta(j, i)``, minus ``rows.start``)."""

    keep: torch.Tensor | None
    rel: torch.Tensor | None
    rows: slice | None
    c2p_index: torch.Tensor | None
    p2c_index: torch.Tensor | None


# ====================================================================== modules
class DebertaEmbeddings(nn.Module):
    """``LN(word [+ position] [+ type]) * mask``, then dropout (positions only if ``position_biased_input``)."""

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.word = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.max_positions, cfg.d_model) if cfg.position_biased_input else None
        self.token_type = nn.Embedding(cfg.type_vocab_size, cfg.d_model) if cfg.type_vocab_size > 0 else None
        self.ln = LayerNorm(cfg.d_model, cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout)
        self.hook_word = HookPoint()  # [batch, pos, d_model]
        if self.pos is not None:
            self.hook_pos = HookPoint()  # [batch, pos, d_model]
        if self.token_type is not None:
            self.hook_type = HookPoint()  # [batch, pos, d_model]
        self.hook_out = HookPoint()  # [batch, pos, d_model]

    def position_table(self) -> torch.Tensor | None:
        return None if self.pos is None else self.pos.weight

    def forward(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None, mask: torch.Tensor | None
    ) -> torch.Tensor:
        b, p = input_ids.shape
        x = self.hook_word(self.word(input_ids))
        if self.pos is not None:
            x = x + self.hook_pos(self.pos.weight[:p].expand(b, p, -1))
        if self.token_type is not None:
            types = token_type_ids if token_type_ids is not None else torch.zeros_like(input_ids)
            x = x + self.hook_type(self.token_type(types))
        x = self.ln(x)
        if mask is not None:
            x = x * mask[:, :, None].to(x.dtype)
        return self.hook_out(self.dropout(x))


class RelativeEmbeddings(nn.Module):
    """The ``[2 span, d_model]`` relative-position table shared by every layer, LayerNorm-ed if ``norm_rel_ebd``."""

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.table = nn.Embedding(2 * relative_span(cfg), cfg.d_model)
        norms = [x.strip() for x in cfg.norm_rel_ebd.lower().split("|")]
        self.ln = LayerNorm(cfg.d_model, cfg.layer_norm_eps) if "layer_norm" in norms else None
        self.hook_out = HookPoint()  # [rel, d_model]

    def forward(self) -> torch.Tensor:
        rel = self.table.weight
        return self.hook_out(self.ln(rel) if self.ln is not None else rel)


class DisentangledAttention(Attention):
    """Disentangled self-attention. Hooks beyond BERT's: ``hook_c2c``, ``hook_c2p``, ``hook_p2c`` ``[b, h, q, k]``
    (each already divided by ``sqrt(d_head * scale_factor)``; ``hook_scores`` is their sum, masked) and
    ``hook_pos_k``/``hook_pos_q`` ``[rel, h, d]`` (the projected relative embeddings)."""

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__(cfg)
        self.relative = cfg.relative_attention
        self.use_c2p = self.relative and "c2p" in cfg.pos_att_type
        self.use_p2c = self.relative and "p2c" in cfg.pos_att_type
        # transformers counts the configured terms even without relative attention
        self.scale_factor = 1 + ("c2p" in cfg.pos_att_type) + ("p2c" in cfg.pos_att_type)
        self.share_att_key = cfg.share_att_key
        if self.use_c2p and not self.share_att_key:
            self.pos_key_proj = nn.Linear(cfg.d_model, cfg.d_model)
        if self.use_p2c and not self.share_att_key:
            self.pos_query_proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.hook_c2c = HookPoint()  # [batch, head, query, key]
        if self.use_c2p:
            self.hook_pos_k = HookPoint()  # [rel, head, d_head]
            self.hook_c2p = HookPoint()  # [batch, head, query, key]
        if self.use_p2c:
            self.hook_pos_q = HookPoint()  # [rel, head, d_head]
            self.hook_p2c = HookPoint()  # [batch, head, query, key]

    def _needs_explicit(self, dropout_p: float) -> bool:
        hooked = [self.hook_scores, self.hook_pattern, self.hook_c2c]
        hooked += [self.hook_c2p] if self.use_c2p else []
        hooked += [self.hook_p2c] if self.use_p2c else []
        return self.impl == "explicit" or dropout_p > 0 or any(h.is_hooked for h in hooked)

    def _relative_bias(self, q: torch.Tensor, k: torch.Tensor, ctx: DebertaContext, scale: torch.Tensor):
        """``c2p + p2c`` ``[b, h, q, k]`` (each divided by ``scale``), or None without relative terms."""
        bias = None
        if self.use_c2p:
            pos_k = self._relative_proj(ctx, 1, "pos_key_proj", self.hook_pos_k)
            bias = self.hook_c2p(_position_scores(q, pos_k / scale, ctx.c2p_index))
        if self.use_p2c:
            pos_q = self._relative_proj(ctx, 0, "pos_query_proj", self.hook_pos_q)
            p2c = self.hook_p2c(_position_scores(k, pos_q / scale, ctx.p2c_index).transpose(-1, -2))
            bias = p2c if bias is None else bias + p2c
        return bias

    def _relative_proj(self, ctx: DebertaContext, which: int, own: str, hook: HookPoint) -> torch.Tensor:
        """``Kr`` (``which`` 1) or ``Qr`` (0) on the rows ``ctx.rows`` ``[r', h, d]``: the content key/query
        projection when ``share_att_key``, else the layer ``own``. The hook sees every row ``[2 span, h, d]``; the
        unhooked path projects only the rows this sequence length reads."""
        d = self.cfg.d_model
        if self.share_att_key:
            w, b = self.qkv.weight[which * d : (which + 1) * d], self.qkv.bias[which * d : (which + 1) * d]
        else:
            w, b = getattr(self, own).weight, getattr(self, own).bias
        if hook.is_hooked:
            return hook(rearrange(F.linear(ctx.rel, w, b), "r (h d) -> r h d", h=self.n_heads))[ctx.rows]
        return rearrange(F.linear(ctx.rel[ctx.rows], w, b), "r (h d) -> r h d", h=self.n_heads)

    def forward(self, x: torch.Tensor, ctx: DebertaContext) -> torch.Tensor:  # type: ignore[override]
        """``x`` ``[batch, pos, d_model]`` -> attention sublayer output ``[batch, pos, d_model]``."""
        q, k, v = rearrange(self.qkv(x), "b p (three h d) -> three b p h d", three=3, h=self.n_heads)
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
        q, k, v = (rearrange(t, "b p h d -> b h p d") for t in (q, k, v))
        scale = torch.sqrt(torch.tensor(self.d_head, dtype=torch.float) * self.scale_factor).to(q.dtype)
        bias = self._relative_bias(q, k, ctx, scale)
        dropout_p = self.dropout_p if self.training else 0.0
        if self._needs_explicit(dropout_p):
            scores = self.hook_c2c(torch.matmul(q, k.transpose(-1, -2) / scale))
            if bias is not None:
                scores = scores + bias
            if ctx.keep is not None:
                scores = scores.masked_fill(~ctx.keep, torch.finfo(scores.dtype).min)
            scores = self.hook_scores(scores)
            pattern = self.hook_pattern(scores.softmax(dim=-1))
            z = torch.matmul(F.dropout(pattern, dropout_p, self.training), v)
        else:
            mask = bias
            if ctx.keep is not None:
                base = bias if bias is not None else torch.zeros((), dtype=q.dtype, device=q.device)
                mask = base.masked_fill(~ctx.keep, torch.finfo(q.dtype).min)
            z = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=float(1.0 / scale))
        z = self.hook_z(rearrange(z, "b h p d -> b p h d"))
        return attention_output(self, z)


class DebertaBlock(Block):
    """BERT's post-LN block with ``DisentangledAttention``."""

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__(cfg)
        self.attn = DisentangledAttention(cfg)


_ORDER = {
    "embed": ("hook_word", "hook_pos", "hook_type", "ln.hook_scale", "ln.hook_normalized", "hook_out"),
    "rel_embed": ("ln.hook_scale", "ln.hook_normalized", "hook_out"),
    "blocks": (
        "hook_resid_pre", "attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_pos_k", "attn.hook_c2p",
        "attn.hook_pos_q", "attn.hook_p2c", "attn.hook_c2c", "attn.hook_scores", "attn.hook_pattern",
        "attn.hook_z", "attn.hook_result", "hook_attn_out", "ln1.hook_scale", "ln1.hook_normalized",
        "hook_resid_mid", "mlp.hook_pre", "mlp.hook_post", "hook_mlp_out", "ln2.hook_scale",
        "ln2.hook_normalized", "hook_resid_post",
    ),
    "mlm_head": ("ln.hook_scale", "ln.hook_normalized"),
}


class DebertaEncoder(Encoder):
    """DeBERTa-v2/v3 encoder with BERT's hook names plus the disentangled-attention terms (``docs/hooks.md``).

    ``forward`` returns the last hidden state ``[batch, pos, d_model]`` (= transformers' ``last_hidden_state``).
    """

    def __init__(self, config: EncoderConfig, *, pooler: bool = False, mlm_head: bool = False) -> None:
        HookedModule.__init__(self)
        if pooler:
            raise ValueError("DeBERTa-v2/v3 checkpoints have no pooler")
        if config.arch != MODEL_TYPE:
            raise ValueError(f"DebertaEncoder needs config.arch == {MODEL_TYPE!r}, got {config.arch!r}")
        if config.norm_placement != "post" or not config.attention_projections or config.position_encoding != "learned":
            raise ValueError("DeBERTa is post-LN with learned projections: norm_placement/attention_projections/"
                             "position_encoding overrides do not apply")
        self.config = config
        self.embed = DebertaEmbeddings(config)
        self.rel_embed = RelativeEmbeddings(config) if config.relative_attention else None
        self.blocks = nn.ModuleList([DebertaBlock(config) for _ in range(config.n_layers)])
        self.ln_final = None
        self.pooler = None
        self.mlm_head = MLMHead(config) if mlm_head else None
        self._finish_init(lambda names: hook_order(names, _ORDER))

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        *,
        stop_at_layer: int | None = None,
    ) -> torch.Tensor:
        """Last hidden state ``[batch, pos, d_model]``; arguments as ``Encoder.forward``. Without token-type
        embeddings (``type_vocab_size == 0``, DeBERTa-v3) ``token_type_ids`` are ignored, as transformers does."""
        if self.config.type_vocab_size == 0:
            token_type_ids = None
        input_ids, attention_mask, token_type_ids = self._check_inputs(input_ids, attention_mask, token_type_ids)
        x = self.embed(input_ids, token_type_ids, attention_mask)
        return self.forward_from(0, x, attention_mask, stop_at_layer=stop_at_layer)

    def context(self, x: torch.Tensor, attention_mask: torch.Tensor | None) -> DebertaContext:
        """Masks, relative embeddings and gather indices for a ``[batch, pos, d_model]`` input."""
        keep = None
        if attention_mask is not None and not bool(attention_mask.bool().all()):
            real = attention_mask.to(x.device).bool()
            keep = rearrange(real, "b q -> b 1 q 1") & rearrange(real, "b k -> b 1 1 k")
        if self.rel_embed is None:
            return DebertaContext(keep, None, None, None, None)
        span = relative_span(self.config)
        rel_pos = relative_positions(x.shape[1], self.config, torch.device("cpu"))
        # bucket() is odd and monotone: the last query's offset to the first key is the largest one
        reach = int(rel_pos[-1, 0])
        rows = slice(max(span - reach, 0), min(span + reach, 2 * span - 1) + 1)
        c2p_index = torch.clamp(rel_pos + span, 0, 2 * span - 1) - rows.start
        p2c_index = torch.clamp(-rel_pos + span, 0, 2 * span - 1) - rows.start
        rel = self.rel_embed()
        # the reference drops positions beyond 2 span rows; the table has exactly that many
        return DebertaContext(keep, rel.to(x.dtype), rows, c2p_index.to(x.device), p2c_index.to(x.device))

    @property
    def W_rel(self) -> torch.Tensor | None:
        """Relative-position table ``[2 span, d_model]`` (before its LayerNorm), or None."""
        return None if self.rel_embed is None else self.rel_embed.table.weight


# ====================================================================== checkpoints
_IGNORED = ("pooler.", "classifier.", "mask_predictions.", "qa_outputs.")
_TOP = {
    "embeddings.word_embeddings.weight": "embed.word.weight",
    "embeddings.token_type_embeddings.weight": "embed.token_type.weight",
    "embeddings.LayerNorm.weight": "embed.ln.weight",
    "embeddings.LayerNorm.bias": "embed.ln.bias",
    "encoder.rel_embeddings.weight": "rel_embed.table.weight",
    "encoder.LayerNorm.weight": "rel_embed.ln.weight",
    "encoder.LayerNorm.bias": "rel_embed.ln.bias",
}
_LAYER = {
    "attention.self.pos_key_proj": "attn.pos_key_proj",
    "attention.self.pos_query_proj": "attn.pos_query_proj",
    "attention.output.dense": "attn.out",
    "attention.output.LayerNorm": "ln1",
    "intermediate.dense": "mlp.fc_in",
    "output.dense": "mlp.fc_out",
    "output.LayerNorm": "ln2",
}
_MLM = {
    "cls.predictions.transform.dense.weight": "mlm_head.dense.weight",
    "cls.predictions.transform.dense.bias": "mlm_head.dense.bias",
    "cls.predictions.transform.LayerNorm.weight": "mlm_head.ln.weight",
    "cls.predictions.transform.LayerNorm.bias": "mlm_head.ln.bias",
    "cls.predictions.bias": "mlm_head.bias",
    "cls.predictions.decoder.bias": "mlm_head.bias",
    "cls.predictions.decoder.weight": "mlm_head.decoder",
    "lm_predictions.lm_head.dense.weight": "mlm_head.dense.weight",
    "lm_predictions.lm_head.dense.bias": "mlm_head.dense.bias",
    "lm_predictions.lm_head.LayerNorm.weight": "mlm_head.ln.weight",
    "lm_predictions.lm_head.LayerNorm.bias": "mlm_head.ln.bias",
    "lm_predictions.lm_head.bias": "mlm_head.bias",
}


def convert_state_dict(
    state: dict[str, torch.Tensor], config: EncoderConfig
) -> tuple[dict[str, torch.Tensor], bool, bool]:
    """Map a transformers DeBERTa-v2 state dict (``DebertaV2Model`` or a task model) to this package's names,
    fusing Q/K/V. Returns (state, has_pooler (always False), has_mlm)."""
    from bertscope.models.loading import CheckpointError

    prefix = "deberta." if any(k.startswith("deberta.") for k in state) else ""
    out: dict[str, torch.Tensor] = {}
    qkv: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    unknown = []
    for key, tensor in state.items():
        if key in _MLM:
            out[_MLM[key]] = tensor
            continue
        if key.startswith(_IGNORED) or not key.startswith(prefix):
            if not key.startswith(_IGNORED):
                unknown.append(key)
            continue
        name = key[len(prefix):]
        if name == "embeddings.position_ids":
            continue
        if name == "embeddings.position_embeddings.weight":
            if config.position_biased_input:
                out["embed.pos.weight"] = tensor
            continue  # transformers ignores a stored table the config does not use
        if name.startswith("encoder.LayerNorm.") and not config.relative_attention:
            continue  # transformers builds (and never uses) it when norm_rel_ebd asks without relative attention
        if name in _TOP:
            out[_TOP[name]] = tensor
            continue
        parts = name.split(".")
        if parts[:2] == ["encoder", "layer"] and len(parts) >= 5:
            layer, sub, kind = parts[2], ".".join(parts[3:-1]), parts[-1]
            if sub in ("attention.self.query_proj", "attention.self.key_proj", "attention.self.value_proj"):
                qkv.setdefault((int(layer), kind), {})[sub.split(".")[-1]] = tensor
                continue
            if sub in _LAYER:
                out[f"blocks.{layer}.{_LAYER[sub]}.{kind}"] = tensor
                continue
        unknown.append(key)
    for (layer, kind), parts in qkv.items():
        if set(parts) != {"query_proj", "key_proj", "value_proj"}:
            unknown.append(f"(incomplete q/k/v) encoder.layer.{layer}.attention.self.*.{kind}")
            continue
        fused = [parts["query_proj"], parts["key_proj"], parts["value_proj"]]
        out[f"blocks.{layer}.attn.qkv.{kind}"] = torch.cat(fused)
    if unknown:
        raise CheckpointError(f"DeBERTa tensors this loader does not know how to place: {sorted(unknown)}")
    return out, False, any(k.startswith("mlm_head.") for k in out)

