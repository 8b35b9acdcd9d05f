"""Attribution patching of nodes: AtP, AtP* and EAP-IG, each an estimate of exact patching's effect.

For a node with clean activation ``a`` and corrupted ``a*`` (gradients through the model's real LayerNorms):

- ``atp`` (Nanda 2023; Syed et al. 2023): ``(a* - a) . dm/da`` at the clean run.
- ``atp-qk`` (Kramár et al. 2024, the QK fix only; this was ``atp*`` before GradDrop was added): the paper's
  attention nodes are a head's queries, keys and values (``nodes`` = "queries", "keys", "values": each head's
  ``hook_q`` / ``hook_k`` / ``hook_v`` at every position). A value node is linear given the pattern (``(v* - v) .
  dm/dv``), but a query or key node's change goes through the softmax exactly: the attention row with the corrupted
  query (each key's column with the corrupted key, all queries) is recomputed and the pattern change multiplied by
  ``dm/dA`` (:class:`QKFix`). On ``nodes="heads"`` a head's score is the sum of its three nodes' estimates:
  bertscope's aggregation, not the paper's (exact patching of the head's output moves all three together, so the
  sum leaves out their interaction); kept so that earlier ``atp*`` results reproduce.
- ``atp*`` (Kramár et al. 2024, "AtP*: An efficient and scalable method for localizing LLM behaviour to
  components", arXiv:2403.00745, section 3.1.2, GradDrop; AtP* = AtP + the QK fix + GradDrop): for every layer
  ``l`` a backward pass in which the gradient through layer ``l``'s residual contribution is zeroed gives the
  estimate ``c_{AtP+GD_l}(n)`` (with the QK fix on query and key nodes); the paper combines them as

      c_GradDrop(n) = 1/(L - 1) * sum_{l=1..L} |c_{AtP+GD_l}(n)|

  (the dropped layer that holds the node zeroes its estimate, so without cancellation the sum is (L - 1) |AtP|,
  hence the 1/(L - 1)). A cancellation of direct and indirect effects at the clean point (AtP ~ 0) no longer hides
  the node: dropping the layer that carries one of the two leaves the other. The result is a magnitude (the table
  entry says ``signed=False``; agreement tables compare it with the mean over pairs of |effect|). Here a layer is a
  block (its attention and MLP outputs, ``hook_attn_out`` and ``hook_mlp_out``, pass their value forward but no
  gradient back), and the combination is taken per pair (one prompt pair, as the paper writes its per-prompt
  estimates), then averaged over pairs like every estimate. On "heads" the node is the head's output
  (``attn.hook_z``): AtP of the head output, ``(z* - z) . dm/dz``, which needs no QK fix (its own softmax is
  upstream of z); "queries", "keys", "values" are the paper's attention nodes, "mlps" MLP outputs. A consequence
  of the formula worth knowing: a node whose whole effect passes through one later layer loses that layer's term
  (with two layers it reads 0).
- ``eap-ig`` (Hanna et al. 2024, as in their ``get_scores_eap_ig``; MIB's "EAP-IG-inputs"): ``(a* - a) . mean_k
  dm/da`` over ``steps`` runs whose input embeddings (``embed.hook_out``) are ``e* + k/steps (e - e*)``,
  ``k = 0..steps-1``. The path moves every input at once, so it estimates a path-averaged effect, not the effect
  of patching one node into the clean run.
- ``eap-ig-act`` (Hanna et al.'s ``get_scores_ig_activations``; MIB's "EAP-IG-activations"): one line per node
  of their graph, ``input`` (``embed.hook_out``), each layer's attention (all its heads together) and each MLP:
  that node's output set to ``alpha a + (1 - alpha) a*``, ``alpha = k/steps``, ``k = 1..steps``, everything
  downstream recomputed from the clean text; on every one of those ``(2 n_layers + 1) x steps`` passes the
  gradient is read at every node, and a node's score is ``(a* - a) . mean over all passes of dm/da`` (their
  backward hooks accumulate into every node's score on every pass, divided by the total step count).
- ``ig-act-own``: the same interpolation, but a layer's heads read the gradient only on the passes that move their
  own layer: ``(a* - a) . mean_k dm/da`` along the layer's own line, a Riemann sum of the integral that, as
  ``steps`` grows, is the exact effect of patching the whole layer's nodes, split between its heads along the
  path (costs ``n_layers x steps`` passes). Before this variant had its own name it was ``eap-ig-act``.

Every estimate is per pair (gradients of the sum over pairs, which are independent), so the table carries the
same intervals as exact patching's. Each method is one entry of the node table (``table.NODE_TABLE``, which
:func:`attribute` dispatches through) and one function here; a gradient method is one ``estimate(chunk)`` given
to :func:`per_batch`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from bertscope.hooks.circuits.results import (
    NODE_SITES,
    by_length,
    effects_table,
    in_task_order,
    node_labels,
)
from bertscope.hooks.circuits.table import DEFAULTS, node_method, node_methods
from bertscope.hooks.circuits.tasks import Task


def __getattr__(name: str) -> Any:
    """The old name ``METHODS``, read from the node table when asked for."""
    if name == "METHODS":  # the registered estimates (every node method but exact patching), read when asked for
        return node_methods(estimates=True)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def attribute(
    model: Any,
    task: Task,
    method: str = "atp",
    nodes: str = "heads",
    *,
    steps: int = DEFAULTS.ig_steps,
    batch_size: int = DEFAULTS.batch_size,
    n_boot: int = 1000,
    seed: int = 0,
) -> pd.DataFrame:
    """Attribution-patching estimates of every node's patching effect -> the table :func:`patch` returns
    (``method``: a registered node method, ``table.NODE_TABLE``: "atp", "atp*", "eap-ig", "eap-ig-act",
    "ig-act-own" built in; ``nodes`` "heads", "queries", "keys", "values" or "mlps"; ``atp*`` attention nodes only:
    on "queries", "keys" and "values" it is the paper's per-node estimate, on "heads" their sum)."""
    effects, total = attribute_effects(model, task, method, nodes, steps=steps, batch_size=batch_size)
    labels = node_labels(nodes, model.config.n_layers, model.config.n_heads)
    table = effects_table(effects, total, labels, method=method, n_boot=n_boot, seed=seed)
    table.insert(1, "source", "corrupted")
    return table


def attribute_effects(
    model: Any, task: Task, method: str = "atp", nodes: str = "heads", *, steps: int = DEFAULTS.ig_steps,
    batch_size: int = DEFAULTS.batch_size,
) -> tuple[np.ndarray, np.ndarray]:
    """``(estimates [n_pairs, n_nodes], total [n_pairs])`` for :func:`attribute`, by the table's ``method``."""
    return node_method(method).effects(model, task, nodes, steps=steps, batch_size=batch_size)


@dataclass
class Chunk:
    """One batch of pairs as the gradient methods see it: ``clean`` / ``corr`` inputs, ``rows`` (their indices in
    the task), the node ``site`` (``blocks.{L}.<site>``), the hook ``names`` cached, the corrupted cache ``ck``,
    the corrupted run's output ``out_k`` and ``loss`` (the metric summed over pairs: per-pair gradients)."""

    model: Any
    task: Task
    nodes: str
    steps: int
    clean: dict
    corr: dict
    rows: torch.Tensor
    site: str
    names: list[str]
    ck: Any
    out_k: Any
    loss: Callable[[Any], torch.Tensor]

    def clean_cache(self) -> Any:
        """The clean run's cache of ``names`` (no gradients)."""
        with torch.no_grad():
            return self.model.run_with_cache(**self.clean, names_filter=self.names)[1]

    def grad_with(self, hook: tuple, names: list[str]) -> Any:
        """A clean run with the forward ``hook``, caching ``names`` and their gradients of ``loss``."""
        return self.model.run_with_cache(**self.clean, names_filter=names, fwd_hooks=[hook], incl_bwd=True,
                                         loss_fn=self.loss)[1]


def per_batch(model: Any, task: Task, nodes: str, steps: int, batch_size: int,
              estimate: Callable[[Chunk], tuple[Any, list[torch.Tensor]]], extra: tuple[str, ...] = ()
              ) -> tuple[np.ndarray, np.ndarray]:
    """``(estimates [n_pairs, n_nodes], total [n_pairs])`` of a gradient method: ``estimate(chunk) -> (clean
    cache, per-layer gradients of the node site)`` on each batch (``extra``: more hook names to cache), the
    estimate of a node being ``(a* - a) . gradient`` summed over positions (and the head's dimensions)."""
    return _batched(model, task, batch_size, lambda *a: _linear(_chunk(model, task, nodes, steps, extra, *a),
                                                                estimate))


def _batched(model, task, batch_size, fn) -> tuple[np.ndarray, np.ndarray]:
    out, totals, order = [], [], by_length(task.mask, batch_size)
    for rows in order:
        est, total = fn(task.batch(rows, "clean"), task.batch(rows, "corrupted"), rows)
        out.append(est)
        totals.append(total)
    return in_task_order(out, order).numpy(), in_task_order(totals, order).numpy()


def _chunk(model, task, nodes, steps, extra, clean, corr, rows) -> Chunk:
    site = NODE_SITES[nodes]
    names = [f"blocks.*.{site}", "embed.hook_out", *extra]
    with torch.no_grad():
        out_k, ck = model.run_with_cache(**corr, names_filter=names)
    mask = clean["attention_mask"]
    loss = lambda out: task.metric(out, mask, rows).sum()  # noqa: E731  (per-pair gradients: pairs are independent)
    return Chunk(model, task, nodes, steps, clean, corr, rows, site, names, ck, out_k, loss)


def _total(c: Chunk) -> torch.Tensor:
    mask = c.clean["attention_mask"]
    with torch.no_grad():
        m_clean = c.task.metric(c.model(**c.clean), mask, c.rows)
        return (c.task.metric(c.out_k, mask, c.rows) - m_clean).double().cpu()


def _linear(c: Chunk, estimate) -> tuple[torch.Tensor, torch.Tensor]:
    cc, grads = estimate(c)
    total = _total(c)
    with torch.no_grad():
        per_layer = []
        for L in range(c.model.config.n_layers):
            delta = c.ck[f"blocks.{L}.{c.site}"] - cc[f"blocks.{L}.{c.site}"]
            if c.nodes != "mlps":
                per_layer.append((delta * grads[L]).sum((1, 3)))  # [b, h]
            else:
                per_layer.append((delta * grads[L]).sum((1, 2))[:, None])
    return torch.cat(per_layer, dim=1).double().cpu(), total


def _atp(c: Chunk) -> tuple[Any, list[torch.Tensor]]:
    _, cc = c.model.run_with_cache(**c.clean, names_filter=c.names, incl_bwd=True, loss_fn=c.loss)
    return cc, [cc[f"blocks.{L}.{c.site}_grad"] for L in range(c.model.config.n_layers)]


def _eap_ig(c: Chunk) -> tuple[Any, list[torch.Tensor]]:
    grads = None
    cc = c.clean_cache()
    e_clean, e_corr = cc["embed.hook_out"], c.ck["embed.hook_out"]
    for k in range(c.steps):
        mixed = e_corr + (k / c.steps) * (e_clean - e_corr)
        cg = c.grad_with(("embed.hook_out", lambda t, hook, mixed=mixed: mixed), c.names[:1])
        g = [cg[f"blocks.{L}.{c.site}_grad"] for L in range(c.model.config.n_layers)]
        grads = g if grads is None else [a + b for a, b in zip(grads, g, strict=True)]
    return cc, [g / c.steps for g in grads]


def _eap_ig_act(c: Chunk) -> tuple[Any, list[torch.Tensor]]:
    n = c.model.config.n_layers
    cc = c.clean_cache()
    grads = [None] * n
    lines = ["embed.hook_out"] + [f"blocks.{L}.{s}" for L in range(n) for s in ("attn.hook_z", "hook_mlp_out")]
    for line in lines:  # Hanna et al.: every node's own line, the gradient read at every node on every pass
        for k in range(1, c.steps + 1):
            mixed = (k / c.steps) * cc[line] + (1 - k / c.steps) * c.ck[line]
            cg = c.grad_with((line, lambda t, hook, mixed=mixed: mixed), c.names[:1])
            for L in range(n):
                g = cg[f"blocks.{L}.{c.site}_grad"]
                grads[L] = g if grads[L] is None else grads[L] + g
    return cc, [g / (len(lines) * c.steps) for g in grads]


def _ig_act_own(c: Chunk) -> tuple[Any, list[torch.Tensor]]:
    cc = c.clean_cache()
    grads = []
    for L in range(c.model.config.n_layers):
        name = f"blocks.{L}.{c.site}"
        a, a_k = cc[name], c.ck[name]
        total_grad = torch.zeros_like(a)
        for k in range(1, c.steps + 1):
            mixed = (k / c.steps) * a + (1 - k / c.steps) * a_k
            total_grad += c.grad_with((name, lambda t, hook, mixed=mixed: mixed), [name])[name + "_grad"]
        grads.append(total_grad / c.steps)
    return cc, grads


_ACT_SITES = ("blocks.*.attn.hook_z", "blocks.*.hook_mlp_out")
_STAR_SITES = ("blocks.*.attn.hook_q", "blocks.*.attn.hook_k", "blocks.*.attn.hook_v", "blocks.*.attn.hook_pattern",
               "blocks.*.attn.hook_scores", "blocks.*.hook_resid_pre")


def atp_effects(model: Any, task: Task, nodes: str, *, steps: int = 1, batch_size: int = DEFAULTS.batch_size
                ) -> tuple[np.ndarray, np.ndarray]:
    """AtP (table entry ``atp``): ``(a* - a) . dm/da`` at the clean run (``steps`` unused)."""
    return per_batch(model, task, nodes, steps, batch_size, _atp)


def eap_ig_effects(model: Any, task: Task, nodes: str, *, steps: int = DEFAULTS.ig_steps,
                   batch_size: int = DEFAULTS.batch_size) -> tuple[np.ndarray, np.ndarray]:
    """EAP-IG on the inputs (table entry ``eap-ig``; see the module docstring)."""
    return per_batch(model, task, nodes, steps, batch_size, _eap_ig)


def eap_ig_act_effects(model: Any, task: Task, nodes: str, *, steps: int = DEFAULTS.ig_steps,
                       batch_size: int = DEFAULTS.batch_size) -> tuple[np.ndarray, np.ndarray]:
    """EAP-IG-activations (table entry ``eap-ig-act``; see the module docstring)."""
    return per_batch(model, task, nodes, steps, batch_size, _eap_ig_act, _ACT_SITES)


def ig_act_own_effects(model: Any, task: Task, nodes: str, *, steps: int = DEFAULTS.ig_steps,
                       batch_size: int = DEFAULTS.batch_size) -> tuple[np.ndarray, np.ndarray]:
    """The own-layer variant of EAP-IG-activations (table entry ``ig-act-own``; see the module docstring)."""
    return per_batch(model, task, nodes, steps, batch_size, _ig_act_own)


def atp_qk_effects(model: Any, task: Task, nodes: str, *, steps: int = 1, batch_size: int = DEFAULTS.batch_size
                   ) -> tuple[np.ndarray, np.ndarray]:
    """AtP with Kramár et al.'s QK fix only (table entry ``atp-qk``; ``atp*`` before GradDrop was added): per query,
    key and value node (:func:`atp_star_parts`), signed; on "heads" the sum of a head's three node estimates
    (bertscope's aggregation, not the paper's: kept so that results of the QK-fix-only ``atp*`` reproduce)."""

    def chunk(clean, corr, rows):
        c = _chunk(model, task, nodes, steps, _STAR_SITES, clean, corr, rows)
        cc, _ = _atp(c)
        total = _total(c)
        mask = clean["attention_mask"]
        with torch.no_grad():
            per_layer = []
            for L in range(model.config.n_layers):
                parts = atp_star_parts(model, L, cc, c.ck, mask)
                per_layer.append(sum(parts.values()) if nodes == "heads" else parts[_PART[nodes]])
        return torch.cat(per_layer, dim=1).double().cpu(), total

    return _batched(model, task, batch_size, chunk)


_PART = {"queries": "query", "keys": "key", "values": "value"}
_GRAD_SITE = {"heads": "attn.hook_z", "queries": "attn.hook_pattern", "keys": "attn.hook_pattern",
              "values": "attn.hook_v", "mlps": "hook_mlp_out"}
#: a block's residual contribution: the writes GradDrop cuts the gradient of (its attention and MLP outputs)
LAYER_WRITES = ("hook_attn_out", "hook_mlp_out")


def atp_star_effects(model: Any, task: Task, nodes: str, *, steps: int = 1, batch_size: int = DEFAULTS.batch_size
                     ) -> tuple[np.ndarray, np.ndarray]:
    """AtP* (table entry ``atp*``; Kramár et al. 2024): the QK fix and GradDrop, as the paper defines AtP*.

    Per node and pair, an estimate ``e_l`` is computed for every layer ``l`` from a backward pass in which the
    gradient through block ``l``'s residual contribution (its attention and MLP outputs, ``LAYER_WRITES``) is
    zeroed (:func:`graddrop_estimates`); query and key nodes take the QK fix (the softmax recomputed exactly,
    :class:`QKFix`, with that pass's ``dm/dA``), value, head-output and MLP nodes ``(a* - a) . dm/da`` with that
    pass's gradient. The estimates are combined as the paper's GradDrop does (:func:`graddrop`):
    ``sum_l |e_l| / (L - 1)``, a magnitude (no sign). Nodes: "heads" (a head's output ``attn.hook_z``: plain AtP
    of the head output, whose own softmax needs no fix), "queries", "keys", "values" (the paper's attention nodes)
    and "mlps". Cost: ``n_layers`` forward and backward passes a batch (one per dropped layer; dropping the first
    layer changes no gradient but its own nodes', which are zero, so ``n_layers - 1`` extra passes), plus the
    QK fix's two score recomputations a layer on query and key nodes."""

    def chunk(clean, corr, rows):
        extra = _STAR_SITES if nodes in ("queries", "keys") else ()
        c = _chunk(model, task, nodes, steps, extra, clean, corr, rows)
        n = model.config.n_layers
        site = _GRAD_SITE[nodes]
        _, cc = model.run_with_cache(**c.clean, names_filter=[f"blocks.*.{site}", *c.names], incl_bwd=True,
                                     loss_fn=c.loss)
        mask = clean["attention_mask"]
        with torch.no_grad():
            fixes = [QKFix.of(model, L, cc, c.ck, mask) for L in range(n)] if nodes in ("queries", "keys") else None

        def estimate(L: int, grads: Any) -> torch.Tensor:  # [b, h] (or [b, 1] for mlps), float64
            g = grads[f"blocks.{L}.{site}_grad"].double()
            if fixes is not None:
                return fixes[L].parts(g)[_PART[nodes]]
            name = f"blocks.{L}.{c.site}"
            delta = (c.ck[name] - cc[name]).double()
            return (delta * g).sum((1, 3)) if nodes != "mlps" else (delta * g).sum((1, 2))[:, None]

        per_drop = graddrop_estimates(model, c.clean, c.loss, site, estimate, cc)
        return graddrop(per_drop).cpu(), _total(c)

    return _batched(model, task, batch_size, chunk)


def graddrop_estimates(model: Any, clean: dict, loss: Callable[[Any], torch.Tensor], site: str,
                       estimate: Callable[[int, Any], torch.Tensor], cc: Any) -> torch.Tensor:
    """``[n_layers (dropped), b, n_layers (node's), nodes a layer]``: entry ``[l, :, L]`` is ``estimate(L, grads)``
    with the gradients of a clean backward pass in which block ``l``'s residual contribution (its attention and
    MLP outputs) passes its value forward but no gradient back (``t.detach()``); ``cc``: the plain clean cache with
    gradients. Dropping block ``l`` leaves the gradient of every node in a later block unchanged (a gradient depends
    only on what is downstream), so those entries are the plain estimate; a node in block ``l`` itself reaches the
    output only through block ``l``'s contribution, so its entry is zero; only nodes in blocks before ``l`` need the
    pass (``n_layers - 1`` passes in all)."""
    n = model.config.n_layers
    with torch.no_grad():
        plain = torch.stack([estimate(L, cc) for L in range(n)], 1)  # [b, n, k]
    out = plain[None].repeat(n, 1, 1, 1)
    if n == 1:  # no layer but the node's own: the plain estimate (graddrop takes its magnitude)
        return out
    for drop in range(n):
        out[drop, :, drop] = 0.0
        if drop == 0:
            continue
        cut = [(f"blocks.{drop}.{w}", lambda t, hook: t.detach()) for w in LAYER_WRITES]
        _, cg = model.run_with_cache(**clean, names_filter=[f"blocks.{L}.{site}" for L in range(drop)],
                                     fwd_hooks=cut, incl_bwd=True, loss_fn=loss)
        with torch.no_grad():
            for L in range(drop):
                out[drop, :, L] = estimate(L, cg)
    return out


def graddrop(per_drop: torch.Tensor) -> torch.Tensor:
    """Kramár et al.'s GradDrop combination of ``per_drop [n_layers (dropped), b, ...]`` (the estimate of each node
    with block l's gradient dropped, :func:`graddrop_estimates`) -> ``[b, n_nodes]`` (trailing dimensions
    flattened, layer-major): ``sum_l |e_l| / (L - 1)``, L the number of layers; the 1/(L - 1) makes it ``|AtP|``
    when no dropped layer but the node's own (whose estimate is zero) changes the estimate. With one layer there is
    nothing to drop but the node's own: the estimate is ``|AtP|``, the same limit."""
    n = per_drop.shape[0]
    flat = per_drop.flatten(2)
    if n == 1:  # graddrop_estimates keeps the plain estimate: there is no other layer to drop
        return flat[0].abs()
    return flat.abs().sum(0) / (n - 1)


def atp_star_parts(model: Any, layer: int, cc: Any, ck: Any, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """AtP* (the QK fix) of every head of ``layer`` by node type: ``{"query", "key", "value"}`` each ``[b, h]``
    (float64), from the clean cache ``cc`` (with ``_grad`` entries of ``hook_pattern`` and ``hook_v``) and the
    corrupted ``ck``."""
    p = f"blocks.{layer}.attn."
    parts = QKFix.of(model, layer, cc, ck, mask).parts(cc[p + "hook_pattern_grad"].double())
    parts["value"] = ((ck[p + "hook_v"] - cc[p + "hook_v"]) * cc[p + "hook_v_grad"]).sum((1, 3)).double()
    return parts


@dataclass
class QKFix:
    """Kramár et al.'s QK fix for the query and key nodes of one layer: the pattern changes that do not depend on
    the gradient, so that one recomputation serves every backward pass (GradDrop's included). ``A [b, h, q, k]``
    the clean pattern; ``dq`` the pattern with each query row recomputed from the corrupted query, minus ``A``;
    ``grow = e^d - 1`` and ``r = 1 + A grow`` for ``d`` the change of score ``[t, s]`` when key ``s`` is corrupted
    (padding keys 0)."""

    A: torch.Tensor
    dq: torch.Tensor
    grow: torch.Tensor
    r: torch.Tensor

    @classmethod
    def of(cls, model: Any, layer: int, cc: Any, ck: Any, mask: torch.Tensor) -> QKFix:
        """The fix for block ``layer`` from the clean cache ``cc`` (``hook_pattern``, ``hook_scores``,
        ``hook_resid_pre``) and the corrupted ``ck`` (``hook_q``, ``hook_k``)."""
        p = f"blocks.{layer}.attn."
        A = cc[p + "hook_pattern"].double()
        s_q, s_k = _scores_with(model, layer, cc, ck, mask)
        S = cc[p + "hook_scores"].double()
        real = mask.bool()[:, None, None, :].expand_as(A)
        grow = torch.expm1(torch.where(real, (s_k - S).clamp(max=600.0), torch.zeros_like(S)))
        return cls(A, torch.softmax(s_q, dim=-1) - A, grow, 1 + A * grow)

    def parts(self, gA: torch.Tensor) -> dict[str, torch.Tensor]:
        """``{"query", "key"}`` estimates ``[b, h]`` given ``gA = dm/dA [b, h, q, k]``: a query node (row t
        recomputed) ``sum_s gA_ts dq_ts``; a key node (column s of every row: one logit moved by ``d``, the row's
        normaliser multiplied by ``r``) ``sum_t [(1/r - 1) sum_j gA_tj A_tj + gA_ts A_ts grow_ts / r]``."""
        query = (gA * self.dq).sum((2, 3))
        G = (gA * self.A).sum(-1, keepdim=True)  # [b, h, q, 1]
        key = ((1 / self.r - 1) * G + gA * self.A * self.grow / self.r).sum((2, 3))
        return {"query": query, "key": key}


def _scores_with(model, layer, cc, ck, mask) -> tuple[torch.Tensor, torch.Tensor]:
    """Block ``layer``'s attention scores with every query corrupted (keys clean), and with every key corrupted
    (queries clean): ``[b, h, q, k]`` each. A score depends only on its own query and key (and positions), so
    entry ``[t, s]`` is the score with only query t (or only key s) corrupted."""
    p = f"blocks.{layer}.attn."
    out = {}
    for which in ("q", "k"):
        put = (p + f"hook_{which}", lambda t, hook, w=which: ck[p + f"hook_{w}"])
        grab = (p + "hook_scores", lambda t, hook, w=which: out.__setitem__(w, t))
        with model.hooks([put, grab]):
            model.forward_from(layer, cc[f"blocks.{layer}.hook_resid_pre"], mask, stop_at_layer=layer)
    return out["q"].double(), out["k"].double()
