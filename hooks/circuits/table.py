"""The tables of circuit attribution methods: adding one is one ``register_node(NodeMethod(...))`` (or
``register_edge``) and one function, as ``bertscope.hooks.mixing.table`` does for token attributions.

Every list of method names (``attribution.METHODS``, the circuits experiment's default ``methods``, the
``--methods`` help of the CLI, the edge method's choices, the figures' order) is read from these tables when it is
asked for, so a method registered here (from any module, a test file included) is available everywhere at once.
This module imports no torch: the built-in entries name their function as ``"module:function"``, imported on
first use, so that the command line can list the names before it loads a model.

Two targets:

- **node methods** (:class:`NodeMethod`): ``effects(model, task, nodes, *, steps, batch_size) -> (effects
  [n_pairs, n_nodes], total [n_pairs])`` (numpy float64): per pair, each node's (estimated) effect on the metric
  of patching it from the corrupted run into the clean one, and ``m(corrupted) - m(clean)``; nodes in
  ``results.node_labels(nodes, ...)`` order.
- **edge methods** (:class:`EdgeMethod`): ``scores(model, task, rows, steps) -> [b, n_senders, n_receivers]``
  (float64), per pair of the batch ``rows``, on the frozen-LayerNorm graph (``edges.edges`` averages them).

Cost classes (what one pair costs, in forward-equivalents): ``"exact"`` (a forward per node), ``"gradient"``
(one forward and backward), ``"steps"`` (``steps`` forward and backward passes), ``"steps-per-node"`` (``steps``
passes per node or per layer).

:data:`DEFAULTS` is the one set of defaults of the circuits analysis: ``edges``, ``find_circuit``,
``faithfulness``, the circuits experiment's ``Settings`` and ``bertscope run circuits`` all read it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

Cost = Literal["exact", "gradient", "steps", "steps-per-node"]
NODE_KINDS = ("heads", "queries", "keys", "values", "mlps")


@dataclass(frozen=True)
class Defaults:
    """The defaults of the circuits analysis, shared by the Python functions and the command line."""

    edge_method: str = "eap-ig"
    ig_steps: int = 3  # integrated-gradient steps (EAP-IG head scores and edges)
    candidates: int = 20  # greedy search starts from this many top edges
    threshold: float = 0.02  # an edge stays when dropping it moves the metric by this share of m(full)-m(empty)
    n_random: int = 2  # random edge orders for the faithfulness-curve control
    n_random_circuits: int = 10  # random circuits of the found circuit's size
    top_edges: int = 40  # rows of the edges table kept
    checked_edges: int = 3  # path patching of this many top edges and as many random ones
    batch_size: int = 32  # pairs per forward pass (`bertscope run`'s --batch-size default)
    min_pairs: int = 2  # fewest pairs a bootstrap interval over pairs is computed from


DEFAULTS = Defaults()


def _resolve(fn: Callable[..., Any] | str) -> Callable[..., Any]:
    if callable(fn):
        return fn
    module, _, name = fn.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class NodeMethod:
    """One node attribution method: its name, its one function and the facts the rest of the toolkit reads.

    ``compute``: the function (or ``"module:function"``) with the signature in the module docstring. ``citation``:
    the paper (and code) it follows. ``cost``: its cost class. ``nodes``: the node kinds it scores. ``uses_steps``:
    it reads ``steps``. ``default``: among the circuits experiment's default head methods. ``summary``: one line
    for menus and docs. ``label``: its name in figures (default: ``name``). ``signed``: its scores estimate the
    signed effect (False: a magnitude, as AtP*'s GradDrop gives; agreement tables compare it with the mean over
    pairs of ``|effect|``).
    """

    name: str
    compute: Callable[..., Any] | str
    citation: str = ""
    summary: str = ""
    label: str = ""
    cost: Cost = "gradient"
    nodes: tuple[str, ...] = NODE_KINDS
    uses_steps: bool = False
    default: bool = True
    signed: bool = True

    def effects(self, model: Any, task: Any, nodes: str = "heads", *, steps: int = DEFAULTS.ig_steps,
                batch_size: int = DEFAULTS.batch_size) -> tuple[Any, Any]:
        """``(effects [n_pairs, n_nodes], total [n_pairs])`` of this method on ``task`` (checked arguments)."""
        if nodes not in self.nodes:
            raise ValueError(f"{self.name} attributes {', '.join(self.nodes)}, not {nodes!r}")
        if self.uses_steps and steps < 1:
            raise ValueError(f"{self.name} needs steps >= 1, got {steps}")
        return _resolve(self.compute)(model, task, nodes, steps=steps, batch_size=batch_size)


@dataclass(frozen=True)
class EdgeMethod:
    """One edge attribution method on the frozen-LayerNorm graph (``compute``: see the module docstring)."""

    name: str
    compute: Callable[..., Any] | str
    citation: str = ""
    summary: str = ""
    cost: Cost = "gradient"
    uses_steps: bool = False

    def scores(self, model: Any, task: Any, rows: Any, steps: int) -> Any:
        """``[b, n_senders, n_receivers]`` scores of the pairs ``rows``."""
        return _resolve(self.compute)(model, task, rows, steps)


#: name -> NodeMethod; the single source of every node method name
NODE_TABLE: dict[str, NodeMethod] = {}
#: name -> EdgeMethod; the single source of every edge method name
EDGE_TABLE: dict[str, EdgeMethod] = {}


def _check_name(name: str, table: dict[str, Any], replace: bool, what: str) -> None:
    if not name or "," in name or name != name.strip():
        raise ValueError(f"a {what} name is non-empty, without commas or outer spaces, got {name!r}")
    if name in table and not replace:
        raise ValueError(f"a {what} named {name!r} is registered already")


def register_node(method: NodeMethod, *, replace: bool = False) -> NodeMethod:
    """Add ``method`` to :data:`NODE_TABLE` (``replace=True`` to overwrite an entry of the same name)."""
    _check_name(method.name, NODE_TABLE, replace, "node attribution method")
    bad = set(method.nodes) - set(NODE_KINDS)
    if bad or not method.nodes:
        raise ValueError(f"NodeMethod.nodes are among {', '.join(NODE_KINDS)}, got {method.nodes!r}")
    NODE_TABLE[method.name] = method
    return method


def register_edge(method: EdgeMethod, *, replace: bool = False) -> EdgeMethod:
    """Add ``method`` to :data:`EDGE_TABLE` (``replace=True`` to overwrite an entry of the same name)."""
    _check_name(method.name, EDGE_TABLE, replace, "edge attribution method")
    EDGE_TABLE[method.name] = method
    return method


def node_methods(*, default: bool | None = None, estimates: bool = False) -> tuple[str, ...]:
    """Node method names in table order (``default=True``: the default head methods only; ``estimates=True``:
    without exact patching)."""
    return tuple(m.name for m in NODE_TABLE.values()
                 if default in (None, m.default) and not (estimates and m.cost == "exact"))


def label(name: str) -> str:
    """A node method's name in figures: its ``label``, else its name (also for names no longer registered)."""
    spec = NODE_TABLE.get(name)
    return (spec.label or spec.name) if spec else name


def edge_methods() -> tuple[str, ...]:
    """Edge method names in table order."""
    return tuple(EDGE_TABLE)


def node_method(name: str) -> NodeMethod:
    """The entry ``name``; ``ValueError`` listing every known name otherwise."""
    if name not in NODE_TABLE:
        raise ValueError(f"unknown node attribution method {name!r}; choose one of {', '.join(NODE_TABLE)}")
    return NODE_TABLE[name]


def edge_method(name: str) -> EdgeMethod:
    """The entry ``name``; ``ValueError`` listing every known name otherwise."""
    if name not in EDGE_TABLE:
        raise ValueError(f"unknown edge method {name!r}; choose one of {', '.join(EDGE_TABLE)}")
    return EDGE_TABLE[name]


_ATTR = "bertscope.hooks.circuits.attribution"
_EDGES = "bertscope.hooks.circuits.edges"
for _m in (
    NodeMethod("exact", "bertscope.hooks.circuits.patching:exact_effects", cost="exact", label="exact patching",
               citation="activation patching (Meng et al. 2022; Heimersheim & Nanda 2024)",
               summary="exact patching: the clean run with one node set to its corrupted value"),
    NodeMethod("atp", f"{_ATTR}:atp_effects", citation="Nanda 2023; Syed et al. 2023", label="AtP",
               summary="attribution patching: (a* - a) . dm/da at the clean run"),
    NodeMethod("atp*", f"{_ATTR}:atp_star_effects", signed=False, label="AtP*",
               citation="Kramár et al. 2024 (QK fix and GradDrop)",
               summary="AtP with the QK fix, GradDrop-combined over per-layer gradient drops: a magnitude"),
    NodeMethod("atp-qk", f"{_ATTR}:atp_qk_effects", nodes=("heads", "queries", "keys", "values"), default=False,
               citation="Kramár et al. 2024 (the QK fix only; GradDrop not applied)", label="AtP (QK fix)",
               summary="AtP with the softmax recomputed exactly for query and key nodes (atp* before GradDrop)"),
    NodeMethod("eap-ig", f"{_ATTR}:eap_ig_effects", cost="steps", uses_steps=True, label="EAP-IG",
               citation="Hanna et al. 2024, get_scores_eap_ig (MIB's EAP-IG-inputs)",
               summary="AtP with the gradient averaged along the input-embedding path"),
    NodeMethod("eap-ig-act", f"{_ATTR}:eap_ig_act_effects", cost="steps-per-node", uses_steps=True,
               citation="Hanna et al. 2024, get_scores_ig_activations (MIB's EAP-IG-activations)",
               label="EAP-IG (activations)",
               summary="AtP with the gradient averaged over every node's own interpolation line"),
    NodeMethod("ig-act-own", f"{_ATTR}:ig_act_own_effects", cost="steps-per-node", uses_steps=True, default=False,
               citation="bertscope's variant of Hanna et al.'s EAP-IG-activations",
               label="IG on each layer's own line",
               summary="a layer's heads read the gradient only along their own layer's line"),
):
    register_node(_m)
for _e in (
    EdgeMethod("eap", f"{_EDGES}:eap_scores", citation="Syed et al. 2023",
               summary="edge attribution patching on the frozen-LayerNorm graph"),
    EdgeMethod("eap-ig", f"{_EDGES}:eap_ig_scores", cost="steps", uses_steps=True,
               citation="Hanna et al. 2024", summary="EAP with the gradient averaged along the input path"),
):
    register_edge(_e)
del _m, _e
