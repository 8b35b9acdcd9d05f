"""Head names in the house convention, for every layer that names heads: ``L{layer}H{head}``, both from 0
(``L2H8`` is head 8 of ``blocks.2.attn``). ``bertscope.experiments.naming`` (the report's convention) re-exports
them; the circuits graph, its tables and the findings use them."""

from __future__ import annotations

import re

_HEAD = re.compile(r"^L(\d+)H(\d+)$")


def head_name(layer: int, head: int) -> str:
    """``(2, 8)`` -> ``"L2H8"`` (layer and head counted from 0, as in ``blocks.2.attn``)."""
    return f"L{int(layer)}H{int(head)}"


def parse_head(name: str) -> tuple[int, int]:
    """``"L2H8"`` -> ``(2, 8)``; ``ValueError`` for any other spelling."""
    m = _HEAD.match(name.strip())
    if m is None:
        raise ValueError(f"a head is written L{{layer}}H{{head}} (e.g. L2H8), got {name!r}")
    return int(m.group(1)), int(m.group(2))


def is_head(name: str) -> bool:
    """Whether ``name`` is a head in this convention (``"L2H8"``; not ``"m2"``, ``"input"``, ``"L2H8.q"``)."""
    return _HEAD.match(name.strip()) is not None


_OLD_HEAD = re.compile(r"^a(\d+)\.h(\d+)$")


def head_of(node: str) -> tuple[int, int] | None:
    """``(layer, head)`` of a circuit node that is a head (``"L2H8"``, or ``"a2.h8"`` as tables written before the
    convention name it), ``None`` for any other node (``"m2"``, ``"input"``, ``"output"``)."""
    m = _HEAD.match(node.strip()) or _OLD_HEAD.match(node.strip())
    return (int(m.group(1)), int(m.group(2))) if m else None
