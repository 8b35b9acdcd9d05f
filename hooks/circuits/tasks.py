"""Tasks as data: counterfactual pairs (clean, corrupted) of equal length in word pieces, plus a metric.

A task file is JSONL, one pair a line::

    {"clean": "the cat sat on the mat cat", "corrupted": "the cat sat on the mat the", "query": "cat"}
    {"clean": "the keys [MASK] on the table", "corrupted": "the key [MASK] on the table", "answers": ["are", "is"]}

``query`` is the third text of a relevance metric (``cosine`` / ``dot``); ``answers`` the two word pieces whose
logit difference at ``[MASK]`` is the ``mask-logit-diff`` metric. A pair whose two texts tokenise to different
lengths is refused with its line number (patching needs position i of one run to be position i of the other).

Metrics, each a :class:`Metric`: ``metric(hidden [b, p, m], attention_mask [b, p], rows [b]) -> [b]``, where
``rows`` are the pairs' indices in the task (so a metric can look up its per-pair query or answers):

- ``cosine``: ``cos(pool(hidden), pool(query))`` with ``pool`` the mean over real tokens (the bundled model's
  sentence-transformers pooling; the normalisation it adds is what the cosine does);
- ``dot``: ``<pool(hidden), pool(query)>`` (no normalisation);
- ``mask-logit-diff``: ``logit[a] - logit[b]`` of the masked-LM head at the pair's first mask token (needs an MLM
  head);
- :func:`class_logit_diff`: ``logit[c1] - logit[c2]`` of a classifier ``W pool(hidden) + b`` you pass;
- any callable with the signature above (:class:`Metric` wraps it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ..jsonl import json_objects, utf8_lines

METRICS = ("cosine", "dot", "mask-logit-diff")


class TaskError(ValueError):
    """A task that cannot be built: a bad line, unequal lengths, an unknown metric, a metric the model lacks."""


@dataclass
class Metric:
    """A scalar per pair from the final hidden states: ``fn(hidden [b, p, m], mask [b, p], rows [b]) -> [b]``."""

    fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    name: str = "callable"

    def __call__(self, hidden: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return self.fn(hidden, mask, rows)


@dataclass
class Task:
    """Counterfactual pairs, tokenised, plus a metric.

    ``clean`` / ``corrupted``: ``{"input_ids", "attention_mask"[, "token_type_ids"]}`` ``[n_pairs, pos]`` with the
    same attention mask (pairs have equal lengths); ``pairs`` the JSON records (what :meth:`write` saves).
    """

    clean: dict[str, torch.Tensor]
    corrupted: dict[str, torch.Tensor]
    metric: Metric
    pairs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def n_pairs(self) -> int:
        return int(self.clean["input_ids"].shape[0])

    @property
    def mask(self) -> torch.Tensor:
        return self.clean["attention_mask"]

    def batch(self, rows: torch.Tensor, which: str = "clean") -> dict[str, torch.Tensor]:
        """The tokenised ``which`` ("clean" | "corrupted") texts of pairs ``rows``, trimmed to their longest pair."""
        src = self.clean if which == "clean" else self.corrupted
        width = int(self.mask[rows].sum(1).max())
        return {k: v[rows, :width] for k, v in src.items()}

    def write(self, path: str | Path) -> None:
        """Write the pairs as JSONL (the format :func:`load_task` reads), atomically (a temporary file renamed)."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.partial")
        tmp.write_text("".join(json.dumps(p) + "\n" for p in self.pairs))
        os.replace(tmp, path)


def read_pairs(path: str | Path) -> list[dict[str, Any]]:
    """The JSON records of a task file, each checked to have non-empty string ``clean`` and ``corrupted``
    (`TaskError` naming the file and line otherwise: a missing file, a folder, bytes that are not UTF-8, a line that
    is not a JSON object, an empty text, no pairs)."""
    path = Path(path)
    if not path.is_file():
        raise TaskError(f"task file {path}: {'a folder, not a file' if path.is_dir() else 'no such file'}")
    pairs = []
    lines = utf8_lines(path.read_bytes(), path, TaskError)
    for i, rec in json_objects(lines, lambda i, problem: TaskError(f"{path}: line {i}: {problem}")):
        if not isinstance(rec.get("clean"), str) or not isinstance(rec.get("corrupted"), str):
            raise TaskError(f"{path}: line {i} needs string fields 'clean' and 'corrupted'")
        empty = [k for k in ("clean", "corrupted") if not rec[k].strip()]
        if empty:
            raise TaskError(f"{path}: line {i}: the {empty[0]} text is empty")
        rec["_line"] = i
        pairs.append(rec)
    if not pairs:
        raise TaskError(f"{path}: no pairs")
    return pairs


def load_task(model: Any, path: str | Path, metric: str | Metric | Callable = "cosine") -> Task:
    """Read a JSONL task file (see the module docstring) and build the :class:`Task` for ``model``."""
    return make_task(model, read_pairs(path), metric)


def make_task(model: Any, pairs: Sequence[dict[str, Any]], metric: str | Metric | Callable = "cosine") -> Task:
    """Tokenise ``pairs`` (dicts with ``clean``, ``corrupted`` and the metric's field) and build the metric.

    Raises :class:`TaskError` naming the pair's line (or index) when lengths differ, the metric is unknown, a
    field is missing, or a ``[MASK]`` metric meets a model without an MLM head."""
    if isinstance(metric, str) and metric not in METRICS:
        raise TaskError(f"unknown metric {metric!r}; choose one of {', '.join(METRICS)} (or pass a callable)")
    if metric == "mask-logit-diff" and getattr(model, "mlm_head", None) is None:
        raise TaskError("metric 'mask-logit-diff' needs a masked-LM head; this model has none (load a *ForMaskedLM "
                        "checkpoint, or use cosine/dot)")
    pairs = [dict(p) for p in pairs]
    lines = [p.pop("_line", i + 1) for i, p in enumerate(pairs)]
    clean = model.tokenize([p["clean"] for p in pairs])
    corrupted = model.tokenize([p["corrupted"] for p in pairs])
    n_clean, n_corr = clean["attention_mask"].sum(1), corrupted["attention_mask"].sum(1)
    for i in torch.nonzero(n_clean != n_corr).flatten().tolist():
        raise TaskError(
            f"pair on line {lines[i]}: clean is {int(n_clean[i])} word pieces, corrupted {int(n_corr[i])}; "
            "pairs must be of equal length")
    if isinstance(metric, Metric):
        built = metric
    elif callable(metric):
        built = Metric(metric)
    elif metric in ("cosine", "dot"):
        missing = [lines[i] for i, p in enumerate(pairs) if not isinstance(p.get("query"), str)]
        if missing:
            raise TaskError(f"metric {metric!r} needs a string 'query' on every line; missing on line {missing[0]}")
        built = pooled_similarity(model, [p["query"] for p in pairs], kind=metric)
    else:
        built = _mask_metric(model, pairs, lines, clean)
    return Task(clean=clean, corrupted=corrupted, metric=built, pairs=pairs)


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over real tokens: ``[b, p, m], [b, p] -> [b, m]`` (sentence-transformers' mean pooling)."""
    m = mask.to(hidden.dtype)[..., None]
    return (hidden * m).sum(1) / m.sum(1).clamp_min(1)


@torch.no_grad()
def pooled_similarity(model: Any, queries: Sequence[str], kind: str = "cosine", batch_size: int = 64) -> Metric:
    """``cosine`` or ``dot`` of the mean-pooled embedding with each pair's ``queries[row]`` (embedded once, by the
    unmodified model)."""
    embs = []
    for i in range(0, len(queries), batch_size):
        enc = model.tokenize(list(queries[i:i + batch_size]))
        embs.append(mean_pool(model(**enc), enc["attention_mask"]))
    ref = torch.cat(embs)

    def fn(hidden: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        pooled = mean_pool(hidden, mask)
        q = ref[rows].to(pooled.dtype)
        return F.cosine_similarity(pooled, q, dim=-1) if kind == "cosine" else (pooled * q).sum(-1)

    return Metric(fn, kind)


def _mask_metric(model: Any, pairs: list[dict], lines: list[int], clean: dict[str, torch.Tensor]) -> Metric:
    mask_id = model.special_token_ids.get("mask")
    if mask_id is None:
        raise TaskError("metric 'mask-logit-diff' needs a tokenizer with a mask token")
    answers, positions = [], []
    for i, p in enumerate(pairs):
        ans = p.get("answers")
        if not (isinstance(ans, list) and len(ans) == 2 and all(isinstance(a, str) for a in ans)):
            raise TaskError(f"metric 'mask-logit-diff' needs 'answers': [a, b] on every line; line {lines[i]}")
        ids = [model.tokenizer(a, add_special_tokens=False)["input_ids"] for a in ans]
        if any(len(t) != 1 for t in ids):
            raise TaskError(f"line {lines[i]}: each answer must be one word piece, got {ans}")
        where = torch.nonzero(clean["input_ids"][i] == mask_id).flatten()
        if len(where) == 0:
            raise TaskError(f"line {lines[i]}: the clean text has no mask token")
        answers.append([ids[0][0], ids[1][0]])
        positions.append(int(where[0]))
    return mask_logit_diff(model, torch.tensor(answers), torch.tensor(positions))


def mask_logit_diff(model: Any, answers: torch.Tensor, positions: torch.Tensor) -> Metric:
    """``logit[answers[row, 0]] - logit[answers[row, 1]]`` of the MLM head at ``positions[row]``."""

    def fn(hidden: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        at = hidden[torch.arange(hidden.shape[0], device=hidden.device), positions.to(hidden.device)[rows]]
        logits = model.mlm_logits(at[:, None])[:, 0]
        a = answers.to(hidden.device)[rows]
        return logits.gather(-1, a[:, :1])[:, 0] - logits.gather(-1, a[:, 1:])[:, 0]

    return Metric(fn, "mask-logit-diff")


def class_logit_diff(weight: torch.Tensor, bias: torch.Tensor | None, classes: tuple[int, int],
                     pooling: str = "cls") -> Metric:
    """``logit[c1] - logit[c2]`` of a classifier ``weight [n_classes, m] @ pool(hidden) + bias``; ``pooling``
    ``"cls"`` (first token) or ``"mean"`` (mean over real tokens)."""

    def fn(hidden: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        pooled = hidden[:, 0] if pooling == "cls" else mean_pool(hidden, mask)
        logits = F.linear(pooled, weight.to(pooled.dtype), None if bias is None else bias.to(pooled.dtype))
        return logits[:, classes[0]] - logits[:, classes[1]]

    return Metric(fn, "class-logit-diff")
