"""The one table of context-mixing methods: adding a method is one ``register(Method(...))`` and one function.

Every list of method names (``bertscope.hooks.mixing.METHODS``, ``PER_LAYER``, ``INPUT_ATTRIBUTIONS``, the mixing
experiment's default methods, the explorer's menu, the rollout/flow convention) is read from ``TABLE`` when it is
asked for, so a method registered here is available everywhere at once. The built-in entries are registered by
``bertscope.hooks.mixing.methods``.

Three kinds of method, by what their one function takes:

- ``"layer"``: ``compute(chunk) -> [b', query, key]`` on a ``kernels.Chunk`` (a slice of sentences of one layer's
  decomposition: the attention ``pattern``, the head vectors ``u``/``f`` built once and shared, the residual ``r``,
  the LayerNorm scale ``s``, the block output ``y``). Optional ``ratio(chunk) -> [b', query]``: the method's own
  mixing ratio (``per_layer_contributions(..., ["ratio:<name>"])``).
- ``"rerun"``: ``compute(model, ids, mask, types, layers, chunk_tokens, cache, progress) -> [b, layer, q, k]`` for
  methods that re-run blocks under an intervention; ``cache`` holds ``sites`` for ``layers`` (read from a forward or
  from a capture), ``progress(desc, total)`` gives a bar (``update(n)``, ``close()``) to advance as work finishes.
- ``"input"``: ``compute(model, ids, mask, types, target, ref, *, baseline, n_steps, chunk_tokens, progress) ->
  [b, key]``, the attribution of a scalar per-sentence target (see ``bertscope.hooks.mixing.inputs``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

#: the hooks the decomposition (``LayerParts``) is built from, per layer
DECOMPOSITION_SITES = ("hook_resid_pre", "attn.hook_pattern", "attn.hook_v", "hook_attn_out", "hook_resid_mid")
COMBINATIONS = ("rollout", "flow")


@dataclass(frozen=True)
class Method:
    """One context-mixing method: its name, its one function and the facts the rest of the toolkit reads.

    ``with_residual``: its matrices already hold the residual stream, so rollout/flow only row-normalise them
    (otherwise ``0.5 C + 0.5 I``, see ``graph``). ``cost``: ``"cheap"`` (a forward pass per batch) or
    ``"costly"`` (O(tokens) passes; the mixing experiment runs these on fewer sentences). ``sites``: the hooks
    (``blocks.{L}.<site>``) it reads per layer. ``undefined(model, name)``: why it is undefined for a model
    (``None`` where it is defined). ``summary``: one line for menus and docs.
    """

    name: str
    kind: Literal["layer", "rerun", "input"]
    compute: Callable[..., Any]
    summary: str = ""
    with_residual: bool = False
    cost: Literal["cheap", "costly"] = "cheap"
    sites: tuple[str, ...] = DECOMPOSITION_SITES
    ratio: Callable[..., Any] | None = None
    undefined: Callable[[Any, str], str | None] | None = None


#: name -> Method; the single source of every method name
TABLE: dict[str, Method] = {}


def register(method: Method, *, replace: bool = False) -> Method:
    """Add ``method`` to the table (``replace=True`` to overwrite an entry of the same name); returns it."""
    if ":" in method.name or not method.name:
        raise ValueError(f"a method name has no ':' (rollout:/flow:/ratio: are prefixes), got {method.name!r}")
    if method.kind not in ("layer", "rerun", "input"):
        raise ValueError(f"Method.kind must be 'layer', 'rerun' or 'input', got {method.kind!r}")
    if method.name in TABLE and not replace:
        raise ValueError(f"a mixing method named {method.name!r} is registered already")
    TABLE[method.name] = method
    return method


def per_layer(cost: str | None = None) -> tuple[str, ...]:
    """Names of the per-layer methods (``[batch, layer, query, key]``), in table order; ``cost`` filters."""
    return tuple(m.name for m in TABLE.values() if m.kind != "input" and cost in (None, m.cost))


def input_attributions() -> tuple[str, ...]:
    """Names of the input attributions (``[batch, 1, key]``), in table order."""
    return tuple(m.name for m in TABLE.values() if m.kind == "input")


def all_names() -> tuple[str, ...]:
    """Every name ``contributions`` takes: the per-layer methods, their ``rollout:``/``flow:``, the attributions."""
    layer = per_layer()
    return (*layer, *(f"{c}:{m}" for c in COMBINATIONS for m in layer), *input_attributions())


def parse(method: str) -> tuple[str, Method]:
    """``(combination, Method)`` of a name such as ``"alti"`` (``""``) or ``"rollout:alti"``; ``ValueError`` for an
    unknown name (the message lists every known one)."""
    combine, _, base = method.rpartition(":")
    spec = TABLE.get(base)
    if spec is None or combine not in ("", *COMBINATIONS) or (combine and spec.kind == "input"):
        raise ValueError(f"unknown contribution method {method!r}; choose one of {', '.join(all_names())}")
    return combine, spec


def with_residual(method: str) -> bool:
    """Whether ``method``'s per-layer matrices contain the residual (see ``Method``); unknown names: False."""
    spec = TABLE.get(method)
    return bool(spec and spec.with_residual)
