"""The computational graph of an encoder for circuit work, and the frozen-LayerNorm run that makes it a sum.

Senders write into the residual stream: ``input`` (``embed.hook_out``), every head ``L{L}H{H}`` (its
``attn.hook_result`` slice, ``z_h W_O^h``) and every MLP ``m{L}`` (``hook_mlp_out``). Receivers read it: every
head ``L{L}H{H}`` (its q, k and v inputs together), every MLP ``m{L}`` and ``output`` (the final hidden state the
metric reads). An edge ``s->r`` exists when ``s`` writes before ``r`` reads.

Post-LN blocks (BERT, RoBERTa, ...) re-normalise the stream twice a layer, so a receiver's input is not a sum of
sender outputs. With every block LayerNorm frozen at the clean run's scale, ``LN(y) = w * (y - mean(y)) / s_clean
+ b`` is affine in ``y``; a sender's term reaches a receiver through the product of those linear maps
``F_l(v) = w_l * (v - mean(v)) / s_l`` (per position), and

    x_r = const_r + sum_s F_{s->r}(out_s)         (exactly, in the frozen model)

which is the per-part decomposition ``hooks.mixing.token_decomposition`` applies to one layer (each part centred
by its own mean and divided by the clean scale; the biases owned by no part), carried across layers. Pre-LN
families (ModernBERT) need no freezing: the residual stream is already the sum, and each receiver's own
LayerNorm is part of the receiver.

:func:`circuit_forward` runs the frozen model with each receiver's input rebuilt from the sender terms,
``x_r = x_r(corrupted) + sum_s mask[s, r] F_{s->r}(out_s(run) - out_s(corrupted))``: all edges in reproduces the
clean run, none the (frozen) corrupted run, one edge out is path patching of that edge.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from bertscope.hooks.naming import head_name
from einops import einsum


@dataclass(frozen=True)
class Graph:
    """Senders, receivers and which edges exist (``valid [n_senders, n_receivers]``) for one model shape."""

    n_layers: int
    n_heads: int
    post_ln: bool

    @property
    def senders(self) -> list[str]:
        names = ["input"]
        for layer in range(self.n_layers):
            names += [head_name(layer, h) for h in range(self.n_heads)] + [f"m{layer}"]
        return names

    @property
    def receivers(self) -> list[str]:
        names = []
        for layer in range(self.n_layers):
            names += [head_name(layer, h) for h in range(self.n_heads)] + [f"m{layer}"]
        return names + ["output"]

    def sender_head(self, layer: int, head: int) -> int:
        return 1 + layer * (self.n_heads + 1) + head

    def sender_mlp(self, layer: int) -> int:
        return 1 + layer * (self.n_heads + 1) + self.n_heads

    def receiver_head(self, layer: int, head: int) -> int:
        return layer * (self.n_heads + 1) + head

    def receiver_mlp(self, layer: int) -> int:
        return layer * (self.n_heads + 1) + self.n_heads

    @property
    def receiver_output(self) -> int:
        return self.n_layers * (self.n_heads + 1)

    @property
    def valid(self) -> torch.Tensor:
        """``[n_senders, n_receivers]`` bool: sender s writes before receiver r reads."""
        n_s, n_r, step = len(self.senders), len(self.receivers), self.n_heads + 1
        valid = torch.zeros(n_s, n_r, dtype=torch.bool)
        for layer in range(self.n_layers):
            before = 1 + layer * step  # input and every sender of earlier layers
            valid[:before, layer * step: layer * step + self.n_heads] = True
            valid[:before + self.n_heads, self.receiver_mlp(layer)] = True
        valid[:, self.receiver_output] = True
        return valid

    def edge_names(self) -> list[str]:
        """``"s->r"`` of every valid edge, in row-major (sender, receiver) order."""
        s, r = self.senders, self.receivers
        return [f"{s[i]}->{r[j]}" for i, j in torch.nonzero(self.valid).tolist()]


def graph_of(model: Any) -> Graph:
    """The :class:`Graph` of ``model`` (an ``Encoder`` of any family)."""
    cfg = model.config
    return Graph(cfg.n_layers, cfg.n_heads, cfg.norm_placement == "post")


# ====================================================================== frozen LayerNorm
def frozen_ln(ln: torch.nn.Module, scale: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The linear part of LayerNorm ``ln`` frozen at ``scale`` ``[b, p, 1]``: ``w * (v - mean(v)) / scale`` for
    ``v`` ``[..., b, p, m]`` (no bias: applied to differences and to sender terms)."""
    return (v - v.mean(-1, keepdim=True)).mul_(ln.weight / scale)


def _scale_names(model: Any) -> list[str]:
    """The block LayerNorms' ``hook_scale`` names that the frozen run fixes (post-LN only)."""
    if model.config.norm_placement != "post":
        return []
    return [f"blocks.{L}.{ln}.hook_scale" for L in range(model.config.n_layers) for ln in ("ln1", "ln2")]


def freeze_hooks(scales: dict[str, torch.Tensor]) -> list[tuple[str, Callable]]:
    """Hooks replacing each LayerNorm scale by ``scales[name]`` (the clean run's): the frozen-LN model."""

    def fix(t: torch.Tensor, hook: Any) -> torch.Tensor:
        return scales[hook.name].to(t.dtype).expand_as(t)

    return [(name, fix) for name in scales]


@dataclass
class Capture:
    """One run's tensors that circuits need, per layer: ``resid_pre``, ``resid_mid`` ``[b, p, m]``, ``result``
    ``[b, p, h, m]``, ``mlp_out`` ``[b, p, m]``; ``embed`` ``[b, p, m]``, ``final`` (last block's
    ``hook_resid_post``) and the LayerNorm ``scales``."""

    embed: torch.Tensor
    resid_pre: list[torch.Tensor]
    resid_mid: list[torch.Tensor]
    result: list[torch.Tensor]
    mlp_out: list[torch.Tensor]
    final: torch.Tensor
    scales: dict[str, torch.Tensor]


@torch.no_grad()
def capture(model: Any, batch: dict[str, torch.Tensor], scales: dict[str, torch.Tensor] | None = None) -> Capture:
    """Run ``batch`` (the frozen-LN model when ``scales`` is given) and keep what :func:`circuit_forward` reads."""
    n = model.config.n_layers
    names = ["embed.hook_out", "blocks.*.hook_resid_pre", "blocks.*.hook_resid_mid", "blocks.*.attn.hook_result",
             "blocks.*.hook_mlp_out", f"blocks.{n - 1}.hook_resid_post", *_scale_names(model)]
    hooks = freeze_hooks(scales) if scales else []
    _, cache = model.run_with_cache(**batch, names_filter=names, fwd_hooks=hooks)
    got = {k: cache[k] for k in cache}
    return Capture(
        embed=got["embed.hook_out"],
        resid_pre=[got[f"blocks.{L}.hook_resid_pre"] for L in range(n)],
        resid_mid=[got[f"blocks.{L}.hook_resid_mid"] for L in range(n)],
        result=[got[f"blocks.{L}.attn.hook_result"] for L in range(n)],
        mlp_out=[got[f"blocks.{L}.hook_mlp_out"] for L in range(n)],
        final=got[f"blocks.{n - 1}.hook_resid_post"],
        scales=scales if scales else {k: got[k] for k in _scale_names(model)},
    )


# ====================================================================== receivers' computations
def heads_forward(model: Any, layer: int, x_heads: torch.Tensor, ctx: Any) -> torch.Tensor:
    """Every head of block ``layer`` run on its own input: ``x_heads [b, p, h, m]`` (head h reads ``x_heads[:, :,
    h]``) -> per-head writes ``[b, p, h, m]``. q, k and v of head h come from its own input (through LN1 in a
    pre-LN block); the rest of the attention (positions, masks, softmax) is the family's own module."""
    block = model.blocks[layer]
    attn = block.attn
    xin = x_heads if model.config.norm_placement == "post" else block.ln1(x_heads)
    proj = {name: einsum(xin, w, "b p h m, h m d -> b p h d") + bias
            for name, w, bias in (("q", attn.W_Q, attn.b_Q), ("k", attn.W_K, attn.b_K), ("v", attn.W_V, attn.b_V))}
    out: dict[str, torch.Tensor] = {}

    def put(name: str) -> Callable:
        return lambda t, hook: proj[name]

    def grab(t: torch.Tensor, hook: Any) -> None:
        out["result"] = t

    hooks = [(f"blocks.{layer}.attn.hook_{n}", put(n)) for n in "qkv"] + [(f"blocks.{layer}.attn.hook_result", grab)]
    with model.hooks(hooks):
        attn(x_heads[:, :, 0], ctx)
    return out["result"]


def mlp_forward(model: Any, layer: int, x: torch.Tensor) -> torch.Tensor:
    """Block ``layer``'s MLP write from the residual stream ``x [b, p, m]`` (through LN2 in a pre-LN block)."""
    block = model.blocks[layer]
    return block.mlp(x if model.config.norm_placement == "post" else block.ln2(x))


def output_hidden(model: Any, x: torch.Tensor) -> torch.Tensor:
    """The hidden state the metric reads from the output receiver's input (the final LayerNorm of pre-LN)."""
    return x if getattr(model, "ln_final", None) is None else model.ln_final(x)


@dataclass
class Trace:
    """What one :func:`circuit_forward` saw at each receiver: its input (``inputs``, keyed ``("heads", L)``
    ``[b, p, h, m]``, ``("mlp", L)`` and ``("output",)`` ``[b, p, m]``) and the sender terms it read
    (``terms`` under the same keys, ``[n_senders_so_far, b, p, m]``)."""

    inputs: dict[tuple, torch.Tensor]
    terms: dict[tuple, torch.Tensor]


def circuit_forward(
    model: Any,
    corr: Capture,
    input_out: torch.Tensor,
    edge_mask: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    trace: bool = False,
) -> tuple[torch.Tensor, Trace | None]:
    """Run the frozen model with each receiver's input rebuilt from sender terms; returns the final hidden state
    ``[b, p, m]`` the metric reads (and a :class:`Trace` when ``trace``).

    ``corr``: :func:`capture` of the corrupted batch in the frozen model (scales = the clean run's, which
    ``corr.scales`` holds). ``input_out``: this run's ``embed.hook_out`` (the clean one, or an interpolation).
    ``edge_mask [n_senders, n_receivers]`` (float or bool): 1 = the edge carries this run's sender term, 0 = the
    corrupted one. Receiver r reads ``x_r(corr) + sum_s mask[s, r] * term_s`` where ``term_s`` is
    ``out_s(run) - out_s(corr)`` carried through the frozen LayerNorms between s and r.
    """
    g = graph_of(model)
    post = g.post_ln
    mask = edge_mask.to(input_out.dtype)
    used = mask.ne(0).any(1)  # senders with an edge in the circuit: the only terms worth carrying (all if trace)
    ctx = model.context(corr.embed, attention_mask)
    ids = [0]  # sender index of each row of ``terms``
    terms = (input_out - corr.embed)[None]  # [s, b, p, m]
    tr = Trace({}, {}) if trace else None

    def add(terms: torch.Tensor, ids: list[int], new: torch.Tensor, new_ids: list[int]):
        keep = [i for i, s in enumerate(new_ids) if trace or bool(used[s])]
        if not keep:
            return terms, ids
        return torch.cat([terms, new[keep]]), ids + [new_ids[i] for i in keep]

    for layer in range(g.n_layers):
        r0 = g.receiver_head(layer, 0)
        x_heads = corr.resid_pre[layer][:, :, None] + einsum(
            terms, mask[ids, r0: r0 + g.n_heads], "s b p m, s h -> b p h m")
        if tr is not None:
            tr.inputs[("heads", layer)], tr.terms[("heads", layer)] = x_heads, terms
        result = heads_forward(model, layer, x_heads, ctx)
        terms, ids = add(terms, ids, (result - corr.result[layer]).permute(2, 0, 1, 3),
                         [g.sender_head(layer, h) for h in range(g.n_heads)])
        if post:
            terms = frozen_ln(model.blocks[layer].ln1, corr.scales[f"blocks.{layer}.ln1.hook_scale"], terms)
        x_mlp = corr.resid_mid[layer] + einsum(terms, mask[ids, g.receiver_mlp(layer)], "s b p m, s -> b p m")
        if tr is not None:
            tr.inputs[("mlp", layer)], tr.terms[("mlp", layer)] = x_mlp, terms
        terms, ids = add(terms, ids, (mlp_forward(model, layer, x_mlp) - corr.mlp_out[layer])[None],
                         [g.sender_mlp(layer)])
        if post:
            terms = frozen_ln(model.blocks[layer].ln2, corr.scales[f"blocks.{layer}.ln2.hook_scale"], terms)
    x_out = corr.final + einsum(terms, mask[ids, g.receiver_output], "s b p m, s -> b p m")
    if tr is not None:
        tr.inputs[("output",)], tr.terms[("output",)] = x_out, terms
    return output_hidden(model, x_out), tr


def frozen_forward(model: Any, scales: dict[str, torch.Tensor], input_out: torch.Tensor,
                   attention_mask: torch.Tensor) -> tuple[torch.Tensor, dict[tuple, torch.Tensor]]:
    """The frozen-LN model from ``input_out`` (``embed.hook_out`` ``[b, p, m]``) with every receiver reading its own
    copy of the stream: returns the final hidden state and the receivers' inputs (keyed as in :class:`Trace`), so
    ``autograd.grad`` gives each receiver's own gradient. Equal to :func:`circuit_forward` with every edge in,
    at the cost of one forward pass (no sender terms carried)."""
    g = graph_of(model)
    ctx = model.context(input_out, attention_mask)
    inputs: dict[tuple, torch.Tensor] = {}
    x = input_out
    for layer in range(g.n_layers):
        block = model.blocks[layer]
        x_heads = x[:, :, None].repeat(1, 1, g.n_heads, 1)
        inputs[("heads", layer)] = x_heads
        attn_out = heads_forward(model, layer, x_heads, ctx).sum(2) + block.attn.b_O
        if g.post_ln:
            mid = _frozen_affine(block.ln1, scales[f"blocks.{layer}.ln1.hook_scale"], x + attn_out)
        else:
            mid = x + attn_out
        x_mlp = mid.clone()
        inputs[("mlp", layer)] = x_mlp
        y = mid + mlp_forward(model, layer, x_mlp)
        x = _frozen_affine(block.ln2, scales[f"blocks.{layer}.ln2.hook_scale"], y) if g.post_ln else y
    x_out = x.clone()
    inputs[("output",)] = x_out
    return output_hidden(model, x_out), inputs


def _frozen_affine(ln: torch.nn.Module, scale: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = ln.weight * (y - y.mean(-1, keepdim=True)) / scale
    return out + ln.bias if ln.bias is not None else out


def receiver_slices(g: Graph) -> list[tuple[tuple, slice]]:
    """``(trace key, receiver columns)`` for every receiver group, in the order the forward reads them."""
    out = []
    for layer in range(g.n_layers):
        r0 = g.receiver_head(layer, 0)
        out.append((("heads", layer), slice(r0, r0 + g.n_heads)))
        out.append((("mlp", layer), slice(g.receiver_mlp(layer), g.receiver_mlp(layer) + 1)))
    out.append((("output",), slice(g.receiver_output, g.receiver_output + 1)))
    return out
