"""Sentence embeddings from hooked hidden states: pooling (mean, cls, max) and the pair score (cosine, dot).

The pooling a checkpoint is meant to be used with is read from its sentence-transformers config
(``1_Pooling/config.json`` beside ``config.json``; the bundled all-MiniLM-L6-v2 says mean); a folder without one
gets mean pooling. ``embed`` reads any residual site (``blocks.{L}.hook_resid_post`` by default the last block's,
through the final LayerNorm of pre-LN families as ``model()`` returns it), so one forward pass gives the embedding
of every layer.

Shapes: ``b`` batch, ``p`` position, ``m`` d_model.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F

Pooling = Literal["mean", "cls", "max"]
Score = Literal["cosine", "dot"]
POOLINGS: tuple[str, ...] = ("mean", "cls", "max")
SCORES: tuple[str, ...] = ("cosine", "dot")


def pool(hidden: torch.Tensor, mask: torch.Tensor, how: str = "mean") -> torch.Tensor:
    """``[b, p, m], [b, p] -> [b, m]``: ``mean`` over real tokens (sentence-transformers' mean pooling: padding
    excluded), ``cls`` (position 0), ``max`` over real tokens (sentence-transformers sets padding to -1e9 first)."""
    real = mask.to(hidden.dtype)[..., None]
    if how == "mean":
        return (hidden * real).sum(1) / real.sum(1).clamp_min(1e-9)
    if how == "cls":
        return hidden[:, 0]
    if how == "max":
        return hidden.masked_fill(real == 0, -1e9).amax(1)
    raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {how!r}")


def score(x: torch.Tensor, y: torch.Tensor, kind: str = "cosine") -> torch.Tensor:
    """Pair score of embeddings ``x``, ``y`` ``[..., m] -> [...]``: ``cosine`` (default) or ``dot``."""
    if kind == "cosine":
        return F.cosine_similarity(x, y, dim=-1)
    if kind == "dot":
        return (x * y).sum(-1)
    raise ValueError(f"score must be one of {', '.join(SCORES)}, got {kind!r}")


def normalise(e: torch.Tensor, kind: str) -> torch.Tensor:
    """The vector whose dot product is the score: ``e / |e|`` for cosine, ``e`` for dot (``[..., m]``)."""
    if kind not in SCORES:
        raise ValueError(f"score must be one of {', '.join(SCORES)}, got {kind!r}")
    return F.normalize(e, dim=-1, eps=1e-12) if kind == "cosine" else e


def default_pooling(model: Any) -> str:
    """The pooling of the checkpoint's sentence-transformers config (``1_Pooling/config.json``), else ``"mean"``."""
    folder = _folder(model)
    config = folder / "1_Pooling" / "config.json" if folder is not None else None
    if config is None or not config.is_file():
        return "mean"
    modes = json.loads(config.read_text())
    for key, name in (("pooling_mode_mean_tokens", "mean"), ("pooling_mode_cls_token", "cls"),
                      ("pooling_mode_max_tokens", "max")):  # fmt: skip
        if modes.get(key):
            return name
    return "mean"


def _folder(model: Any) -> Path | None:
    files = getattr(model, "weight_files", None) or []
    return Path(files[0]).parent if files else None


def final_site(model: Any) -> str:
    """The site of the model's own output: ``blocks.{L-1}.hook_resid_post``."""
    return f"blocks.{model.config.n_layers - 1}.hook_resid_post"


@torch.inference_mode()
def embed(
    model: Any,
    texts: Sequence[str],
    *,
    pooling: str | Sequence[str] | None = None,
    sites: Sequence[str] | None = None,
    batch_size: int = 64,
) -> dict[tuple[str, str], torch.Tensor]:
    """Pooled embeddings ``{(site, pooling): [len(texts), m]}`` of ``texts``, one forward pass per batch.

    ``pooling``: one name or several (default the checkpoint's, see ``default_pooling``); ``sites``: residual
    sites (default the model's own output, ``final_site``). The last block's ``hook_resid_post`` goes through the
    final LayerNorm of pre-LN families, so ``(final_site, pooling)`` is the model's own sentence embedding. Each
    distinct text runs once (STS-B repeats sentences), sorted by length into batches (less padding); rows come back
    in input order, repeats included.
    """
    pools = [pooling or default_pooling(model)] if pooling is None or isinstance(pooling, str) else list(pooling)
    names = list(sites or [final_site(model)])
    last = final_site(model)
    distinct = list(dict.fromkeys(texts))
    row_of = {t: i for i, t in enumerate(distinct)}
    order = sorted(range(len(distinct)), key=lambda i: len(distinct[i]))
    out: dict[tuple[str, str], list[torch.Tensor]] = {(s, p): [] for s in names for p in pools}
    for start in range(0, len(order), batch_size):
        rows = [distinct[i] for i in order[start:start + batch_size]]
        enc = model.tokenize(rows)
        final, cache = model.run_with_cache(**enc, names_filter=[s for s in names if s != last])
        for site in names:
            hidden = final if site == last else cache[site]
            for how in pools:
                out[(site, how)].append(pool(hidden, enc["attention_mask"], how).float().cpu())
    back = torch.empty(len(order), dtype=torch.long)
    back[torch.tensor(order, dtype=torch.long)] = torch.arange(len(order))
    index = back[torch.tensor([row_of[t] for t in texts], dtype=torch.long)]
    return {key: torch.cat(parts)[index] for key, parts in out.items()}
