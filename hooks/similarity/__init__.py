"""What makes two texts similar: pairwise attribution of an embedding model's similarity score.

A subpackage of ``bertscope.hooks`` built on hooked tensors (the model never loads it); ``bertscope.similarity``
is its public name.

>>> import bertscope
>>> from bertscope import similarity
>>> model = bertscope.load()
>>> r = similarity.attribute(model, "A man plays a guitar.", "Someone is playing music.")
>>> r.matrix.shape, r.score, r.target, r.error     # [pieces of a, pieces of b]; the matrix sums to r.target
>>> r.top(3)                                       # the token pairs that made the texts close

Methods (``method=``; the one list is ``table.TABLE``, entries in ``methods``): ``integrated-jacobians``
(Moeller et al. 2023, the default), ``bilrp`` (Vasileiou and Eberle 2024), ``grad-x-input`` (pairwise),
``integrated-gradients`` (each side), ``occlusion`` (one token left out on each side), and the context-mixing
methods lifted to pairs, ``mixing:<name>`` (``lifted``). Sentence embeddings:
``embed``, ``pool``, ``score`` (``pooling``); the embedding as a sum over token x component: ``decompose``,
``shares`` (``decomposition``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bertscope.hooks.similarity import lifted as _lifted  # noqa: F401 (registers the lifted mixing methods)
from bertscope.hooks.similarity import methods as _builtin  # noqa: F401 (registers the built-in methods)
from bertscope.hooks.similarity.decomposition import Decomposition, decompose, shares
from bertscope.hooks.similarity.methods import pair_score
from bertscope.hooks.similarity.pairs import Pair, side
from bertscope.hooks.similarity.pooling import POOLINGS, SCORES, default_pooling, embed, final_site, pool, score
from bertscope.hooks.similarity.result import PairAttribution, to_words
from bertscope.hooks.similarity.table import TABLE, PairMethod, register

__all__ = [
    "POOLINGS", "SCORES", "TABLE", "Decomposition", "PairAttribution", "PairMethod", "attribute", "decompose",
    "default_pooling", "embed", "final_site", "pool", "register", "score", "shares",
]  # fmt: skip


def attribute(
    model: Any,
    a: str | Sequence[str],
    b: str | Sequence[str],
    method: str = "integrated-jacobians",
    *,
    score: str = "cosine",
    pooling: str | None = None,
    level: str = "piece",
    batch_size: int = 8,
    **options: Any,
) -> PairAttribution | list[PairAttribution]:
    """Explain the similarity of text ``a`` and text ``b`` (or of each pair of two equal-length lists) by
    ``method``; one ``PairAttribution`` per pair (a list for lists).

    ``score``: ``"cosine"`` (default) or ``"dot"`` of the pooled embeddings; ``pooling``: ``"mean"``, ``"cls"``,
    ``"max"`` (default the checkpoint's sentence-transformers config, mean for the bundled model); ``level``:
    ``"piece"`` (word pieces, special tokens included) or ``"word"`` (pieces summed into words). ``options``: the
    method's own (``TABLE[method].defaults``: ``steps``, ``layer`` ...); any other is refused. Pairs run
    ``batch_size`` at a time. Needs the model in eval mode.
    """
    from bertscope.hooks.similarity import table

    spec = table.get(method)
    unknown = sorted(set(options) - set(spec.defaults))
    if unknown:
        allowed = ", ".join(spec.defaults) or "none"
        raise ValueError(f"{method} takes no option {', '.join(unknown)} (its options: {allowed})")
    if score not in SCORES:
        raise ValueError(f"score must be one of {', '.join(SCORES)}, got {score!r}")
    if level not in ("piece", "word"):
        raise ValueError(f"level must be 'piece' or 'word', got {level!r}")
    how = pooling or default_pooling(model)
    if how not in POOLINGS:
        raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {how!r}")
    single = isinstance(a, str) and isinstance(b, str)
    texts_a, texts_b = ([a], [b]) if single else (list(a), list(b))
    if isinstance(a, str) != isinstance(b, str) or len(texts_a) != len(texts_b):
        raise ValueError("a and b must be two texts or two lists of texts of the same length")
    if model.training:
        raise RuntimeError("attribution needs the model in eval mode (dropout would randomise it): model.eval()")
    kwargs = {**spec.defaults, **options}
    specials = set(model.tokenizer.all_special_tokens) if model.tokenizer is not None else set()
    results: list[PairAttribution] = []
    for start in range(0, len(texts_a), batch_size):
        pair = Pair(side(model, texts_a[start:start + batch_size]), side(model, texts_b[start:start + batch_size]),
                    score, how)
        matrix, target, reference = spec.compute(model, pair, **kwargs)
        scores = pair_score(model, pair)
        for row in range(matrix.shape[0]):
            na, nb = pair.a.lengths[row], pair.b.lengths[row]
            m = matrix[row, :na, :nb].detach().double().cpu()
            ta, tb = pair.a.tokens[row], pair.b.tokens[row]
            if level == "word":
                m, ta, tb = to_words(m, ta, tb, specials)
            t = float(target[row])
            results.append(PairAttribution(m, ta, tb, float(scores[row]), t, float(m.sum()) - t, method, reference,
                                           level))
    return results[0] if single else results


def methods() -> tuple[str, ...]:
    """The registered pairwise methods' names."""
    return tuple(TABLE)


