"""The context-mixing methods lifted to pairs, through each text's pooled-embedding token contributions.

For each text, a mixing method gives how much each input token makes up the pooled embedding:

- ``rollout:<m>`` and ``flow:<m>`` (Abnar and Zuidema 2020 over any per-layer method of
  ``bertscope.hooks.mixing``): the last layer's ``[query, key]`` matrix, its rows averaged over the positions the
  pooling reads (every real token for mean and max pooling, [CLS] for cls): ``w[k]``, summing to 1;
- the input attributions (``grad_x_input``, ``integrated_gradients``, ``loo``) of the mixing module's own
  per-sentence target (``target="auto"``: the pooled embedding's cosine/projection to itself), normalised to sum 1.

The pair matrix is ``score * w_a[i] * w_b[j]``: the score shared out in proportion to both texts' token weights,
summing to the score exactly by construction (``target`` = the score, ``error`` 0 up to rounding; this is an
accounting, not a measured interaction between the two texts, and the table says so with ``exact="no"``).
Registered as ``mixing:<name>`` (``mixing:rollout:alti``, ``mixing:integrated_gradients`` ...), one per name
the mixing table gives when this module is imported.
"""

from __future__ import annotations

from typing import Any

import torch
from bertscope.hooks import mixing
from bertscope.hooks.mixing import table as mixing_table
from bertscope.hooks.similarity.methods import pair_score
from bertscope.hooks.similarity.pairs import Pair, Side
from bertscope.hooks.similarity.table import TABLE, PairMethod, register


def token_weights(model: Any, s: Side, name: str, pooling: str) -> torch.Tensor:
    """``[b, p]``: each token's share of the pooled embedding of side ``s`` by mixing method ``name`` (see the
    module docstring); zero on padding, rows summing to 1 (a row whose weights sum to 0 stays 0)."""
    inputs = {"input_ids": s.ids, "attention_mask": s.mask}
    if s.types is not None:
        inputs["token_type_ids"] = s.types
    c = mixing.contributions(model, inputs, name).float()
    real = s.mask.to(c.dtype)
    if c.shape[1] == 1 and ":" not in name:  # an input attribution, [b, 1, key]
        w = c[:, 0]
    else:
        last = c[:, -1]  # [b, q, k]
        if pooling == "cls":
            w = last[:, 0]
        else:
            w = (last * real[:, :, None]).sum(1) / real.sum(-1, keepdim=True)
    w = w * real
    total = w.sum(-1, keepdim=True)
    return torch.where(total.abs() > 1e-12, w / torch.where(total.abs() > 1e-12, total, torch.ones_like(total)),
                       torch.zeros_like(w))  # fmt: skip


def _lift(name: str):
    def compute(model: Any, pair: Pair):
        wa = token_weights(model, pair.a, name, pair.pooling)
        wb = token_weights(model, pair.b, name, pair.pooling)
        score = pair_score(model, pair)
        matrix = score[:, None, None] * wa[:, :, None].to(score.dtype) * wb[:, None, :].to(score.dtype)
        return matrix, score, f"none (each text's token weights by {name}, the score shared out by them)"

    compute.__doc__ = f"``{name}`` lifted to pairs (see ``bertscope.hooks.similarity.lifted``)."
    return compute


def lifted_names() -> list[str]:
    """The mixing names lifted: ``rollout:``/``flow:`` of every per-layer method, and every input attribution."""
    layer = mixing_table.per_layer()
    return [*(f"{c}:{m}" for c in mixing_table.COMBINATIONS for m in layer), *mixing_table.input_attributions()]


def register_all() -> None:
    """Register ``mixing:<name>`` for every name of ``lifted_names`` not registered yet."""
    for name in lifted_names():
        key = f"mixing:{name}"
        if key in TABLE:
            continue
        base = mixing_table.TABLE[name.rpartition(":")[2]]
        costly = base.cost == "costly" or name.startswith("flow:")
        register(PairMethod(key, _lift(name), f"{name} of bertscope.hooks.mixing (its citation: "
                            f"{base.summary}), lifted to pairs", {}, "costly" if costly else "cheap", "no",
                            f"{name}: score x token weights of each text"))  # fmt: skip


register_all()
