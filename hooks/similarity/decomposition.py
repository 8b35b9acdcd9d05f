"""The pooled sentence embedding as an exact sum over token x component, and each component's share of a pair's
score.

Components: ``embeddings`` (the embedding output, ``embed.hook_out``), every head ``a{L}.h{H}`` (its
``attn.hook_result`` write), every MLP ``m{L}`` (``hook_mlp_out``) and ``bias`` (the attention output biases and
the LayerNorms' betas, owned by no component). With every LayerNorm frozen at the run's own scale, a LayerNorm is
affine, so each component's write reaches the output through the product of the frozen LayerNorms after it: the
circuits' frozen-LayerNorm graph (``bertscope.hooks.circuits.graph``: ``capture`` for the run and its scales,
``frozen_ln`` for the linear part), carried to the output and pooled. Mean and cls pooling are linear, so

    embedding[b] = sum over components c and positions p of parts[b, c, p]        (exact, float rounding only)

Max pooling is not linear and is refused. Shapes: ``b`` texts, ``c`` components, ``p`` position, ``m`` d_model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
from bertscope.hooks.circuits.graph import capture, frozen_ln, graph_of
from bertscope.hooks.similarity.pooling import default_pooling, pool


@dataclass
class Decomposition:
    """``parts`` ``[b, c, p, m]``: component c's write at position p carried to the pooled embedding (padding
    zero); ``components`` (names, see the module docstring); ``embedding`` ``[b, m]``: the model's pooled
    embedding; ``error``: the largest ``|parts.sum((1, 2)) - embedding|``; ``tokens``: word pieces per text."""

    parts: torch.Tensor
    components: list[str]
    embedding: torch.Tensor
    error: float
    tokens: list[list[str]]
    pooling: str

    def by_component(self) -> torch.Tensor:
        """``[b, c, m]``: the parts summed over positions."""
        return self.parts.sum(2)


def _ln_bias(ln: torch.nn.Module, t: torch.Tensor) -> torch.Tensor:
    return t + ln.bias if getattr(ln, "bias", None) is not None else t


@torch.no_grad()
def decompose(model: Any, texts: str | Sequence[str], *, pooling: str | None = None) -> Decomposition:
    """Decompose the pooled embedding of ``texts`` (see the module docstring); ``pooling`` ``"mean"`` or
    ``"cls"`` (default the checkpoint's)."""
    how = pooling or default_pooling(model)
    if how not in ("mean", "cls"):
        raise ValueError(f"the decomposition needs a linear pooling (mean or cls), got {how!r}")
    texts = [texts] if isinstance(texts, str) else list(texts)
    batch = model.tokenize(texts)
    mask = batch["attention_mask"]
    g = graph_of(model)
    cap = capture(model, batch)
    names = ["embeddings"]
    terms = cap.embed[None]  # [c, b, p, m]
    bias = torch.zeros_like(cap.embed)
    for L in range(g.n_layers):
        block = model.blocks[L]
        terms = torch.cat([terms, cap.result[L].permute(2, 0, 1, 3)])
        names += [f"a{L}.h{h}" for h in range(g.n_heads)]
        bias = bias + block.attn.b_O
        if g.post_ln:
            s = cap.scales[f"blocks.{L}.ln1.hook_scale"]
            terms, bias = frozen_ln(block.ln1, s, terms), _ln_bias(block.ln1, frozen_ln(block.ln1, s, bias))
        terms = torch.cat([terms, cap.mlp_out[L][None]])
        names.append(f"m{L}")
        if g.post_ln:
            s = cap.scales[f"blocks.{L}.ln2.hook_scale"]
            terms, bias = frozen_ln(block.ln2, s, terms), _ln_bias(block.ln2, frozen_ln(block.ln2, s, bias))
    if getattr(model, "ln_final", None) is not None:
        _, c = model.run_with_cache(**batch, names_filter=["ln_final.hook_scale"])
        s = c["ln_final.hook_scale"]
        terms, bias = frozen_ln(model.ln_final, s, terms), _ln_bias(model.ln_final, frozen_ln(model.ln_final, s, bias))
    terms = torch.cat([terms, bias[None]])
    names.append("bias")
    real = mask.to(terms.dtype)
    if how == "mean":
        weight = real / real.sum(-1, keepdim=True)
    else:
        weight = torch.zeros_like(real)
        weight[:, 0] = 1
    parts = terms.permute(1, 0, 2, 3) * weight[:, None, :, None]  # [b, c, p, m]
    hidden = model(**batch)
    embedding = pool(hidden, mask, how)
    error = float((parts.sum((1, 2)) - embedding).abs().max())
    return Decomposition(parts, names, embedding, error, [model.to_str_tokens(t) for t in texts], how)


def shares(model: Any, a: str | Sequence[str], b: str | Sequence[str], *, score: str = "cosine",
           pooling: str | None = None) -> pd.DataFrame:
    """Each component's share of each pair's score, a long table: ``pair``, ``component``, ``layer``, ``head``
    (-1 for MLPs, embeddings and biases; ``layer`` -1 for embeddings and biases), ``kind`` (``head``, ``mlp``,
    ``embeddings``, ``bias``), ``share``. ``share_c = (e_a^c . e_b + e_a . e_b^c) / 2`` (divided by ``|e_a| |e_b|``
    for cosine): the symmetric split of the bilinear score, so the shares of a pair sum to its score exactly.
    A layer's share is the sum of its rows (``groupby("layer")``)."""
    if score not in ("cosine", "dot"):
        raise ValueError(f"score must be 'cosine' or 'dot', got {score!r}")
    da, db = decompose(model, a, pooling=pooling), decompose(model, b, pooling=pooling)
    ca, cb = da.by_component().double(), db.by_component().double()  # [b, c, m]
    ea, eb = ca.sum(1), cb.sum(1)
    sh = ((ca * eb[:, None]).sum(-1) + (ea[:, None] * cb).sum(-1)) / 2  # [b, c]
    if score == "cosine":
        sh = sh / (ea.norm(dim=-1) * eb.norm(dim=-1))[:, None]
    rows = []
    for p in range(sh.shape[0]):
        for c, name in enumerate(da.components):
            layer, head, kind = _parse(name)
            rows.append((p, name, layer, head, kind, float(sh[p, c])))
    return pd.DataFrame(rows, columns=["pair", "component", "layer", "head", "kind", "share"])


def _parse(name: str) -> tuple[int, int, str]:
    if name.startswith("a") and ".h" in name:
        layer, head = name[1:].split(".h")
        return int(layer), int(head), "head"
    if name.startswith("m") and name[1:].isdigit():
        return int(name[1:]), -1, "mlp"
    return -1, -1, name
