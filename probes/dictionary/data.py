"""Activation batches in, shuffled training batches out, with memory bounded by a buffer.

A source is any iterable of batch-like objects, read by duck typing: the activations stage's batches
(``bertscope.experiments.activations.ActivationBatch``, the one batch type: ``flat(site)``, ``rows()``,
``token_class``; a source may carry ``token_pieces``, the piece-class table :func:`stage_classes` refines real
tokens with), plain rows (anything with ``acts`` site -> ``[rows, d]`` and ``classes()``, e.g. :func:`plain_rows`),
dicts site -> tensor, or plain tensors ``[rows, d]``: rows of one or several sites, aligned, with each row's token
class. The trainer reads it through a
:class:`RowReader` (exact row counts, resumable by skipping rows) into a :class:`ShuffleBuffer` that mixes rows
across sentences and batches.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

#: Token classes the trainer leaves out unless told otherwise: [CLS]/[SEP]/<s>/</s> and padding.
SPECIAL_CLASSES = ("special", "pad")
#: The class plain tensors (no metadata) are given.
DEFAULT_CLASS = "token"


@dataclass
class _Rows:
    """Plain rows of activations at one or several sites, aligned row by row (the trainer's internal form of a
    source item; build one with :func:`plain_rows`; ``ActivationBatch`` is its old public name).

    ``acts``: site name -> ``[rows, d_site]``; ``token_class``: ``[rows]`` class names (e.g. ``"word"``,
    ``"continuation"``, ``"punct"``, ``"special"``, ``"pad"``); ``sentence``: ``[rows]`` sentence index (optional,
    for held-out splits and per-sentence statistics).
    """

    acts: dict[str, torch.Tensor]
    token_class: Sequence[str] | np.ndarray | None = None
    sentence: np.ndarray | torch.Tensor | None = None

    def __post_init__(self) -> None:
        sizes = {name: int(t.shape[0]) for name, t in self.acts.items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"sites hold different row counts: {sizes}")
        for name, t in self.acts.items():
            if t.dim() != 2:
                raise ValueError(f"site {name!r}: activations must be [rows, d], got {tuple(t.shape)}")
        if self.token_class is not None and len(self.token_class) != self.n_rows:
            raise ValueError(f"token_class has {len(self.token_class)} entries for {self.n_rows} rows")

    @property
    def n_rows(self) -> int:
        """Rows in the batch."""
        return int(next(iter(self.acts.values())).shape[0]) if self.acts else 0

    def classes(self) -> np.ndarray:
        """Token class per row ``[rows]`` (``DEFAULT_CLASS`` where the batch carries none)."""
        if self.token_class is None:
            return np.full(self.n_rows, DEFAULT_CLASS, dtype=object)
        return np.asarray(self.token_class, dtype=object)


def plain_rows(acts: Mapping[str, torch.Tensor], token_class: Sequence[str] | np.ndarray | None = None,
               sentence: np.ndarray | torch.Tensor | None = None) -> _Rows:
    """Rows without a model: ``acts`` site -> ``[rows, d_site]`` (aligned), optional ``token_class`` ``[rows]``
    (e.g. ``"word"``, ``"special"``; special ones are left out of training) and ``sentence`` ``[rows]``."""
    return _Rows(dict(acts), token_class, sentence)


#: The old public name of the plain-rows container (``bertscope.probes.dictionary.ActivationBatch``; kept
#: importable). The one activation batch is the activations stage's; prefer :func:`plain_rows` for plain rows.
ActivationBatch = _Rows

#: the activations stage's class of a real token (its vocabulary: real, cls, sep, padding)
STAGE_REAL = "real"


def stage_classes(batch: Any, pieces: np.ndarray | None = None) -> np.ndarray:
    """The dictionary's token class of each row of an activations-stage batch (duck typed: ``rows()`` with
    ``token_class`` in the stage's one vocabulary and ``token_id``), ``[rows]``: a real token is its piece's class
    (``pieces [vocab]``, :func:`~.evaluate.piece_classes`: ``word`` / ``continuation`` / ``punct``; ``word``
    without a table), [CLS]/[SEP]-like tokens are ``special``. The one place the finer classes are derived."""
    rows = batch.rows()
    real = rows["token_class"].to_numpy() == STAGE_REAL
    out = np.where(real, "word", "special").astype(object)
    if pieces is not None:
        out[real] = pieces[rows["token_id"].to_numpy()[real]]
    return out


def is_stage_batch(item: Any) -> bool:
    """Whether ``item`` is an activations-stage batch (``flat(site)``, ``rows()``, ``token_class``)."""
    return callable(getattr(item, "flat", None)) and callable(getattr(item, "rows", None)) \
        and hasattr(item, "token_class")


def is_plain_rows(item: Any) -> bool:
    """Whether ``item`` is plain rows (``acts`` site -> tensor and ``classes()``), by duck typing."""
    return isinstance(getattr(item, "acts", None), Mapping) and callable(getattr(item, "classes", None))


def as_batch(item: Any, site: str | None, pieces: np.ndarray | None = None) -> _Rows:
    """Wrap a source item as rows: plain rows (:func:`is_plain_rows`) as they are; an activations-stage batch
    (read by duck typing: ``flat(site)`` for each of its ``sites``, classes by :func:`stage_classes` with
    ``pieces``, sentences from ``rows()``); a dict site -> tensor; or a plain tensor (which needs ``site``, the one
    site the caller trains)."""
    if is_plain_rows(item):
        return item
    if is_stage_batch(item):
        sites = list(getattr(item, "sites", None) or item.tensors)
        return _Rows({s: item.flat(s) for s in sites}, stage_classes(item, pieces),
                               item.rows()["sentence_index"].to_numpy())
    if isinstance(item, torch.Tensor):
        if site is None:
            raise ValueError("a plain tensor source feeds one site only: train one dictionary, or yield dicts")
        return _Rows({site: item})
    if isinstance(item, Mapping):
        return _Rows(dict(item))
    raise TypeError(f"a source yields activations-stage batches, plain rows, dicts site -> tensor or "
                    f"tensors; got {type(item).__name__}")


class RowReader:
    """Reads exactly ``n`` kept rows at a time from a source, dropping rows of excluded token classes.

    ``sites``: the sites to keep; ``exclude``: token classes dropped before anything else sees them (default
    special tokens and padding). When a re-iterable source (a list, a :class:`ReplayableSource`, anything whose
    ``iter()`` starts again) runs out it is read again from the start (``epochs`` counts passes); a one-shot
    iterator ends the stream. ``skip(n)`` drops ``n`` kept rows (resuming from a checkpoint).
    """

    def __init__(self, source: Iterable, sites: Sequence[str], *, exclude: Sequence[str] = SPECIAL_CLASSES,
                 single_site: str | None = None, repeat: bool = True) -> None:
        self.source = source
        self.sites = list(sites)
        self.exclude = set(exclude)
        self.single_site = single_site
        self.pieces = getattr(source, "token_pieces", None)  # a stage source's piece classes (stage_classes)
        self.repeat = repeat and not isinstance(source, Iterator)
        self.epochs = 0
        self.rows_read = 0
        self.class_names: list[str] = []
        self._it: Iterator | None = None
        self._pending: list[tuple[dict[str, torch.Tensor], torch.Tensor]] = []
        self._pending_rows = 0
        self._exhausted = False
        self._empty_epoch = True
        self._stop_at_epoch_end = False

    def _next_item(self) -> _Rows | None:
        while True:
            if self._it is None:
                self._it = iter(self.source)
                self._empty_epoch = True
            try:
                item = next(self._it)
                self._empty_epoch = False
                return as_batch(item, self.single_site, self.pieces)
            except StopIteration:
                self.epochs += 1
                self._it = None
                if not self.repeat or self._empty_epoch:
                    self._exhausted = True
                    return None
                if self._stop_at_epoch_end:
                    return None

    def _class_codes(self, classes: np.ndarray) -> torch.Tensor:
        names, inverse = np.unique(np.asarray(classes, dtype=str), return_inverse=True)
        for name in names:
            if name not in self.class_names:
                self.class_names.append(str(name))
        lookup = np.array([self.class_names.index(name) for name in names], dtype=np.int64)
        return torch.from_numpy(lookup[inverse.reshape(-1)])

    def _fill(self, n: int) -> None:
        while self._pending_rows < n and not self._exhausted:
            batch = self._next_item()
            if batch is None:
                break
            missing = [s for s in self.sites if s not in batch.acts]
            if missing:
                raise KeyError(f"the source has no activations for site(s) {missing}; it holds {sorted(batch.acts)}")
            classes = batch.classes()
            keep = ~np.isin(np.asarray(classes, dtype=str), sorted(self.exclude))
            if not keep.any():
                continue
            idx = torch.from_numpy(np.flatnonzero(keep))
            acts = {s: batch.acts[s].detach().to("cpu")[idx] for s in self.sites}
            self._pending.append((acts, self._class_codes(classes[keep])))
            self._pending_rows += int(keep.sum())

    def take(self, n: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Up to ``n`` kept rows: (site -> ``[rows, d]``, class codes ``[rows]``); fewer only at the end."""
        self._fill(n)
        if not self._pending:
            return {s: torch.empty(0) for s in self.sites}, torch.empty(0, dtype=torch.int64)
        acts = {s: torch.cat([p[0][s] for p in self._pending]) for s in self.sites}
        codes = torch.cat([p[1] for p in self._pending])
        n = min(n, int(codes.shape[0]))
        rest = {s: t[n:] for s, t in acts.items()}
        self._pending = [(rest, codes[n:])] if codes.shape[0] > n else []
        self._pending_rows = int(codes.shape[0]) - n
        self.rows_read += n
        return {s: t[:n] for s, t in acts.items()}, codes[:n]

    def read_whole(self, limit: int) -> tuple[dict[str, torch.Tensor], torch.Tensor] | None:
        """The whole source in memory, when it is re-iterable and its first pass holds at most ``limit`` kept
        rows: (site -> ``[rows, d]``, class codes ``[rows]``), read once (one pass of the model, one read of a
        capture). None otherwise; then what was read stays pending, so streaming goes on from the same rows."""
        if not self.repeat or self.rows_read or self.epochs:
            return None
        self._stop_at_epoch_end = True
        try:
            self._fill(limit + 1)
        finally:
            self._stop_at_epoch_end = False
        if self.epochs != 1 or self._pending_rows > limit or self._pending_rows == 0:
            return None
        return self.take(self._pending_rows)

    def skip(self, n: int) -> None:
        """Drop ``n`` kept rows (the rows a checkpointed run had already read)."""
        while n > 0:
            got = self.take(min(n, 1 << 16))[1].shape[0]
            if got == 0:
                raise ValueError("the source ended before the checkpoint's position: it is not the same source")
            n -= got


class ShuffleBuffer:
    """A fixed-capacity mixing buffer (SAELens's ``mixing_buffer``): fill to ``capacity`` rows, shuffle with a
    generator seeded by ``(seed, round)``, hand out the first half in batches, keep the second half, refill.

    Memory: at most ``capacity`` rows of every site (plus what the reader holds of one source batch), whatever
    the source's size. ``state()`` / ``load_state`` save and restore the kept half (checkpoints at round ends).
    """

    def __init__(self, reader: RowReader, capacity: int, batch_size: int, seed: int) -> None:
        if capacity < 2 * batch_size:
            raise ValueError(f"buffer capacity {capacity} must hold at least two batches of {batch_size} rows")
        self.reader = reader
        self.capacity = capacity
        self.batch_size = batch_size
        self.seed = seed
        self.round = 0
        self.kept: tuple[dict[str, torch.Tensor], torch.Tensor] | None = None
        self.max_rows = 0

    def fill(self) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """The full buffer before shuffling (the first fill is also what normalisation and ``b_dec`` are
        estimated from)."""
        held = 0 if self.kept is None else int(self.kept[1].shape[0])
        new_acts, new_codes = self.reader.take(self.capacity - held)
        if self.kept is None:
            acts, codes = new_acts, new_codes
        else:
            acts = {s: torch.cat([self.kept[0][s], new_acts[s]]) for s in new_acts}
            codes = torch.cat([self.kept[1], new_codes])
        self.kept = (acts, codes)
        self.max_rows = max(self.max_rows, int(codes.shape[0]))
        return acts, codes

    def next_round(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        """One round: batches of ``batch_size`` rows (the shuffled first half of a full buffer; everything left,
        in whole batches, once the source has ended). Empty when nothing is left."""
        acts, codes = self.fill()
        n = int(codes.shape[0])
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.round)
        perm = torch.randperm(n, generator=gen)
        ended = n < self.capacity
        n_out = n if ended else self.capacity // 2
        n_out -= n_out % self.batch_size
        out, keep = perm[:n_out], perm[n_out:]
        self.kept = None if ended else ({s: t[keep] for s, t in acts.items()}, codes[keep])
        self.round += 1
        for start in range(0, n_out, self.batch_size):
            idx = out[start : start + self.batch_size]
            yield {s: t[idx] for s, t in acts.items()}, codes[idx]

    def state(self) -> dict:
        """What a checkpoint keeps of the buffer: the kept half and the round counter."""
        return {"round": self.round, "kept": self.kept}

    def load_state(self, state: dict) -> None:
        """Restore ``state()``."""
        self.round = state["round"]
        self.kept = state["kept"]


class EpochBuffer:
    """The whole corpus held in memory (it fits the buffer): each round is one epoch, every row once in a fresh
    order drawn from a generator seeded by ``(seed, round)``, in whole batches (the last ``rows % batch_size``
    rows of each order wait for another epoch). The same interface as :class:`ShuffleBuffer`; the source is read
    once, however many epochs training takes."""

    def __init__(self, rows: tuple[dict[str, torch.Tensor], torch.Tensor], batch_size: int, seed: int) -> None:
        self.rows = rows
        self.batch_size = batch_size
        self.seed = seed
        self.round = 0
        self.max_rows = int(rows[1].shape[0])

    @property
    def n_rows(self) -> int:
        """Unique rows held (the corpus's kept tokens)."""
        return self.max_rows

    def fill(self) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Every row, in source order (what normalisation and ``b_dec`` are estimated from)."""
        return self.rows

    def next_round(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        """One epoch: batches of ``batch_size`` rows in a fresh shuffled order."""
        acts, codes = self.rows
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.round)
        perm = torch.randperm(self.n_rows, generator=gen)
        self.round += 1
        for start in range(0, self.n_rows - self.batch_size + 1, self.batch_size):
            idx = perm[start : start + self.batch_size]
            yield {s: t[idx] for s, t in acts.items()}, codes[idx]

    def state(self) -> dict:
        """What a checkpoint keeps: the epoch counter (the rows are read again from the source on resume)."""
        return {"round": self.round, "kept": None, "whole": True}

    def load_state(self, state: dict) -> None:
        """Restore ``state()``."""
        self.round = state["round"]
