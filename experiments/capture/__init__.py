"""Stream activations for a whole corpus to disk: safetensors shards plus an ``index.json``; one process or
many (``torchrun``), with the same bytes either way.

Layout of ``OUT`` after ``capture(...)``::

    shard-00000.safetensors   one tensor per hook, [rows, ...], plus the row metadata ``rows.*``
    shard-00001.safetensors
    sentences.parquet         per sentence: sentence_index, id, text, n_words, n_words_kept, n_tokens, truncated
    index.json                written last: hooks, row shapes, shards, model/corpus hashes, options

A **row** is one real token of one sentence (padding is never saved). Token-indexed hooks
(``[batch, pos, ...]``) give rows ``[rows, ...]``. Attention hooks (``hook_scores``, ``hook_pattern``:
``[batch, head, query, key]``) give one row per *query* token, ``[rows, head, key]``, with the key axis
padded to the longest sequence of the capture; keys at or after ``rows.seq_length`` are padding and hold 0.
Every shard carries, per row: ``rows.sentence_index`` (into the corpus), ``rows.position`` (word-piece
position in the sequence, 0 = [CLS]), ``rows.word_index`` (-1 for [CLS]/[SEP]), ``rows.token_id``,
``rows.token_type`` and ``rows.seq_length``.

**Order.** The corpus is batched longest sentence first (less padding), and shards hold whole sentences in
that batch order; ``iter_capture`` yields them so. ``load_capture`` returns rows in corpus order (sentence,
then position), with the sentence's ``id`` from ``sentences.parquet``.

**Memory** is bounded by the shard size (by default picked from the capture's size alone: about 64 shards of
32 MiB to 256 MiB, ``plan.auto_shard_size``): shards are planned up front from the token counts (whole sentences,
in batch order), each is written atomically as soon as its last sentence is done and then freed. A rerun
with the same settings skips the shards already on disk (checked by their embedded fingerprint) and
produces the same bytes as an uninterrupted run.

**Several processes.** Under ``torch.distributed`` (``torchrun -m bertscope.experiments.capture`` or
``bertscope capture --nproc N``) every rank builds the same batch and shard plan, takes a contiguous run of
shards balanced by padded tokens, runs the whole batches those shards need (a batch split between two ranks'
shards is run by both) and writes its shards; rank 0 writes ``sentences.parquet`` and the index. Every tensor
sees the batch it sees in one process, so the shards are byte-identical to a one-process capture.

>>> index = capture(model, corpus, "blocks.*.hook_resid_post", "acts", shard_size=parse_size("64MB"))
>>> tensors, rows = load_capture("acts", "blocks.3.hook_resid_post")   # {hook: [n_rows, d_model]}, DataFrame

Modules: ``layout`` (file names, format, ``CaptureError``, hook selection), ``plan`` (hook shapes, shard
plan, rank assignment, fingerprint), ``writer`` (shards, folder checks, ``sentences.parquet``), ``stream``
(``capture``), ``distributed`` (process group), ``load`` (``load_capture``, ``iter_capture``,
``read_index``), ``command`` (``bertscope capture``, ``--nproc``), ``allocator`` (``keep_freed_memory``: glibc
set to reuse freed pages, so a full capture does not fault its bytes in afresh on every call).

**Layers.** ``layout``, ``plan`` and ``load`` are the on-disk format, below the activations stage
(``experiments/activations.py`` reads a capture through them); ``writer``, ``stream``, ``distributed`` and
``command`` write one through the stage and sit above it. This ``__init__`` imports the layout only; the
writer's and the command's names (``capture``, ``launch``, ``run_command``, ``EXIT_*``, ``COLLECTIVE_TIMEOUT``)
are imported on first use (PEP 562), so the stage importing the format never runs the writer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bertscope.experiments.io import parse_size
from bertscope.hooks.lazy import lazy_names

from .allocator import keep_freed_memory
from .layout import (
    ATTENTION_SUFFIXES,
    DEFAULT_SHARD_SIZE,
    FORMAT,
    INDEX,
    ROW_FIELDS,
    SENTENCES,
    SHARD_GLOB,
    CaptureError,
    select_hooks,
)

if TYPE_CHECKING:
    from .command import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, launch, run_command
    from .distributed import COLLECTIVE_TIMEOUT
    from .load import iter_capture, load_capture, read_index
    from .stream import capture

# The writer's and the command's names (above the activations stage), imported when first asked for; the
# loader's too (it imports torch: `bertscope` applies the allocator setting from here before any usage check).
_LAZY = {
    **dict.fromkeys(("EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE", "launch", "run_command"),
                    f"{__name__}.command"),
    "COLLECTIVE_TIMEOUT": f"{__name__}.distributed",
    **dict.fromkeys(("iter_capture", "load_capture", "read_index"), f"{__name__}.load"),  # torch: on first use
    "capture": f"{__name__}.stream",
}  # fmt: skip
_SUBMODULES = ("command", "distributed", "load", "stream", "writer")


__getattr__, __dir__ = lazy_names(__name__, globals(), _LAZY, _SUBMODULES)


__all__ = [
    "ATTENTION_SUFFIXES", "COLLECTIVE_TIMEOUT", "DEFAULT_SHARD_SIZE", "EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_OK",
    "EXIT_USAGE", "FORMAT", "INDEX", "ROW_FIELDS", "SENTENCES", "SHARD_GLOB", "CaptureError", "capture",
    "iter_capture", "keep_freed_memory", "launch", "load_capture", "parse_size", "read_index", "run_command",
    "select_hooks",
]  # fmt: skip
