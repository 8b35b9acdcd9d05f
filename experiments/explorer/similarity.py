"""The explorer's pair view: two texts side by side; hover a token of one, and every token of the other is coloured
by the attribution of that token pair (``bertscope.similarity.attribute``'s matrix).

>>> from bertscope import similarity
>>> from bertscope.experiments.explorer import similarity as pair_view
>>> r = similarity.attribute(model, "A man plays a guitar.", "Someone is playing music.", method="bilrp")
>>> pair_view.from_attributions([r]).save("pairs.html")

One self-contained HTML page (``pairs.html``, ``pairs.css``, ``pairs.js`` inlined; nothing fetched), written as
the explorer page is (``page.script_json``: corpus text cannot close the data element; the script is the only one
allowed, by hash; strings reach the DOM through ``textContent``). The ``similarity`` experiment writes one for its
attributed pairs (``OUT/similarity/pairs.html``).

Payload: ``{"format", "title", "methods": [name], "pairs": [{"id", "a", "b", "gold", "score", "tokens_a",
"tokens_b", "special_a", "special_b", "matrices": {method: {"values": [[...]], "vmax", "target", "error"}}}]}``;
``values`` is ``[tokens_a, tokens_b]``.
"""

from __future__ import annotations

import base64
import hashlib
import html
import os
import re
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import pandas as pd
from bertscope.experiments.explorer.page import iframe, script_json

FORMAT = "bertscope-pairs/1"
SPECIAL = re.compile(r"^(\[[A-Z]+\]|<[a-z/]+>|<\|[a-z]+\|>)$")


class PairView:
    """A rendered pair view: ``html()`` is the page, ``save(path)`` writes it, Jupyter shows it inline."""

    def __init__(self, payload: dict) -> None:
        self.payload = payload

    def html(self) -> str:
        """The self-contained HTML document."""
        return render(self.payload)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the page to ``path`` (atomically) and return the path."""
        from bertscope.experiments.io import write_text

        return write_text(path, self.html())

    def _repr_html_(self) -> str:
        return iframe(self.html())


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def render(payload: dict) -> str:
    """The whole HTML document of ``payload``."""
    script, style = _asset("pairs.js"), _asset("pairs.css")
    for name, text in (("pairs.js", script), ("pairs.css", style)):
        if re.search(r"</(script|style)", text, re.IGNORECASE):
            raise RuntimeError(f"{name} must not contain a closing script/style tag")
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    parts = {"title": html.escape(str(payload.get("title", "bertscope pair view"))), "style": style,
             "script": script, "script_hash": f"'sha256-{digest}'", "data": script_json(payload)}
    return re.sub(r"\{\{(\w+)\}\}", lambda m: parts[m.group(1)], _asset("pairs.html"))


def _is_special(token: str) -> bool:
    return bool(SPECIAL.match(token))


def payload(matrices: pd.DataFrame, pairs: pd.DataFrame | None = None, *, title: str = "") -> dict:
    """The page's data from a long ``matrices`` table (``pair``, ``method``, ``i``, ``token_a``, ``j``,
    ``token_b``, ``value``, ``score``, ``target``, ``error``: the similarity experiment's table) and, when given,
    the pairs (``id``, ``a``, ``b``, ``score`` = gold) for the texts and gold scores."""
    methods = list(dict.fromkeys(matrices.method))
    gold = {} if pairs is None else {int(r.id): r for r in pairs.itertuples()}
    out = []
    for pid, g in matrices.groupby("pair", sort=False):
        first = g[g.method == g.method.iloc[0]]
        ta = first.drop_duplicates("i").sort_values("i").token_a.astype(str).tolist()
        tb = first.drop_duplicates("j").sort_values("j").token_b.astype(str).tolist()
        row = gold.get(int(pid))
        entry = {"id": int(pid), "a": str(row.a) if row is not None else " ".join(ta),
                 "b": str(row.b) if row is not None else " ".join(tb),
                 "gold": float(row.score) if row is not None else None, "score": float(first.score.iloc[0]),
                 "tokens_a": ta, "tokens_b": tb, "special_a": [_is_special(t) for t in ta],
                 "special_b": [_is_special(t) for t in tb], "matrices": {}}
        for method, m in g.groupby("method", sort=False):
            grid = m.pivot(index="i", columns="j", values="value").sort_index().sort_index(axis=1)
            values = [[float(f"{v:.5g}") for v in r] for r in grid.to_numpy()]
            entry["matrices"][str(method)] = {"values": values, "vmax": max(abs(v) for r in values for v in r),
                                              "target": float(m.target.iloc[0]), "error": float(m.error.iloc[0])}
        out.append(entry)
    return {"format": FORMAT, "title": title, "methods": methods, "pairs": out}


def save(matrices: pd.DataFrame, pairs: pd.DataFrame | None, path: str | os.PathLike[str], *,
         title: str = "") -> Path:
    """Write the pair view of a ``matrices`` table (see :func:`payload`) to ``path``."""
    return PairView(payload(matrices, pairs, title=title)).save(path)


def from_attributions(results: Sequence[Any], *, title: str = "") -> PairView:
    """A pair view of ``PairAttribution`` results (one pair each; several methods of the same pair are shown in
    the method menu when their tokens agree)."""
    parts = []
    keys: dict[tuple, int] = {}
    for r in results:
        key = (tuple(r.tokens_a), tuple(r.tokens_b))
        pid = keys.setdefault(key, len(keys))
        parts.append(r.frame().assign(pair=pid, method=r.method, score=r.score, target=r.target, error=r.error))
    return PairView(payload(pd.concat(parts, ignore_index=True), title=title))
