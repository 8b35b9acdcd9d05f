"""The explorer ``bertscope report`` embeds: a few corpus sentences, chosen by the user or by the run's
notable heads.

Choice (``choose``):

- ``--explore N``: the first N sentences of the run's corpus; ``--explore-ids 3,17``: those sentence indices
  (0-based, in corpus order).
- Default (``DEFAULT_SENTENCES`` sentences): where the run's notable heads are active. The notable heads are
  read from the saved tables (``notable_heads``): the same-token experiment's top duplicate-ratio heads
  (``same_token/summary``, rows ``stat == "top duplicate ratio"``, at most ``HEADS_PER_KIND``) and the heads
  experiment's best syntax heads (``heads/syntax.csv``, per-relation rows other than ``punct``/``root``, by
  held-out gain when the table has it, else gain; positive gains only). On the first ``POOL`` sentences of
  the corpus each head gets an activity per sentence (``head_activity``): a duplicate head, the mean
  attention a token with another occurrence of itself in the sentence gives to those occurrences; a syntax
  head, the mean over tokens of the largest weight on another word piece ([CLS]/[SEP] excluded). Activities
  are turned into ranks across the pool (0 = least active, 1 = most) so both kinds weigh the same; a
  sentence's score is the mean rank over the notable heads, and the highest scores are shown.

The run's corpus is the one in the experiments' manifests (``options``: corpus, max_sentences, seed); the
model is ``--model`` or, by default, the run's. When the tables or the model are unavailable, nothing is
embedded and ``ExploreChoice.message`` says why.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from bertscope.experiments import io
from bertscope.experiments.runner import MANIFEST

DEFAULT_SENTENCES = 5
POOL = 200
HEADS_PER_KIND = 3
SKIP_RELATIONS = {"ALL", "PER-RELATION", "punct", "root"}


@dataclass
class ExploreChoice:
    """What the report embeds: ``html`` (the explorer page, or None), ``message`` (one line: what was chosen
    and how, or why nothing is embedded), ``rows`` (per chosen sentence: index, id, text, score)."""

    html: str | None
    message: str
    rows: list[dict] = field(default_factory=list)


def notable_heads(out: Path) -> dict[str, list[tuple[int, int]]]:
    """``{"duplicate": [(layer, head), ...], "syntax": [...]}`` from the run's saved tables (empty lists when a
    table is missing or has no such rows)."""
    found: dict[str, list[tuple[int, int]]] = {"duplicate": [], "syntax": []}
    summary = _read(out / "same_token", "summary")
    if summary is not None and {"stat", "layer", "head"} <= set(summary.columns):
        top = summary[summary["stat"] == "top duplicate ratio"].dropna(subset=["layer", "head"])
        if "ratio" in top.columns:
            top = top.sort_values("ratio", ascending=False, kind="stable")
        found["duplicate"] = _unique(top)
    syntax = _read(out / "heads", "syntax")
    if syntax is not None and {"relation", "layer", "head"} <= set(syntax.columns):
        rows = syntax[~syntax["relation"].astype(str).isin(SKIP_RELATIONS)].dropna(subset=["layer", "head"])
        by = next((c for c in ("heldout_gain", "gain") if c in rows.columns), None)
        if by is not None:
            rows = rows[rows[by] > 0].sort_values(by, ascending=False, kind="stable")
        found["syntax"] = _unique(rows)
    return found


def head_activity(pattern: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor, special: torch.Tensor,
                  kind: str) -> np.ndarray:  # fmt: skip
    """Per sentence, how active one head is. ``pattern`` ``[batch, query, key]``; ``ids``, ``mask``, ``special``
    ``[batch, pos]``. ``kind="duplicate"``: mean over queries that have another occurrence of their token of
    the mass on those occurrences (0 without repeats); ``"syntax"``: mean over word-piece queries of the largest
    weight on another word piece. Returns ``[batch]``."""
    words = mask.bool() & ~special.bool()  # [batch, pos]
    pair = words[:, :, None] & words[:, None, :]  # [batch, query, key]
    pair &= ~torch.eye(ids.shape[1], dtype=torch.bool, device=ids.device)[None]
    if kind == "duplicate":
        pair &= ids[:, :, None] == ids[:, None, :]
        has = pair.any(-1)  # [batch, query]
        mass = (pattern * pair).sum(-1)
        n = has.sum(-1)
        return torch.where(n > 0, (mass * has).sum(-1) / n.clamp(min=1), 0.0).cpu().numpy()
    if kind == "syntax":
        top = (pattern * pair).amax(-1)  # [batch, query]
        n = words.sum(-1)
        return ((top * words).sum(-1) / n.clamp(min=1)).cpu().numpy()
    raise ValueError(f"unknown head kind {kind!r}")


def score_sentences(model, texts: list[str], heads: dict[str, list[tuple[int, int]]],
                    batch_size: int = 32) -> np.ndarray:  # fmt: skip
    """Mean over the notable heads of each head's activity rank across ``texts`` (0..1), ``[len(texts)]``."""
    special_ids = torch.tensor(sorted(set(model.tokenizer.all_special_ids)))
    per_head = {(k, lh): [] for k, hs in heads.items() for lh in hs}
    layers = sorted({layer for _, (layer, _) in per_head})
    names = [f"blocks.{layer}.attn.hook_pattern" for layer in layers]
    for start in range(0, len(texts), batch_size):
        inputs = model.tokenize(texts[start:start + batch_size])
        with torch.no_grad():
            _, cache = model.run_with_cache(
                inputs["input_ids"], attention_mask=inputs["attention_mask"],
                token_type_ids=inputs.get("token_type_ids"), names_filter=names,
            )  # fmt: skip
        ids, mask = inputs["input_ids"], inputs["attention_mask"]
        special = torch.isin(ids, special_ids.to(ids.device))
        for (kind, (layer, head)), acc in per_head.items():
            pattern = cache[f"blocks.{layer}.attn.hook_pattern"][:, head].float()
            acc.append(head_activity(pattern, ids, mask, special, kind))
    ranks = [pd.Series(np.concatenate(acc)).rank(pct=True).to_numpy() for acc in per_head.values()]
    return np.mean(ranks, axis=0)


def choose(out: Path, *, model=None, load_model=None, n: int | None = None, ids: list[int] | None = None,
           mixing: str | None = None) -> ExploreChoice:  # fmt: skip
    """The explorer for the report of ``out`` (see the module's docstring for the rule). ``model`` or
    ``load_model()`` (called only when a model is needed; may raise) gives the model. Raises ``ValueError``
    for ids outside the corpus; everything else unavailable becomes a message."""
    from bertscope.experiments.corpus import load_corpus
    from bertscope.experiments.explorer import explore

    options = run_options(out)
    if options is None:
        return ExploreChoice(None, "no explorer: no experiment manifest names the run's corpus")
    heads: dict[str, list[tuple[int, int]]] = {}
    if n is None and ids is None:
        heads = notable_heads(out)
        if not any(heads.values()):
            return ExploreChoice(None, "no explorer: no notable heads in the saved tables (same_token/summary, "
                                       "heads/syntax.csv); use --explore N or --explore-ids to choose sentences")
    try:
        corpus = load_corpus(options.get("corpus") or "builtin", max_sentences=options.get("max_sentences"),
                             seed=int(options.get("seed") or 0))  # fmt: skip
    except Exception as e:  # noqa: BLE001 - the report goes on without the explorer
        return ExploreChoice(None, f"no explorer: the run's corpus is unavailable ({type(e).__name__}: {e})")
    sentences = corpus.sentences
    if ids is not None:
        bad = [i for i in ids if not 0 <= i < len(sentences)]
        if bad:
            raise ValueError(f"--explore-ids {bad} outside the corpus (0..{len(sentences) - 1})")
    try:
        model = model if model is not None else load_model()
    except Exception as e:  # noqa: BLE001
        return ExploreChoice(None, f"no explorer: the model is unavailable ({' '.join(str(e).split())})")
    scores: dict[int, float] = {}
    if ids is not None:
        chosen, how = list(dict.fromkeys(ids)), "chosen with --explore-ids"
    elif n is not None:
        chosen, how = list(range(min(n, len(sentences)))), f"the first {min(n, len(sentences))} corpus sentences"
    else:
        pool = [s.text for s in sentences[:POOL]]
        score = score_sentences(model, pool, heads)
        chosen = [int(i) for i in np.argsort(-score, kind="stable")[:DEFAULT_SENTENCES]]
        scores = {i: float(score[i]) for i in chosen}
        named = "; ".join(f"{k} heads " + ", ".join(f"L{la}H{h}" for la, h in hs) for k, hs in heads.items() if hs)
        how = f"where the notable heads are most active among the first {len(pool)} sentences ({named})"
    texts = [sentences[i].text for i in chosen]
    view = explore(model, texts, mixing=mixing, title="bertscope explorer: corpus sentences")
    rows = [{"index": i, "id": sentences[i].id, "text": sentences[i].text, "score": scores.get(i)} for i in chosen]
    return ExploreChoice(view.html(), f"{len(chosen)} sentences, {how}", rows)


def run_options(out: Path) -> dict | None:
    """The ``options`` of the first experiment manifest under ``out`` (corpus, max_sentences, seed, model)."""
    for path in sorted(out.glob(f"*/{MANIFEST}")):
        try:
            options = io.read_json(path).get("options")
        except (OSError, ValueError):
            continue
        if isinstance(options, dict):
            return options
    return None


def parse_ids(text: str) -> list[int]:
    """``"3,17"`` -> ``[3, 17]``; ``ValueError`` otherwise."""
    if not re.fullmatch(r"\s*\d+(\s*,\s*\d+)*\s*", text):
        raise ValueError(f"--explore-ids takes sentence indices like 3,17, got {text!r}")
    return [int(t) for t in text.split(",")]


def _read(d: Path, name: str) -> pd.DataFrame | None:
    for suffix in (".parquet", ".csv"):
        p = d / (name + suffix)
        if p.is_file():
            try:
                return pd.read_parquet(p) if suffix == ".parquet" else pd.read_csv(p)
            except Exception:  # noqa: BLE001 - an unreadable table is an unavailable one
                return None
    return None


def _unique(rows: pd.DataFrame) -> list[tuple[int, int]]:
    heads = list(dict.fromkeys((int(r.layer), int(r.head)) for r in rows.itertuples()))
    return heads[:HEADS_PER_KIND]
