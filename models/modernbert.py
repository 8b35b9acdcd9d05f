"""ModernBERT (``model_type`` "modernbert"): pre-LN blocks with rotary positions, GeGLU MLPs and no biases.

Per block (``ln1`` is the identity in block 0, whose input is already the normed embedding)::

    mid = x + attn(LN1(x))          attn: fused QKV, rotary q/k, softmax(q k^T / sqrt(d) + mask) v, W_O
    out = mid + W_out(act(W_a LN2(mid)) * (W_g LN2(mid)))

Layers alternate global attention (every ``global_attn_every_n_layers``-th layer, from layer 0; rope theta
``global_rope_theta``) and sliding-window local attention (query i sees keys j with ``|i - j| <=
local_attention // 2``; rope theta ``local_rope_theta``), as ``layer_types`` lists. The embeddings are the token
table followed by a LayerNorm; a final LayerNorm follows the last block. Matches ``transformers.ModernBertModel``
with ``attn_implementation="eager"`` (float32).

Shapes: ``b`` batch, ``p`` position (``q``/``k`` query/key), ``h`` head, ``d`` d_head, ``m`` d_model, ``f`` d_mlp.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from bertscope.hooks.hook_points import HookedModule, HookPoint
from bertscope.models.config import EncoderConfig
from bertscope.models.encoder import Attention, Block, Encoder, LayerNorm, activation
from bertscope.models.family_common import attention_output, hook_order
from einops import rearrange
from torch import nn

MODEL_TYPE = "modernbert"
GLOBAL, LOCAL = "full_attention", "sliding_attention"


# ====================================================================== config
def config_fields(config: dict[str, Any]) -> dict[str, Any]:
    """``EncoderConfig`` from a ModernBERT ``config.json`` dict (old keys ``global_rope_theta``/
    ``local_rope_theta``/``global_attn_every_n_layers`` or transformers 5's ``layer_types``/``rope_parameters``).
    Refuses RoPE scaling types other than the default."""
    if config.get("model_type") != MODEL_TYPE:
        raise ValueError(f"not a ModernBERT config: model_type={config.get('model_type')!r}")
    n_layers = config.get("num_hidden_layers", 22)
    every = config.get("global_attn_every_n_layers", 3)
    layer_types = config.get("layer_types") or [LOCAL if i % every else GLOBAL for i in range(n_layers)]
    if any(t not in (GLOBAL, LOCAL) for t in layer_types) or len(layer_types) != n_layers:
        raise ValueError(f"layer_types must list {n_layers} of {GLOBAL!r}/{LOCAL!r}, got {layer_types}")
    rope = config.get("rope_parameters") or {}
    if config.get("rope_scaling") or any((rope.get(t) or {}).get("rope_type", "default") != "default"
                                         for t in (GLOBAL, LOCAL)):
        raise ValueError("ModernBERT RoPE scaling (rope_type other than 'default') is not supported")
    fields = dict(
        arch=MODEL_TYPE,
        model_type=MODEL_TYPE,
        vocab_size=config.get("vocab_size", 50368),
        d_model=config.get("hidden_size", 768),
        n_layers=n_layers,
        n_heads=config.get("num_attention_heads", 12),
        d_mlp=config.get("intermediate_size", 1152),
        max_positions=config.get("max_position_embeddings", 8192),
        type_vocab_size=0,
        layer_norm_eps=config.get("norm_eps", 1e-5),
        activation=config.get("hidden_activation", "gelu"),
        hidden_dropout=config.get("mlp_dropout", 0.0),
        attention_dropout=config.get("attention_dropout", 0.0),
        norm_placement="pre",
        pad_token_id=config.get("pad_token_id", 0) or 0,
        layer_types=tuple(layer_types),
        local_attention=config.get("local_attention", 128),
        global_rope_theta=float((rope.get(GLOBAL) or {}).get("rope_theta", config.get("global_rope_theta", 160000.0))),
        local_rope_theta=float((rope.get(LOCAL) or {}).get("rope_theta", config.get("local_rope_theta", 10000.0))),
        attention_bias=bool(config.get("attention_bias", False)),
        mlp_bias=bool(config.get("mlp_bias", False)),
        norm_bias=bool(config.get("norm_bias", False)),
        head_bias=bool(config.get("classifier_bias", False)),
        decoder_bias=bool(config.get("decoder_bias", True)),
        head_activation=config.get("classifier_activation", "gelu"),
    )
    return fields


def rotary_tables(n: int, d_head: int, theta: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos``, ``sin`` ``[pos, d_head]`` (float32): angle ``p * theta^(-2i/d)`` for frequency i, the half-size
    frequency list repeated twice (the rotate-half convention)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, d_head, 2, dtype=torch.float, device=device) / d_head))
    angles = torch.arange(n, device=device).float()[:, None] * inv_freq
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x`` ``[b, p, h, d]``: ``x cos + rotate_half(x) sin`` (in float32)."""
    x32 = x.float()
    half = x.shape[-1] // 2
    rotated = torch.cat((-x32[..., half:], x32[..., :half]), dim=-1)
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    return (x32 * cos + rotated * sin).to(x.dtype)


@dataclass
class ModernBertContext:
    """Per-forward state shared by the layers: ``rope[type]`` = (cos, sin) ``[p, d]``; ``keep[type]``
    ``[b or 1, 1, q, k]`` bool (True = may attend) or None; additive float masks built on demand."""

    rope: dict[str, tuple[torch.Tensor, torch.Tensor]]
    keep: dict[str, torch.Tensor | None]
    _additive: dict[str, torch.Tensor | None] = field(default_factory=dict)

    def additive(self, kind: str, dtype: torch.dtype) -> torch.Tensor | None:
        """``keep[kind]`` as 0 / dtype-minimum (a float mask never gives NaN rows)."""
        if kind not in self._additive:
            keep = self.keep[kind]
            self._additive[kind] = None if keep is None else torch.zeros(
                keep.shape, dtype=dtype, device=keep.device).masked_fill(~keep, torch.finfo(dtype).min)
        return self._additive[kind]


# ====================================================================== modules
class ModernBertEmbeddings(nn.Module):
    """``LN(W_E[input_ids])``, then dropout. No position or type embeddings (positions are rotary)."""

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.word = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.ln = LayerNorm(cfg.d_model, cfg.layer_norm_eps, bias=cfg.norm_bias)
        self.dropout = nn.Dropout(cfg.hidden_dropout)
        self.hook_word = HookPoint()  # [batch, pos, d_model]
        self.hook_out = HookPoint()  # [batch, pos, d_model]

    def position_table(self) -> None:
        return None

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.hook_out(self.dropout(self.ln(self.hook_word(self.word(input_ids)))))


class RotaryAttention(Attention):
    """Self-attention with rotary q/k and (on local layers) a sliding window. Extra hooks: ``hook_q_rot``,
    ``hook_k_rot`` ``[b, p, h, d]`` (after rotation; ``hook_q``/``hook_k`` are before it)."""

    def __init__(self, cfg: EncoderConfig, kind: str) -> None:
        super().__init__(cfg)
        self.kind = kind
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.attention_bias)
        self.out = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.attention_bias)
        self.hook_q_rot = HookPoint()  # [batch, pos, head, d_head]
        self.hook_k_rot = HookPoint()  # [batch, pos, head, d_head]

    def _in_bias(self, i: int) -> torch.Tensor:
        if self.qkv.bias is None:
            return torch.zeros(self.n_heads, self.d_head, device=self.qkv.weight.device, dtype=self.qkv.weight.dtype)
        return super()._in_bias(i)

    @property
    def b_O(self) -> torch.Tensor:
        """``[d_model]`` (zeros without ``attention_bias``)."""
        if self.out.bias is None:
            return torch.zeros(self.cfg.d_model, device=self.out.weight.device, dtype=self.out.weight.dtype)
        return self.out.bias

    def forward(self, x: torch.Tensor, ctx: ModernBertContext) -> torch.Tensor:  # type: ignore[override]
        """``x`` ``[batch, pos, d_model]`` (already normed) -> attention output ``[batch, pos, d_model]``."""
        q, k, v = rearrange(self.qkv(x), "b p (three h d) -> three b p h d", three=3, h=self.n_heads)
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
        cos, sin = ctx.rope[self.kind]
        q, k = self.hook_q_rot(rotate(q, cos, sin)), self.hook_k_rot(rotate(k, cos, sin))
        q, k, v = (rearrange(t, "b p h d -> b h p d") for t in (q, k, v))
        dropout_p = self.dropout_p if self.training else 0.0
        explicit = (
            self.impl == "explicit" or self.hook_scores.is_hooked or self.hook_pattern.is_hooked or dropout_p > 0
        )
        if explicit:
            scores = torch.matmul(q, k.transpose(-1, -2)) * self.d_head**-0.5
            keep = ctx.keep[self.kind]
            if keep is not None:
                scores = scores.masked_fill(~keep, torch.finfo(scores.dtype).min)
            scores = self.hook_scores(scores)
            pattern = self.hook_pattern(scores.softmax(dim=-1, dtype=torch.float32).to(q.dtype))
            z = torch.matmul(F.dropout(pattern, dropout_p, self.training), v)
        else:
            mask = ctx.additive(self.kind, q.dtype)
            z = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.d_head**-0.5)
        z = self.hook_z(rearrange(z, "b h p d -> b p h d"))
        return attention_output(self, z)


class GeGLU(nn.Module):
    """``fc_out(act(a) * g)`` with ``[a, g] = fc_in(x)`` split in halves. Hooks: ``hook_pre`` (``a``, before the
    activation), ``hook_gate`` (``g``), ``hook_post`` (``act(a) * g``, the input to ``fc_out``), all ``[b, p, f]``."""

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.fc_in = nn.Linear(cfg.d_model, 2 * cfg.d_mlp, bias=cfg.mlp_bias)
        self.fc_out = nn.Linear(cfg.d_mlp, cfg.d_model, bias=cfg.mlp_bias)
        self.act = activation(cfg.activation)
        self.dropout = nn.Dropout(cfg.hidden_dropout)
        self.hook_pre = HookPoint()  # [batch, pos, d_mlp]
        self.hook_gate = HookPoint()  # [batch, pos, d_mlp]
        self.hook_post = HookPoint()  # [batch, pos, d_mlp]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, g = self.fc_in(x).chunk(2, dim=-1)
        post = self.hook_post(self.act(self.hook_pre(a)) * self.hook_gate(g))
        return self.fc_out(self.dropout(post))


class ModernBertBlock(Block):
    """Pre-LN block (``Block``'s "pre" branch) with rotary attention, GeGLU and bias-free LayerNorms; block 0 has
    no attention LayerNorm."""

    def __init__(self, cfg: EncoderConfig, layer: int) -> None:
        super().__init__(cfg)
        self.ln1 = nn.Identity() if layer == 0 else LayerNorm(cfg.d_model, cfg.layer_norm_eps, bias=cfg.norm_bias)
        self.attn = RotaryAttention(cfg, cfg.layer_types[layer])
        self.ln2 = LayerNorm(cfg.d_model, cfg.layer_norm_eps, bias=cfg.norm_bias)
        self.mlp = GeGLU(cfg)
        self.dropout = nn.Identity()  # ModernBERT's only dropouts are inside attention output and the MLP


class ModernBertMLMHead(nn.Module):
    """``LN(act(dense(h))) @ W_E^T + bias``: ModernBERT's prediction head and tied decoder."""

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.head_bias)
        self.act = activation(cfg.head_activation)
        self.ln = LayerNorm(cfg.d_model, cfg.layer_norm_eps, bias=cfg.norm_bias)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size)) if cfg.decoder_bias else None
        self.decoder: nn.Parameter | None = None

    def forward(self, hidden: torch.Tensor, tied: torch.Tensor, *, bias: bool = True) -> torch.Tensor:
        """``hidden`` ``[..., d_model]`` -> logits ``[..., vocab]``; ``bias=False`` drops the output bias."""
        h = self.ln(self.act(self.dense(hidden)))
        return F.linear(h, self.decoder if self.decoder is not None else tied, self.bias if bias else None)


_ORDER = {
    "embed": ("hook_word", "ln.hook_scale", "ln.hook_normalized", "hook_out"),
    "blocks": (
        "hook_resid_pre", "ln1.hook_scale", "ln1.hook_normalized", "attn.hook_q", "attn.hook_k", "attn.hook_v",
        "attn.hook_q_rot", "attn.hook_k_rot", "attn.hook_scores", "attn.hook_pattern", "attn.hook_z",
        "attn.hook_result", "hook_attn_out", "hook_resid_mid", "ln2.hook_scale", "ln2.hook_normalized",
        "mlp.hook_pre", "mlp.hook_gate", "mlp.hook_post", "hook_mlp_out", "hook_resid_post",
    ),
    "ln_final": ("hook_scale", "hook_normalized"),
    "mlm_head": ("ln.hook_scale", "ln.hook_normalized"),
}


class ModernBertEncoder(Encoder):
    """ModernBERT with BERT's hook names plus ``attn.hook_q_rot``/``hook_k_rot`` and ``mlp.hook_gate``.

    ``forward`` returns the final-normed last hidden state ``[batch, pos, d_model]`` (transformers'
    ``last_hidden_state``); with ``stop_at_layer`` the un-normed residual stream of that block.
    """

    def __init__(self, config: EncoderConfig, *, pooler: bool = False, mlm_head: bool = False) -> None:
        HookedModule.__init__(self)
        if pooler:
            raise ValueError("ModernBERT checkpoints have no pooler")
        if config.arch != MODEL_TYPE:
            raise ValueError(f"ModernBertEncoder needs config.arch == {MODEL_TYPE!r}, got {config.arch!r}")
        if config.norm_placement != "pre" or len(config.layer_types) != config.n_layers:
            raise ValueError("ModernBERT needs norm_placement='pre' and one layer_types entry per layer")
        self.config = config
        self.embed = ModernBertEmbeddings(config)
        self.blocks = nn.ModuleList([ModernBertBlock(config, i) for i in range(config.n_layers)])
        self.ln_final = LayerNorm(config.d_model, config.layer_norm_eps, bias=config.norm_bias)
        self.pooler = None
        self.mlm_head = ModernBertMLMHead(config) if mlm_head else None
        self._finish_init(lambda names: hook_order(names, _ORDER))

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        *,
        stop_at_layer: int | None = None,
    ) -> torch.Tensor:
        """Last hidden state ``[batch, pos, d_model]``. ``token_type_ids`` are ignored (ModernBERT has none)."""
        input_ids, attention_mask, _ = self._check_inputs(input_ids, attention_mask, None)
        return self.forward_from(0, self.embed(input_ids), attention_mask, stop_at_layer=stop_at_layer)

    def context(self, x: torch.Tensor, attention_mask: torch.Tensor | None) -> ModernBertContext:
        """Rotary tables and masks for a ``[batch, pos, d_model]`` input."""
        n, cfg = x.shape[1], self.config
        rope = {}
        for kind, theta in ((GLOBAL, cfg.global_rope_theta), (LOCAL, cfg.local_rope_theta)):
            if kind in cfg.layer_types:
                rope[kind] = rotary_tables(n, cfg.d_head, theta, x.device)
        real = None
        if attention_mask is not None and not bool(attention_mask.bool().all()):
            real = rearrange(attention_mask.to(x.device).bool(), "b k -> b 1 1 k")
        keep: dict[str, torch.Tensor | None] = {GLOBAL: real, LOCAL: real}
        half = cfg.local_attention // 2
        if LOCAL in cfg.layer_types and n > half + 1:
            idx = torch.arange(n, device=x.device)
            window = rearrange((idx[:, None] - idx[None, :]).abs() <= half, "q k -> 1 1 q k")
            keep[LOCAL] = window if real is None else window & real
        return ModernBertContext(rope, keep)

    @property
    def W_pos(self) -> None:
        """ModernBERT has no position table (positions are rotary)."""
        return None


# ====================================================================== checkpoints
_TOP = {
    "embeddings.tok_embeddings.weight": "embed.word.weight",
    "embeddings.norm.weight": "embed.ln.weight",
    "embeddings.norm.bias": "embed.ln.bias",
    "final_norm.weight": "ln_final.weight",
    "final_norm.bias": "ln_final.bias",
}
_LAYER = {"attn_norm": "ln1", "attn.Wqkv": "attn.qkv", "attn.Wo": "attn.out", "mlp_norm": "ln2",
          "mlp.Wi": "mlp.fc_in", "mlp.Wo": "mlp.fc_out"}
_MLM = {"head.dense.weight": "mlm_head.dense.weight", "head.dense.bias": "mlm_head.dense.bias",
        "head.norm.weight": "mlm_head.ln.weight", "head.norm.bias": "mlm_head.ln.bias",
        "decoder.weight": "mlm_head.decoder", "decoder.bias": "mlm_head.bias"}
_TASK_HEADS = ("classifier.", "head.", "drop.")


def convert_state_dict(
    state: dict[str, torch.Tensor], config: EncoderConfig
) -> tuple[dict[str, torch.Tensor], bool, bool]:
    """Map a transformers ModernBERT state dict (``ModernBertModel`` or a task model) to this package's names.
    Returns (state, has_pooler (always False), has_mlm). A ``classifier`` marks a task model whose ``head`` is
    not the masked-LM head."""
    from bertscope.models.loading import CheckpointError

    prefix = "model." if any(k.startswith("model.") for k in state) else ""
    task = any(k.startswith("classifier.") for k in state)
    out: dict[str, torch.Tensor] = {}
    unknown = []
    for key, tensor in state.items():
        if not task and key in _MLM:
            out[_MLM[key]] = tensor
            continue
        if task and key.startswith(_TASK_HEADS):
            continue
        name = key[len(prefix):] if key.startswith(prefix) else None
        if name in _TOP:
            out[_TOP[name]] = tensor
            continue
        parts = (name or "").split(".")
        if len(parts) >= 4 and parts[0] == "layers" and ".".join(parts[2:-1]) in _LAYER:
            out[f"blocks.{parts[1]}.{_LAYER['.'.join(parts[2:-1])]}.{parts[-1]}"] = tensor
            continue
        unknown.append(key)
    if unknown:
        raise CheckpointError(f"ModernBERT tensors this loader does not know how to place: {sorted(unknown)}")
    return out, False, any(k.startswith("mlm_head.") for k in out)

