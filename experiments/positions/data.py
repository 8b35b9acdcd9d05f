"""Inputs of the positions experiment: which sites, which sequences, and the activations at each site.

Position must not be confounded with sentence length, so the main data are **fixed-length windows** cut
from the corpus's token stream: the sentences are tokenized (no special tokens), concatenated in corpus
order and cut into consecutive, non-overlapping windows of ``window_len`` word pieces; each window is fed
as ``[CLS] w_0 .. w_{P-1} [SEP]``, so every content position 1..P holds exactly one token per window.
Natural sentences (``[CLS] sentence [SEP]``) are the second design. A *shuffled* copy permutes the content
pieces inside each sequence (same tokens, same position ids, [CLS]/[SEP] kept in place).

>>> seqs = make_windows(corpus, tokenizer, window_len=32, max_windows=128, seed=0)
>>> acts = collect(model, seqs, position_sites(model.config.n_layers), batch_size=32)
>>> acts.feats["blocks.3.hook_resid_post"].shape      # [n_tokens, d_model]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from bertscope.hooks.sites import BLOCK_COMPONENTS, site_layer  # noqa: F401 (one vocabulary; re-exported)
from bertscope.hooks.sites import EMBED_COMPONENTS as _EMBED_SITES

#: Token kinds in `Activations.kind`.
CONTENT, CLS, SEP = 0, 1, 2


# ------------------------------------------------------------------------------------------------- sites


def position_sites(n_layers: int) -> list[str]:
    """Every site the experiment probes, in forward order: ``embed.hook_word`` (token only),
    ``embed.hook_out``, then per block ``hook_attn_out``, ``hook_resid_mid``, ``hook_mlp_out``,
    ``hook_resid_post``."""
    sites = list(_EMBED_SITES)
    for layer in range(n_layers):
        sites += [f"blocks.{layer}.hook_{c}" for c in BLOCK_COMPONENTS]
    return sites


def main_sites(n_layers: int) -> list[str]:
    """The residual-stream sites (word, embeddings, each block's output) used by the costlier analyses."""
    return list(_EMBED_SITES) + [f"blocks.{layer}.hook_resid_post" for layer in range(n_layers)]


# -------------------------------------------------------------------------------------------- sequences


@dataclass(frozen=True)
class Sequences:
    """Token sequences, each ``[CLS] content [SEP]`` as a 1-D int64 array (lengths may differ).

    ``groups[i]`` is the id of sequence i for grouped splits (its window or sentence). ``design`` is
    ``"windows"`` or ``"sentences"``; ``shuffled`` says whether the content pieces were permuted.
    """

    ids: tuple[np.ndarray, ...]
    groups: np.ndarray  # [n_seq] int
    design: str
    shuffled: bool = False

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def lengths(self) -> np.ndarray:
        """``[n_seq]`` lengths including [CLS] and [SEP]."""
        return np.array([len(s) for s in self.ids], dtype=np.int64)


def make_windows(
    corpus: Any,
    tokenizer: Any,
    window_len: int,
    *,
    max_windows: int | None = None,
    seed: int = 0,
) -> Sequences:
    """Cut the corpus's word-piece stream into windows of ``window_len`` pieces: ``[CLS] w [SEP]`` each.

    Sentences are tokenized without special tokens and concatenated in corpus order; the stream is cut into
    consecutive non-overlapping windows (the incomplete tail is dropped). With ``max_windows``, a seeded
    random subset of that many windows is kept (in stream order). Raises ``ValueError`` if the corpus gives
    fewer than 2 windows.
    """
    if window_len < 2:
        raise ValueError(f"window_len must be >= 2, got {window_len}")
    texts = [s.text for s in corpus]
    if not texts:
        raise ValueError("the corpus has no sentences; positions needs text to cut windows from")
    pieces = tokenizer(texts, add_special_tokens=False)["input_ids"]
    stream = np.fromiter((t for sent in pieces for t in sent), dtype=np.int64)
    n_windows = len(stream) // window_len
    if n_windows < 2:
        raise ValueError(
            f"the corpus has {len(stream)} word pieces, fewer than 2 windows of {window_len}; "
            "use a larger corpus or a smaller window length"
        )
    chosen = np.arange(n_windows)
    if max_windows is not None and max_windows < n_windows:
        chosen = np.sort(np.random.default_rng(seed).choice(n_windows, size=max_windows, replace=False))
    cls, sep = _special_ids(tokenizer)
    ids = tuple(
        np.concatenate([[cls], stream[w * window_len : (w + 1) * window_len], [sep]]).astype(np.int64)
        for w in chosen
    )
    return Sequences(ids=ids, groups=chosen.astype(np.int64), design="windows")


def subset(seqs: Sequences, index: Sequence[int] | np.ndarray) -> Sequences:
    """The sequences at ``index`` (in that order), with their groups."""
    index = np.asarray(index, dtype=np.int64)
    return replace(seqs, ids=tuple(seqs.ids[i] for i in index), groups=seqs.groups[index])


def sentences_from_encoded(encoded: Iterable[Any]) -> Sequences:
    """Natural sentences from ``experiments.corpus.encode`` batches: one sequence per sentence (its real
    tokens, ``[CLS] .. [SEP]``), grouped by ``sentence_index``, in sentence-index order."""
    by_sentence: dict[int, np.ndarray] = {}
    for batch in encoded:
        ids, mask = batch.input_ids, batch.attention_mask.bool()
        for row, sent in enumerate(batch.sentence_index):
            by_sentence[int(sent)] = ids[row][mask[row]].cpu().numpy().astype(np.int64)
    if not by_sentence:
        raise ValueError("no sentences were encoded; the corpus is empty")
    order = sorted(by_sentence)
    return Sequences(
        ids=tuple(by_sentence[i] for i in order), groups=np.array(order, dtype=np.int64), design="sentences"
    )


def shuffle_content(seqs: Sequences, seed: int = 0) -> Sequences:
    """Permute the content pieces of every sequence (seeded); [CLS] and [SEP] stay first and last, so the
    tokens and the position ids are the same and only word order changes."""
    rng = np.random.default_rng(seed)
    out = []
    for s in seqs.ids:
        s = s.copy()
        s[1:-1] = s[1:-1][rng.permutation(len(s) - 2)]
        out.append(s)
    return replace(seqs, ids=tuple(out), shuffled=True)


# ------------------------------------------------------------------------------------------ activations


@dataclass
class Activations:
    """Activations of every real token at the chosen sites, flattened over sequences.

    Arrays are ``[n_tokens]``: ``seq`` (index into the sequences), ``group`` (its window/sentence id),
    ``pos`` (position id; [CLS] is 0), ``token`` (token id), ``kind`` (CONTENT / CLS / SEP), ``length``
    (its sequence's length with specials). ``feats[site]`` is ``[n_tokens, d_model]`` float32.
    Tokens are ordered by sequence, then position.
    """

    seq: np.ndarray
    group: np.ndarray
    pos: np.ndarray
    token: np.ndarray
    kind: np.ndarray
    length: np.ndarray
    feats: dict[str, np.ndarray]

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Flat dict of arrays (``feats/<site>`` for the features), for an ``.npz`` step cache."""
        fields = {k: getattr(self, k) for k in ("seq", "group", "pos", "token", "kind", "length")}
        return {**fields, **{f"feats/{site}": x for site, x in self.feats.items()}}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> Activations:
        """Inverse of :meth:`to_arrays`."""
        feats = {k.removeprefix("feats/"): v for k, v in arrays.items() if k.startswith("feats/")}
        fields = {k: v for k, v in arrays.items() if not k.startswith("feats/")}
        return cls(**fields, feats=feats)

    def content_grid(self, site: str) -> np.ndarray:
        """``[n_seq, window_len, d_model]`` content activations of equal-length sequences (windows)."""
        sel = self.kind == CONTENT
        lengths = np.unique(self.length[sel])
        if len(lengths) != 1:
            raise ValueError("content_grid needs sequences of one length (windows), got several lengths")
        n_seq = len(np.unique(self.seq[sel]))
        return self.feats[site][sel].reshape(n_seq, int(lengths[0]) - 2, -1)


def collect(
    model: Any,
    seqs: Sequences,
    sites: Sequence[str],
    *,
    batch_size: int = 32,
    fwd_hooks: Sequence[tuple[Any, Any]] = (),
    capture: Any = None,
    name: str | None = None,
    max_length: int | None = None,
) -> Activations:
    """The activations of ``seqs`` at ``sites``, through the activations stage (`experiments.activations`).

    Sequences are batched by length (stable; ``batch_size`` each, padding masked), one forward per batch with
    ``fwd_hooks`` applied (e.g. zeroing ``embed.hook_pos``), or read from ``capture`` (a `CaptureSource` made
    by `positions.capture.capture_positions`); the result is in sequence order. ``name`` names the sequence
    set in a capture (ids ``"{name}:{group}"``; default ``design``, ``_shuffled`` when shuffled);
    ``max_length`` is what a capture must have been made with (default the longest sequence)."""
    from bertscope.experiments.activations import iter_activations

    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    max_len = int(seqs.lengths.max())
    if max_len > model.config.max_length:
        raise ValueError(
            f"a sequence has {max_len} tokens, more than the model's {model.config.max_length} positions"
        )
    sentences, encoded = encode_windows(seqs, model.config.pad_token_id, batch_size=batch_size, name=name,
                                        max_length=max_length)  # fmt: skip
    parts: dict[str, list[np.ndarray]] = {s: [] for s in sites}
    seq_parts, pos_parts = [], []
    for acts in iter_activations(model, sentences, list(sites), encoded=encoded, capture=capture,
                                 fwd_hooks=fwd_hooks):  # fmt: skip
        keep = acts.keep()
        for s in sites:
            parts[s].append(acts.flat(s).float().cpu().numpy())
        r_idx, p_idx = keep.nonzero(as_tuple=True)
        seq_parts.append(np.asarray(acts.batch.sentence_index)[r_idx.numpy()])
        pos_parts.append(p_idx.numpy())
    seq = np.concatenate(seq_parts)
    pos = np.concatenate(pos_parts)
    perm = np.lexsort((pos, seq))  # back to sequence order, then position
    seq, pos = seq[perm], pos[perm]
    length = seqs.lengths[seq]
    token = np.concatenate(seqs.ids)  # every real token, in sequence order then position, like seq/pos
    kind = np.full(len(seq), CONTENT, dtype=np.int64)
    kind[pos == 0] = CLS
    kind[pos == length - 1] = SEP
    feats = {s: np.concatenate(parts[s])[perm] for s in sites}
    return Activations(seq=seq, group=seqs.groups[seq], pos=pos, token=token, kind=kind, length=length, feats=feats)


def encode_windows(seqs: Sequences, pad_token_id: int, *, batch_size: int = 32, name: str | None = None,
                   max_length: int | None = None) -> tuple[list[Any], Any]:  # fmt: skip
    """``seqs`` as the activations stage's input (`activations.encode_sequences`): sequences ordered by length
    (stable) in batches of ``batch_size``, ids ``"{name}:{group}"`` (the names a capture holds them under)."""
    from bertscope.experiments.activations import encode_sequences

    name = name or (f"{seqs.design}_shuffled" if seqs.shuffled else seqs.design)
    order = np.argsort(seqs.lengths, kind="stable")
    return encode_sequences(seqs.ids, pad_token_id=pad_token_id, ids=[f"{name}:{int(g)}" for g in seqs.groups],
                            batch_size=batch_size, order=order, max_length=max_length)  # fmt: skip


# ------------------------------------------------------------------------------------------------- helpers


def _special_ids(tokenizer: Any) -> tuple[int, int]:
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    if cls is None or sep is None:
        raise ValueError("the tokenizer has no [CLS]/[SEP] token ids; positions needs a BERT-style tokenizer")
    return int(cls), int(sep)
