"""The activations stage: the activations at named sites for a whole corpus, batch by batch, with a row table
saying which sentence, position, word and token each row is; from a forward pass or from a capture folder.

    for acts in iter_activations(model, corpus, "blocks.*.hook_resid_post"):
        x = acts["blocks.3.hook_resid_post"]        # [batch, pos, d_model], padding rows zero
        rows = acts.rows()                           # one row per token: sentence_index, position, word_index, ...
        flat = acts.flat("blocks.3.hook_resid_post")  # [rows, d_model], in rows()'s order

    # the same rows, in the same order, with the same numbers, read from `bertscope capture --out acts`:
    for acts in iter_activations(model, corpus, "blocks.*.hook_resid_post", capture="acts"):
        ...

**Batches** are those of ``corpus.encode`` (longest sentence first, ``batch_size`` sentences each), whichever
source the numbers come from; ``acts.batch`` is that `Batch` (``input_ids``, ``attention_mask``, ``word_ids``
``[batch, pos]``, ``sentence_index``). Memory: one batch of activations at a time (a capture is read by row
slices, never a whole shard).

**Layouts.** Token sites (``hook_resid_post``, ``attn.hook_z``, ...) are ``[batch, pos, ...]``; attention
sites (``hook_pattern``, ``hook_scores``) ``[batch, head, query, key]`` as the model's hooks give them. Padding
rows (and padding keys) hold 0 from either source. With ``pool="word"``, word pieces are mean-pooled into words
(`corpus.word_pool`, all token sites of one shape in one call per sentence): token sites become
``[batch, word, ...]`` and attention sites ``[batch, head, word,
word]`` (`corpus.word_attention`: mass to a word summed over its pieces, from a word averaged), words past a
sentence's last hold 0.

**Token classes** (``acts.token_class``, ``[batch, pos]``): ``REAL`` (a word piece), ``CLS`` (a special token
before the first word: [CLS], <s>), ``SEP`` (a special token after a word: [SEP], </s>), ``PADDING``.

**From a capture** (``capture=FOLDER``, the format of `experiments.capture`, read as is): the sentences are
found by their id and text, so a capture of a larger corpus serves any of its sentences; the capture must hold
the sites, have the same ``max_length``, dtype and token ids, and (when its index records one) the same model
weights, else `CaptureError` says which. Numbers equal a forward's when the capture was made with the same
``batch_size`` and sites over the same sentences (caching ``hook_pattern`` switches attention to the explicit
path, a float rounding difference of about 1e-6; another batch size, or a subset of the capture's sentences,
is batched with other padding, also rounding only).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from bertscope.experiments.capture.layout import SENTENCES, CaptureError, patterns, select_hooks
from bertscope.experiments.capture.load import read_index, select_stored
from bertscope.experiments.capture.plan import last_layer_needed
from bertscope.experiments.corpus import Batch, Corpus, Encoded, Sentence, encode, word_attention, word_pool
from bertscope.hooks.sites import is_attention_site
from einops import rearrange

REAL, CLS, SEP, PADDING = 0, 1, 2, 3
TOKEN_CLASSES = ("real", "cls", "sep", "padding")  # names of the token classes, by value
POOLS = ("token", "word")

__all__ = [
    "CLS", "PADDING", "POOLS", "REAL", "SEP", "TOKEN_CLASSES", "ActivationBatch", "CaptureSource", "batch_activations",
    "encode_sequences", "first_pieces", "is_attention", "iter_activations", "last_layer_needed", "open_capture",
    "pool_words",
    "resolve_sites", "run_batch", "token_classes",
]  # fmt: skip


@dataclass
class ActivationBatch:
    """One batch of activations: ``tensors`` ``{site: [batch, pos, ...]}`` (see the module docstring for
    attention sites and ``pool="word"``), the encoded ``batch`` they belong to (on the CPU), and
    ``token_class`` ``[batch, pos]`` (``REAL``, ``CLS``, ``SEP``, ``PADDING``)."""

    batch: Batch
    tensors: dict[str, torch.Tensor]
    token_class: torch.Tensor
    pool: str = "token"
    include_special: bool = True

    def __getitem__(self, site: str) -> torch.Tensor:
        return self.tensors[site]

    @property
    def sites(self) -> list[str]:
        """The site names, in forward order."""
        return list(self.tensors)

    def keep(self) -> torch.Tensor:
        """``[batch, pos]`` (``[batch, word]`` when word-pooled) bool: the rows `rows` and `flat` hold: real
        tokens, plus [CLS]/[SEP]-like ones when ``include_special``; never padding."""
        if self.pool == "word":
            n_words = torch.tensor(self.batch.n_words)
            return torch.arange(int(n_words.max()))[None, :] < n_words[:, None]
        keep = self.token_class != PADDING
        return keep if self.include_special else keep & (self.token_class == REAL)

    def rows(self) -> pd.DataFrame:
        """One row per kept token (row-major: sentence by sentence in batch order, then position):
        ``sentence_index`` (into the corpus given), ``position`` (word piece, 0 = first), ``word_index`` (-1
        for special tokens), ``token_id``, ``token_type`` and ``token_class`` (a name of `TOKEN_CLASSES`).
        Word-pooled: one row per word, ``position`` and ``token_id`` of its first piece."""
        b = self.batch
        if self.pool == "word":
            keep = self.keep()
            sentence, word = torch.nonzero(keep, as_tuple=True)
            first = first_pieces(b.word_ids, keep.shape[1])  # [batch, word]
            position = first[sentence, word]
            return pd.DataFrame({
                "sentence_index": np.asarray(b.sentence_index)[sentence.numpy()], "position": position.numpy(),
                "word_index": word.numpy(), "token_id": b.input_ids[sentence, position].numpy(),
                "token_type": b.token_type_ids[sentence, position].numpy(), "token_class": TOKEN_CLASSES[REAL],
            })  # fmt: skip
        sentence, position = torch.nonzero(self.keep(), as_tuple=True)
        return pd.DataFrame({
            "sentence_index": np.asarray(b.sentence_index)[sentence.numpy()], "position": position.numpy(),
            "word_index": b.word_ids[sentence, position].numpy(), "token_id": b.input_ids[sentence, position].numpy(),
            "token_type": b.token_type_ids[sentence, position].numpy(),
            "token_class": np.asarray(TOKEN_CLASSES)[self.token_class[sentence, position].numpy()],
        })  # fmt: skip

    def flat(self, site: str) -> torch.Tensor:
        """The site's rows in `rows`'s order: ``[rows, ...]`` for token sites, ``[rows, head, key]`` for
        attention sites (one row per query; keys are the batch's positions, or words when word-pooled)."""
        t = self.tensors[site]
        if is_attention(site):
            t = rearrange(t, "b h q k -> b q h k")
        keep = self.keep().to(t.device)
        return t[keep]


def iter_activations(
    model: Any,
    corpus_or_texts: Corpus | Sequence[Sentence] | Sequence[str],
    sites: str | Sequence[str],
    *,
    capture: str | Path | CaptureSource | None = None,
    encoded: Encoded | None = None,
    batch_size: int = 32,
    max_length: int = 128,
    pool: str = "token",
    include_special: bool = True,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    stop_early: bool = True,
    fwd_hooks: Sequence[tuple[Any, Any]] = (),
) -> Iterator[ActivationBatch]:
    """Yield the activations at ``sites`` for every sentence, one `ActivationBatch` per encoded batch.

    model: a hooked encoder (``bertscope.load``); its tokenizer encodes the corpus, and without ``capture``
        it runs the forward (in ``torch.no_grad``, on its own device and dtype).
    corpus_or_texts: a `Corpus`, or a list of `Sentence` s or of strings (words split on whitespace).
    sites: hook names or globs (a comma-separated string or a list), e.g. ``"blocks.*.hook_resid_post"``.
    capture: a capture folder (or an open `CaptureSource`) to read instead of running the model.
    encoded: the corpus already encoded (``corpus.encode`` of exactly ``corpus_or_texts``; its batches are used
        as they are, and ``batch_size`` / ``max_length`` are its own); default: encoded here.
    pool: ``"token"`` (rows are word pieces) or ``"word"`` (mean over each word's pieces).
    include_special: whether `ActivationBatch.rows` / ``flat`` keep [CLS]/[SEP]-like rows (``pool="token"``).
    device, dtype: where the yielded tensors go and their dtype (default: the model's device, or the CPU for
        a capture; the computed dtype).
    stop_early: stop the forward after the deepest block a site lives in (numbers are the same).
    fwd_hooks: ``(name or filter, hook_fn)`` pairs applied during the forward (an intervention, e.g. zeroing
        ``embed.hook_pos``); not used with ``capture``, whose sequence ids must then name the intervention.
    """
    if pool not in POOLS:
        raise ValueError(f"pool must be one of {POOLS}, got {pool!r}")
    sentences = _sentences(corpus_or_texts)
    encoded = _encoded(model, sentences, encoded, batch_size=batch_size, max_length=max_length)
    source = open_capture(capture, model)
    names = resolve_sites(model, sites) if source is None else source.resolve(sites)
    if source is not None:
        source.check(encoded, sentences)
    for batch in encoded:
        yield batch_activations(model, batch, names, corpus=sentences, capture=source, pool=pool,
                                include_special=include_special, device=device, dtype=dtype, stop_early=stop_early,
                                fwd_hooks=fwd_hooks)  # fmt: skip


def batch_activations(
    model: Any,
    batch: Batch,
    names: Sequence[str],
    *,
    corpus: Sequence[Sentence] | None = None,
    capture: CaptureSource | None = None,
    pool: str = "token",
    include_special: bool = True,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    stop_early: bool = True,
    fwd_hooks: Sequence[tuple[Any, Any]] = (),
) -> ActivationBatch:
    """One batch of `iter_activations` (for callers that deal batches out themselves, e.g. to worker
    processes): the activations at ``names`` (resolved hook names, see `resolve_sites` /
    `CaptureSource.resolve`) of ``batch`` (a ``corpus.encode`` batch), from a forward or from ``capture``
    (then ``corpus``, the sentences ``batch.sentence_index`` points into, finds its rows); ``fwd_hooks`` as in
    `iter_activations`."""
    if pool not in POOLS:
        raise ValueError(f"pool must be one of {POOLS}, got {pool!r}")
    if capture is None:
        cache = run_batch(model, batch, names, stop_at_layer=last_layer_needed(names) if stop_early else None,
                          fwd_hooks=fwd_hooks)  # fmt: skip
        tensors = {name: cache[name] for name in names}
    else:
        if corpus is None:
            raise ValueError("reading a capture needs the corpus the batch was encoded from (corpus=...)")
        tensors = capture.read(batch, names, [corpus[i] for i in batch.sentence_index])
    return _finish(batch, tensors, pool=pool, include_special=include_special, device=device, dtype=dtype)


def open_capture(capture: str | Path | CaptureSource | None, model: Any) -> CaptureSource | None:
    """``capture`` as a `CaptureSource` (``None`` stays ``None``: run the model)."""
    if capture is None or isinstance(capture, CaptureSource):
        return capture
    return CaptureSource(capture, model)


# ------------------------------------------------------------------------------------------------ forward


def resolve_sites(model: Any, sites: str | Sequence[str]) -> list[str]:
    """The model's hook names matching ``sites`` (names or globs; a string may be comma-separated), in forward
    order; a pattern matching nothing is a `CaptureError` (a ``ValueError``) naming close matches. The one
    implementation is `capture.layout.select_hooks` (``bertscope capture --hooks``), without the option's name."""
    return select_hooks(model, sites, option=None)


def run_batch(model: Any, batch: Batch, names: Sequence[str], *, stop_at_layer: int | None = None,
              cache_device: str | torch.device | None = None,
              fwd_hooks: Sequence[tuple[Any, Any]] = ()) -> Any:  # fmt: skip
    """One batch's forward caching ``names`` (the only forward of the stage and of ``bertscope capture``):
    ``input_ids``, ``attention_mask`` and ``token_type_ids`` on the model's device, no gradients, blocks after
    ``stop_at_layer`` skipped, ``fwd_hooks`` (``(name or filter, hook_fn)`` pairs) applied. Returns the
    `ActivationCache` (tensors as the hooks give them, on ``cache_device`` if given)."""
    device = next(model.parameters()).device
    kwargs: dict[str, Any] = {"stop_at_layer": stop_at_layer} if stop_at_layer is not None else {}
    if fwd_hooks:
        kwargs["fwd_hooks"] = list(fwd_hooks)
    with torch.no_grad():
        _, cache = model.run_with_cache(
            batch.input_ids.to(device),
            attention_mask=batch.attention_mask.to(device),
            token_type_ids=batch.token_type_ids.to(device),
            names_filter=list(names),
            cache_device=cache_device,
            **kwargs,
        )
    return cache


#: Whether ``site`` is an attention site (``[batch, head, query, key]``): ``hook_pattern``, ``hook_scores``
#: (``bertscope.hooks.sites.is_attention_site``, the one list; this name is kept as an alias).
is_attention = is_attention_site


def token_classes(batch: Batch) -> torch.Tensor:
    """``[batch, pos]`` long: ``REAL`` at word pieces, ``CLS`` at special tokens before the first word, ``SEP`` at
    special tokens after one, ``PADDING`` where ``attention_mask`` is 0."""
    real = batch.attention_mask.bool()
    word = batch.word_ids >= 0
    seen_word = (torch.cumsum(word.long(), dim=1) - word.long()) > 0  # a word strictly before this position
    out = torch.full(real.shape, PADDING, dtype=torch.long)
    out[real & word] = REAL
    out[real & ~word & ~seen_word] = CLS
    out[real & ~word & seen_word] = SEP
    return out


def first_pieces(word_ids: torch.Tensor, n_words: int) -> torch.Tensor:
    """``[batch, n_words]``: the position of each word's first piece (0 where a row has fewer words)."""
    b, p = word_ids.shape
    pos = torch.arange(p).expand(b, p)
    big = torch.full((b, n_words), p, dtype=torch.long)
    w = word_ids.clamp_min(0)
    first = big.scatter_reduce(1, w, torch.where(word_ids >= 0, pos, p), reduce="amin")
    return torch.where(first == p, 0, first)


# ------------------------------------------------------------------------------------------------ capture


class CaptureSource:
    """A capture folder read as the stage's source: its index, the sites it holds, where each sentence's rows
    are, and row-slice reads of one batch at a time. Construction reads the index and the shards' row
    metadata only; a foreign capture (other max_length, dtype, model) is refused by `check`."""

    def __init__(self, folder: str | Path, model: Any, *, open_files: int = 4) -> None:
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise CaptureError(f"{self.folder} is not a folder (give the --out of a `bertscope capture`)")
        self.index = read_index(self.folder)
        self.model = model
        self._open: OrderedDict[int, Any] = OrderedDict()
        self._pid = os.getpid()
        self._open_files = open_files
        sentences = pd.read_parquet(self.folder / SENTENCES, columns=["sentence_index", "id", "text"])
        self.by_key: dict[tuple[str, str], int] = {}
        for i, sid, text in zip(sentences["sentence_index"], sentences["id"], sentences["text"], strict=True):
            self.by_key.setdefault((str(sid), str(text)), int(i))
        self.where: dict[int, tuple[int, int, int]] = {}  # sentence -> (shard, first row, n rows)
        from safetensors import safe_open

        for number, shard in enumerate(self.index["shards"]):
            with safe_open(self.folder / shard["file"], framework="pt") as f:
                index = f.get_tensor("rows.sentence_index").numpy()
            starts = np.flatnonzero(np.r_[True, index[1:] != index[:-1]])
            ends = np.r_[starts[1:], len(index)]
            for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
                self.where[int(index[s])] = (number, s, e - s)

    @property
    def max_length(self) -> int:
        """The capture's ``--max-length``."""
        return int(self.index["max_length"])

    def resolve(self, sites: str | Sequence[str]) -> list[str]:
        """The stored site names matching ``sites`` (names or globs), in stored order; a site the capture
        lacks is a `CaptureError` naming what it holds."""
        wanted = patterns(sites)
        if not wanted:
            raise CaptureError("no site given; name one, or a glob such as 'blocks.*.hook_resid_post'")
        try:
            return select_stored(self.index, wanted)
        except CaptureError as e:
            raise CaptureError(f"capture {self.folder} lacks a site: {e}") from None

    def check(self, encoded: Encoded | int, sentences: Sequence[Sentence], sites: Any = None) -> None:
        """Refuse (`CaptureError`, one line) to serve ``sentences`` encoded at ``encoded.max_length`` (or an
        int max_length) when the capture has another max_length, dtype or model, lacks one of ``sites`` or
        one of the sentences. (Token ids are checked as rows are read.)"""
        model_info = self.index.get("model") or {}
        if model_info.get("weights_sha256") not in (None, self.model.weights_sha256):
            raise CaptureError(f"capture {self.folder} was made by another model ({model_info.get('source')}); "
                               "run with that --model or recapture")  # fmt: skip
        dtype = str(next(self.model.parameters()).dtype).removeprefix("torch.")
        stored = {h["dtype"] for h in self.index["hooks"].values()}
        if stored != {dtype}:
            raise CaptureError(f"capture {self.folder} holds {', '.join(sorted(stored))} activations, this run's "
                               f"model is {dtype} (--dtype); recapture or use the capture's dtype")  # fmt: skip
        max_length = encoded if isinstance(encoded, int) else encoded.max_length
        if max_length != self.max_length:
            raise CaptureError(f"capture {self.folder} was made with --max-length {self.max_length}, this run uses "
                               f"--max-length {max_length}; recapture or use the capture's")  # fmt: skip
        if sites is not None:
            self.resolve(sites)
        corpus_name = (self.index.get("corpus") or {}).get("name", "another corpus")
        for sentence in sentences:
            if self.locate(sentence) is None:
                raise CaptureError(f"capture {self.folder} does not hold sentence {sentence.id!r} of this corpus "
                                   f"(it was made from {corpus_name}); recapture this corpus")

    def locate(self, sentence: Sentence) -> tuple[int, int, int] | None:
        """Where the capture holds ``sentence`` (found by id and text): ``(shard, first row, rows)``, or ``None``."""
        i = self.by_key.get((str(sentence.id), str(sentence.text)))
        return None if i is None else self.where.get(i)

    def read(self, batch: Batch, names: Sequence[str], sentences: Sequence[Sentence]) -> dict[str, torch.Tensor]:
        """The batch's activations from the shards (``sentences``: the batch's, in its order): ``{site: [batch,
        pos, ...]}`` (attention sites ``[batch, head, query, key]``), padding zero; every row's token id is
        checked against the batch."""
        b, p = batch.input_ids.shape
        lengths = batch.attention_mask.sum(dim=1).tolist()
        out: dict[str, torch.Tensor] = {}
        for j, sentence in enumerate(sentences):
            where = self.locate(sentence)
            if where is None:
                raise CaptureError(f"capture {self.folder} does not hold sentence {sentence.id!r}")
            number, start, n = where
            f = self._file(number)
            token_ids = f.get_slice("rows.token_id")[start : start + n]
            if n != lengths[j] or not torch.equal(token_ids, batch.input_ids[j, :n]):
                raise CaptureError(f"capture {self.folder}: sentence {sentence.id!r} has other word "
                                   "pieces there than this model's tokenizer gives (another tokenizer?)")
            for name in names:
                rows = f.get_slice(name)[start : start + n]  # [n, ...] or attention [n, head, key_width]
                if name not in out:
                    shape = (b, rows.shape[1], p, p) if is_attention(name) else (b, p, *rows.shape[1:])
                    out[name] = rows.new_zeros(shape)
                if is_attention(name):
                    out[name][j, :, :n, :n] = rearrange(rows[:, :, :n], "q h k -> h q k")
                else:
                    out[name][j, :n] = rows
        return {name: out[name] for name in names}

    def _file(self, number: int) -> Any:
        from safetensors import safe_open

        if self._pid != os.getpid():  # a forked worker opens its own files
            self._open, self._pid = OrderedDict(), os.getpid()
        if number in self._open:
            self._open.move_to_end(number)
            return self._open[number]
        f = safe_open(self.folder / self.index["shards"][number]["file"], framework="pt")
        self._open[number] = f
        while len(self._open) > self._open_files:
            self._open.popitem(last=False)
        return f


# ------------------------------------------------------------------------------------------ token sequences


def encode_sequences(
    sequences: Sequence[Sequence[int] | np.ndarray],
    *,
    pad_token_id: int,
    ids: Sequence[str] | None = None,
    batch_size: int = 32,
    order: Sequence[int] | np.ndarray | None = None,
    max_length: int | None = None,
) -> tuple[list[Sentence], Encoded]:
    """Already-tokenised sequences as the stage's input: ``(sentences, encoded)`` to pass to `iter_activations`
    (``iter_activations(model, sentences, sites, encoded=encoded)``) or to `capture.capture` (``encoded=``).

    Each sequence is token ids with a special token first and last (``[CLS] .. [SEP]``, the model's own ids, as
    the caller built them, e.g. windows cut across sentences); each piece between is its own "word" (word id
    0, 1, ...), so `token_classes` gives ``CLS``, ``REAL`` ..., ``SEP``. ``sentences`` are stand-ins a capture
    finds them by: id ``ids[i]`` (default ``"seq:{i}"``) and text the token ids joined by spaces.
    ``encoded`` holds ``batch_size`` sequences per batch in ``order`` (indices into ``sequences``; default as
    given), padded with ``pad_token_id``, token types 0; ``sentence_index`` points into ``sequences``.
    ``max_length`` is what the encoding records (what a capture must match; default the longest sequence);
    nothing is truncated."""
    seqs = [np.asarray(s, dtype=np.int64) for s in sequences]
    if not seqs:
        raise ValueError("no sequences to encode")
    if any(len(s) < 2 for s in seqs):
        raise ValueError("every sequence needs a special token first and last (at least 2 tokens)")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    names = [f"seq:{i}" for i in range(len(seqs))] if ids is None else [str(i) for i in ids]
    if len(names) != len(seqs) or len(set(names)) != len(names):
        raise ValueError("ids must give every sequence its own id")
    sentences = [Sentence(id=name, words=tuple(str(t) for t in s[1:-1]) or (str(s[0]),),
                          text=" ".join(str(t) for t in s.tolist())) for name, s in zip(names, seqs, strict=True)]
    order = np.arange(len(seqs)) if order is None else np.asarray(order, dtype=np.int64)
    if sorted(order.tolist()) != list(range(len(seqs))):
        raise ValueError("order must list every sequence exactly once")
    batches = []
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size].tolist()
        width = max(len(seqs[i]) for i in rows)
        input_ids = torch.full((len(rows), width), int(pad_token_id), dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        word_ids = torch.full((len(rows), width), -1, dtype=torch.long)
        for r, i in enumerate(rows):
            n = len(seqs[i])
            input_ids[r, :n] = torch.from_numpy(seqs[i])
            mask[r, :n] = 1
            word_ids[r, 1 : n - 1] = torch.arange(n - 2)
        batches.append(Batch(input_ids=input_ids, attention_mask=mask, token_type_ids=torch.zeros_like(input_ids),
                             word_ids=word_ids, special_mask=(word_ids < 0) & mask.bool(), sentence_index=rows,
                             n_words=[len(seqs[i]) - 2 for i in rows], truncated=[False] * len(rows)))  # fmt: skip
    longest = max(len(s) for s in seqs)
    encoded = Encoded(batches=batches, n_truncated=0, n_sequences=len(seqs),
                      max_length=longest if max_length is None else int(max_length), pair=False)  # fmt: skip
    return sentences, encoded


# ------------------------------------------------------------------------------------------------ helpers


def _sentences(corpus: Any) -> list[Sentence]:
    """The sentences of a `Corpus`, a list of `Sentence` s, or a list of strings (words split on whitespace)."""
    if isinstance(corpus, Encoded):
        raise TypeError("pass the corpus (or its sentences) and, if already encoded, encoded=...")
    sentences = list(corpus)
    if sentences and all(isinstance(s, str) for s in sentences):
        sentences = [Sentence(id=f"text:{i}", words=tuple(s.split()), text=s) for i, s in enumerate(sentences)]
    return sentences


def _encoded(model: Any, sentences: list[Sentence], encoded: Encoded | None, *, batch_size: int,
             max_length: int) -> Encoded:  # fmt: skip
    """The sentences as `Encoded` batches (``encoded`` when given, checked to be theirs)."""
    if encoded is None:
        return encode(sentences, model.tokenizer, max_length=max_length, batch_size=batch_size)
    if sum(len(b) for b in encoded) != len(sentences) or encoded.pair:
        raise ValueError("encoded must be the single-sentence encoding of exactly corpus_or_texts")
    return encoded


def _finish(batch: Batch, tensors: dict[str, torch.Tensor], *, pool: str, include_special: bool,
            device: Any, dtype: torch.dtype | None) -> ActivationBatch:  # fmt: skip
    """Zero the padding, move to ``device``, pool words if asked, cast to ``dtype``."""
    classes = token_classes(batch)
    real = batch.attention_mask.bool()
    out = {}
    for name, t in tensors.items():
        mask = real.to(t.device)
        if is_attention_site(name):
            t = torch.where(mask[:, None, :, None] & mask[:, None, None, :], t, torch.zeros((), dtype=t.dtype))
        else:
            t = torch.where(mask.reshape(*mask.shape, *([1] * (t.ndim - 2))), t, torch.zeros((), dtype=t.dtype))
        out[name] = t.to(device=device or t.device)
    if pool == "word":
        out = pool_words(out, batch)
    out = {name: t.to(dtype=dtype or t.dtype) for name, t in out.items()}
    return ActivationBatch(batch, out, classes, pool=pool, include_special=include_special)


def pool_words(tensors: dict[str, torch.Tensor], batch: Batch) -> dict[str, torch.Tensor]:
    """The one word pooling of the experiments (``pool="word"``, and erasure's word vectors from the token-level
    tensors it also keeps). Word-pooled sites of one batch: ``[batch, word, ...]`` for token sites (the sites of
    one shape, dtype and device pooled together, one ``word_pool`` per sentence over ``[site, pos, features]``),
    ``[batch, head, word, word]`` for attention sites; words past a sentence's last hold 0."""
    n_words = max(batch.n_words)
    out: dict[str, torch.Tensor] = {}
    groups: dict[tuple, list[str]] = {}
    for name, t in tensors.items():
        if is_attention_site(name):
            parts = []
            for j, n in enumerate(batch.n_words):
                pooled = word_attention(t[j], batch.word_ids[j].to(t.device))  # [head, n, n]
                pad = pooled.new_zeros((pooled.shape[0], n_words, n_words))
                pad[:, :n, :n] = pooled
                parts.append(pad)
            out[name] = torch.stack(parts)
        else:
            groups.setdefault((tuple(t.shape[2:]), t.dtype, t.device), []).append(name)
    for (rest, _, _), names in groups.items():
        parts = []
        for j, n in enumerate(batch.n_words):
            x = torch.stack([tensors[name][j].reshape(tensors[name].shape[1], -1) for name in names])  # [s, p, f]
            pooled = word_pool(x, batch.word_ids[j].to(x.device))  # [site, n, features]
            pad = pooled.new_zeros((len(names), n_words, pooled.shape[2]))
            pad[:, :n] = pooled
            parts.append(pad.reshape(len(names), n_words, *rest))
        stacked = torch.stack(parts, dim=1)  # [site, batch, word, ...]
        out.update({name: stacked[k] for k, name in enumerate(names)})
    return {name: out[name] for name in tensors}
