"""The one table of pairwise attribution methods: adding a method is one ``register(PairMethod(...))`` and one
function (the house's extension point, as ``bertscope.hooks.mixing.table``).

Every method's function has one signature::

    compute(model, pair: Pair, **options) -> (matrix [b, pos_a, pos_b], target [b], reference: str)

where ``Pair`` (``bertscope.hooks.similarity.pairs``) holds both sides' tokenised batches, the score kind and the
pooling. ``matrix`` is zero on padding; ``target`` is the quantity the matrix sums to in the method's own
accounting (the four-term difference of integrated Jacobians, the score for BiLRP, ...); ``reference`` states the
reference inputs in words. Built-in entries: ``bertscope.hooks.similarity.methods``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class PairMethod:
    """One pairwise attribution method.

    ``name``: its ``method=`` name. ``citation``: the paper (and code) it follows. ``compute``: its one function
    (see the module docstring). ``defaults``: its options and their defaults (``attribute`` refuses any other
    option). ``cost``: ``"cheap"`` (a few forward/backward passes per pair), ``"costly"`` (per-token passes, or
    per-token passes times steps). ``exact``: whether its matrix sums to its target exactly (``"limit"``: as steps
    grow). ``summary``: one line for menus and docs.
    """

    name: str
    compute: Callable[..., Any]
    citation: str
    defaults: dict[str, Any] = field(default_factory=dict)
    cost: Literal["cheap", "costly"] = "cheap"
    exact: Literal["yes", "limit", "no"] = "no"
    summary: str = ""


#: name -> PairMethod; the single source of every pairwise method name
TABLE: dict[str, PairMethod] = {}


def register(method: PairMethod, *, replace: bool = False) -> PairMethod:
    """Add ``method`` to the table (``replace=True`` to overwrite an entry of the same name); returns it."""
    if not method.name or method.name in TABLE and not replace:
        raise ValueError(f"a pairwise method named {method.name!r} is registered already (or the name is empty)")
    if method.cost not in ("cheap", "costly") or method.exact not in ("yes", "limit", "no"):
        raise ValueError(f"PairMethod {method.name!r}: cost must be cheap/costly and exact yes/limit/no")
    TABLE[method.name] = method
    return method


def names(cost: str | None = None) -> tuple[str, ...]:
    """Registered method names in table order (``cost`` filters)."""
    return tuple(m.name for m in TABLE.values() if cost in (None, m.cost))


def get(name: str) -> PairMethod:
    """The entry of ``name``; ``ValueError`` naming every known method otherwise."""
    if name not in TABLE:
        raise ValueError(f"unknown pairwise method {name!r}; choose one of {', '.join(TABLE)}")
    return TABLE[name]
