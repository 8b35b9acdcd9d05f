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

**Memory** is bounded by the shard size: shards are planned up front from the token counts (whole sentences,
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
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import math
import os
import re
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from bertscope.experiments import io
from bertscope.experiments.io import parse_size  # noqa: F401  (re-exported: capture sizes)
from bertscope.hooks import HookedModule
from einops import rearrange

FORMAT = "bertscope-capture/1"
INDEX = "index.json"
SENTENCES = "sentences.parquet"
SHARD_GLOB = "shard-*.safetensors"
ROW_FIELDS = ("sentence_index", "position", "word_index", "token_id", "token_type", "seq_length")
ATTENTION_SUFFIXES = ("hook_scores", "hook_pattern")
DEFAULT_SHARD_SIZE = 256 * 2**20
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
COLLECTIVE_TIMEOUT = _dt.timedelta(hours=24)  # ranks that finish early wait this long for the others


class CaptureError(ValueError):
    """Bad capture request (no hook matches, a different capture in the folder, an incomplete capture)."""


def capture(
    model: Any,
    corpus: Any,
    hooks: str | Sequence[str],
    out_dir: str | Path,
    *,
    max_length: int = 128,
    batch_size: int = 32,
    shard_size: int = DEFAULT_SHARD_SIZE,
    force: bool = False,
    quiet: bool = False,
    info: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Capture the activations at ``hooks`` for every sentence of ``corpus`` into ``out_dir``.

    ``hooks``: hook names or globs (a comma-separated string or a list). ``shard_size``: bytes per shard
    (a shard holds at least one sentence). ``force`` discards what ``out_dir`` holds; without it a capture
    with other settings in ``out_dir`` is an error, a finished identical one is returned as is, and a
    partial identical one is resumed. ``info`` is stored in the index (model/corpus descriptions, options).

    When ``torch.distributed`` is initialised, every rank of the default group must call this with the same
    arguments; each writes its share of the shards and rank 0 writes the index (see the module docstring).

    Returns the index (as written to ``out_dir/index.json``) plus ``"run"``, what this call did:
    ``already_complete``, ``shards_written``, ``shards_reused``, ``world_size`` and per rank ``ranks``
    (``shards``, ``rows`` computed, ``seconds``, ``tokens_per_s``).
    """
    from bertscope.experiments import corpus as corpus_mod

    if shard_size < 1:
        raise CaptureError(f"shard size must be positive, got {shard_size}")
    group = _Group.current()
    out_dir = Path(out_dir)
    names = select_hooks(model, hooks)
    with warnings.catch_warnings(record=True) as caught:  # kept in the index; the caller reports truncation
        warnings.simplefilter("always")
        try:
            encoded = corpus_mod.encode(corpus, model.tokenizer, max_length=max_length, batch_size=batch_size)
        except ValueError as e:  # CorpusError included: e.g. --max-length too small for a first word
            raise CaptureError(str(e)) from e
    batches = list(encoded)
    if not batches:
        raise CaptureError(f"corpus {corpus.name!r} has no sentences to capture")
    key_width = max(int(b.attention_mask.shape[1]) for b in batches)
    device = next(model.parameters()).device
    specs = _hook_specs(model, names, batches[0], key_width, device)
    fingerprint = _fingerprint(model, corpus, specs, max_length, batch_size, shard_size, device)
    plan = _plan_shards(batches, specs, shard_size)
    owner = _assign_shards(plan, batches, group.world)
    mine = {s.number for s in plan if owner[s.number] == group.rank}

    # Every rank checks the folder; nobody writes a shard before all have (a forced rerun deletes first).
    problems = [p for p in group.gather(_prepare_folder(out_dir, fingerprint, force)) if p]
    if problems:
        raise CaptureError(problems[0])
    index_path = out_dir / INDEX
    existing = io.read_json(index_path) if index_path.is_file() else None
    on_disk = {n for n in mine if _shard_is_done(out_dir / plan[n].file, fingerprint, n)}
    # Complete: rank 0 has the index and every rank its shards (on a folder that is not shared, too).
    complete = all(group.gather(on_disk == mine and (existing is not None or group.rank != 0)))
    if complete:
        run = {"already_complete": True, "shards_written": 0, "shards_reused": len(plan),
               "world_size": group.world, "ranks": []}  # fmt: skip
        return group.broadcast(existing) | {"run": run}
    group.barrier()  # every rank has read the old index before rank 0 removes it
    if group.rank == 0 and index_path.is_file():  # same fingerprint, but shards were deleted since
        index_path.unlink()

    writer = _ShardWriter(out_dir, plan, specs, fingerprint, skip={s.number for s in plan} - (mine - on_disk))
    todo = [b for b in range(len(batches)) if not writer.batch_is_done(b)]
    stop_at = _last_layer_needed(names)
    from tqdm.auto import tqdm

    bar = tqdm(todo, desc="capture", disable=quiet or group.rank != 0 or not sys.stderr.isatty(),
               dynamic_ncols=True, mininterval=0.5, file=sys.stderr)  # fmt: skip
    started, n_rows = time.perf_counter(), 0
    with torch.inference_mode():
        for batch_number in bar:
            batch = batches[batch_number]
            cache = _run(model, batch, names, device, stop_at)
            writer.add_batch(batch_number, batch, cache)
            n_rows += int(batch.attention_mask.sum())
    writer.finish()
    seconds = time.perf_counter() - started
    mine_stats = {"rank": group.rank, "shards": len(mine), "shards_written": len(mine - on_disk),
                  "rows": n_rows, "seconds": round(seconds, 3),
                  "tokens_per_s": round(n_rows / seconds, 1) if seconds > 0 else None,
                  "bytes": {n: (out_dir / plan[n].file).stat().st_size for n in sorted(mine)}}  # fmt: skip
    ranks = group.gather(mine_stats)
    shard_bytes = {n: b for r in ranks for n, b in r.pop("bytes").items()}

    index = None
    if group.rank == 0:
        _write_sentences(out_dir / SENTENCES, corpus, batches)
        index = {
            "format": FORMAT,
            "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "fingerprint": fingerprint,
            "hooks": {s.name: s.describe() for s in specs},
            "row_fields": list(ROW_FIELDS),
            "key_width": key_width,
            "n_rows": sum(s.n_rows for s in plan),
            "n_sentences": len(corpus),
            "n_truncated": encoded.n_truncated,
            "warnings": [str(w.message) for w in caught],
            "max_length": max_length,
            "batch_size": batch_size,
            "shard_size": shard_size,
            "world_size": group.world,
            "shards": [
                {"file": s.file, "n_rows": s.n_rows, "n_sentences": len(s.sentences), "bytes": shard_bytes[s.number]}
                for s in plan
            ],
            **(info or {}),
        }
        io.write_json(index_path, index)
    index = group.broadcast(index)
    written = sum(r["shards_written"] for r in ranks)
    run = {"already_complete": False, "shards_written": written, "shards_reused": len(plan) - written,
           "world_size": group.world, "ranks": ranks}  # fmt: skip
    return index | {"run": run}


def load_capture(
    out_dir: str | Path,
    hooks: str | Sequence[str] | None = None,
    *,
    as_frame: bool = False,
    order: str = "corpus",
) -> tuple[dict[str, torch.Tensor], pd.DataFrame] | pd.DataFrame:
    """Load a finished capture: every row of every shard, in corpus order.

    ``hooks``: names or globs of the hooks to load (a comma-separated string or a list; default all).
    ``order``: ``"corpus"`` (default: by ``sentence_index``, then ``position``) or ``"shard"`` (as stored:
    length-sorted batch order, as ``iter_capture`` yields).

    Returns ``(tensors, rows)``: ``{hook: [n_rows, ...]}`` (``[n_rows, d]`` for token hooks,
    ``[n_rows, head, key]`` for attention hooks) and the row table, row ``i`` describing ``tensors[h][i]``:
    ``sentence_index``, ``sentence_id`` (the corpus's id), ``position`` (word piece, 0 = [CLS]),
    ``word_index`` (-1 for special tokens), ``token_id``, ``token_type``, ``seq_length``, ``shard``.
    With ``as_frame=True``, one DataFrame instead: the row table plus one column per hook whose cells are
    numpy arrays (the row's activation; bfloat16 as float32).

    Memory: the result plus one shard (rows are placed straight into their corpus-order slot).
    """
    if order not in ("corpus", "shard"):
        raise CaptureError(f"order must be 'corpus' or 'shard', got {order!r}")
    out_dir = Path(out_dir)
    index = read_index(out_dir)
    names = _select_stored(index, hooks)
    tables = [rows.assign(shard=number) for number, rows in enumerate(_iter_rows(out_dir, index))]
    rows = pd.concat(tables, ignore_index=True)
    if order == "corpus":
        slot = np.empty(len(rows), dtype=np.int64)  # stored row i goes to corpus-order row slot[i]
        slot[np.lexsort((rows["position"].to_numpy(), rows["sentence_index"].to_numpy()))] = np.arange(len(rows))
    else:
        slot = np.arange(len(rows))
    tensors: dict[str, torch.Tensor] = {}
    start = 0
    for shard_tensors, shard_rows in iter_capture(out_dir, names):
        where = torch.from_numpy(slot[start : start + len(shard_rows)])
        for name, t in shard_tensors.items():
            if name not in tensors:
                tensors[name] = t.new_empty((len(rows), *t.shape[1:]))
            tensors[name][where] = t
        start += len(shard_rows)
    rows = rows.iloc[np.argsort(slot)].reset_index(drop=True)
    sentences = pd.read_parquet(out_dir / SENTENCES, columns=["sentence_index", "id"])
    ids = sentences.set_index("sentence_index")["id"]
    rows.insert(1, "sentence_id", ids.reindex(rows["sentence_index"]).to_numpy())
    if not as_frame:
        return tensors, rows
    for name in names:
        t = tensors[name]
        values = (t.float() if t.dtype == torch.bfloat16 else t).numpy()
        rows[name] = list(values)
    return rows


def iter_capture(
    out_dir: str | Path, hooks: str | Sequence[str] | None = None
) -> Iterator[tuple[dict[str, torch.Tensor], pd.DataFrame]]:
    """Yield ``({hook: [rows, ...]}, row table)`` shard by shard, in stored (length-sorted batch) order;
    memory: one shard at a time. The row table has the ``rows.*`` fields (see the module docstring)."""
    from safetensors import safe_open

    out_dir = Path(out_dir)
    index = read_index(out_dir)
    names = _select_stored(index, hooks)
    for shard in index["shards"]:
        with safe_open(out_dir / shard["file"], framework="pt") as f:
            tensors = {n: f.get_tensor(n) for n in names}
            rows = pd.DataFrame({k: f.get_tensor(f"rows.{k}").numpy() for k in index["row_fields"]})
        yield tensors, rows


def read_index(out_dir: str | Path) -> dict[str, Any]:
    """The index of a finished capture; a clear error if the capture is missing or unfinished."""
    out_dir = Path(out_dir)
    path = out_dir / INDEX
    if not path.is_file():
        state = "unfinished" if any(out_dir.glob(SHARD_GLOB)) else "missing"
        raise CaptureError(
            f"capture in {out_dir} is {state} (no {INDEX}); rerun the same `bertscope capture` command to "
            "finish it"
        )
    index = io.read_json(path)
    if index.get("format") != FORMAT:
        raise CaptureError(f"{path}: format {index.get('format')!r}, expected {FORMAT!r}")
    return index


def select_hooks(model: Any, hooks: str | Sequence[str]) -> list[str]:
    """The model's hook names matching any of ``hooks`` (names or globs; a string may be comma-separated),
    in forward order, resolved by ``HookedModule.select_hooks``; a pattern matching nothing is a
    ``CaptureError`` that names close matches."""
    patterns = _patterns(hooks)
    if not patterns:
        raise CaptureError("no hook given; pass --hooks with a name or glob such as 'blocks.*.hook_resid_post'")
    try:
        return model.select_hooks(patterns)
    except KeyError as e:
        raise CaptureError(f"--hooks: {e.args[0]} `bertscope info` lists every name.") from None


# ----------------------------------------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bertscope.experiments.capture ARGS`` (and ``torchrun ... -m bertscope.experiments.capture
    ARGS``): the same options as ``bertscope capture ARGS``."""
    from bertscope.experiments import cli

    return cli.main(["capture", *(sys.argv[1:] if argv is None else argv)])


def run_command(args: argparse.Namespace, options: Any) -> int:
    """Body of ``bertscope capture``: ``args`` from its parser, ``options`` the shared ``RunOptions``.

    With ``--nproc N`` (outside torchrun) it launches N local worker processes with torchrun; under torchrun
    (``WORLD_SIZE`` set) it joins the process group (gloo on CPU, nccl on CUDA, one GPU per local rank).
    Only rank 0 prints; bad input raises ``UsageError`` there and exits 2 silently elsewhere.
    """
    from bertscope.experiments.options import UsageError

    worker = "WORLD_SIZE" in os.environ and "RANK" in os.environ
    nproc = getattr(args, "nproc", None)
    if nproc and worker:
        raise UsageError("--nproc launches torchrun itself; under torchrun leave it out (use --nproc-per-node)")
    if nproc:
        return launch(args, nproc)
    rank = int(os.environ.get("RANK", "0")) if worker else 0
    try:
        with _process_group(options.device) as device:
            return _capture_command(args, replace(options, device=device), quiet_rank=rank != 0)
    except (UsageError, CaptureError) as e:
        if rank == 0:
            raise UsageError(str(e)) from e
        return EXIT_USAGE


def launch(args: argparse.Namespace, nproc: int) -> int:
    """Run this capture in ``nproc`` local processes: ``torchrun --standalone --nproc-per-node nproc -m
    bertscope.experiments.capture ...`` in-process (``torch.distributed.run``), so a worker's bad-input
    error stays one line. Each worker gets ``cores // nproc`` threads unless ``OMP_NUM_THREADS`` is set.
    Returns the exit status: 0, 2 (bad input, printed by rank 0), 130 (interrupted) or 1."""
    import logging

    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    argv = ["--standalone", "--nproc-per-node", str(nproc), "-m", "bertscope.experiments.capture",
            *_worker_argv(args)]  # fmt: skip
    saved_env = dict(os.environ)
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // nproc)))
    elastic = logging.getLogger("torch.distributed.elastic")
    level = elastic.level
    elastic.setLevel(logging.CRITICAL)  # workers report their own errors; no agent tracebacks
    try:
        torchrun.run(torchrun.parse_args(argv))
    except ChildFailedError as e:
        codes = {f.exitcode for f in e.failures.values()}
        if codes == {EXIT_USAGE}:
            return EXIT_USAGE
        if codes & {EXIT_INTERRUPTED, -2}:
            return EXIT_INTERRUPTED
        rank, failure = min(e.failures.items())
        print(f"bertscope: error: capture worker rank {rank} failed with exit code {failure.exitcode} "
              "(its traceback is above); rerun the same command to resume", file=sys.stderr)  # fmt: skip
        return EXIT_FAILED
    except SignalException:  # Ctrl-C or SIGTERM reached the launcher: the workers were stopped with it
        print("\nbertscope: interrupted; finished shards are kept, rerun the same command to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        elastic.setLevel(level)
        os.environ.clear()
        os.environ.update(saved_env)
    return EXIT_OK


def _capture_command(args: argparse.Namespace, options: Any, quiet_rank: bool) -> int:
    from bertscope.experiments.options import prepare_inputs
    from bertscope.experiments.runner import device_summary, package_versions

    if quiet_rank:
        options = replace(options, quiet=True)
    inputs = prepare_inputs(options)
    info = {
        "model": inputs.model_info,
        "corpus": inputs.corpus_info,
        "options": options.to_dict() | {"hooks": args.hooks, "shard_size": args.shard_size},
        "device": device_summary(inputs.device),
        "packages": package_versions(),
    }
    index = capture(
        inputs.model, inputs.corpus, args.hooks, options.out,
        max_length=options.max_length, batch_size=options.batch_size, shard_size=args.shard_size,
        force=options.force, quiet=options.quiet, info=info,
    )  # fmt: skip
    if quiet_rank:
        return EXIT_OK
    run = index["run"]
    n_bytes = sum(s["bytes"] for s in index["shards"])
    what = (f"{len(index['hooks'])} hook(s), {index['n_rows']:,} token rows from {index['n_sentences']:,} "
            f"sentences in {len(index['shards'])} shard(s), {n_bytes / 1e6:,.1f} MB")  # fmt: skip
    if run["already_complete"]:
        print(f"capture in {options.out} is already complete ({what}); nothing to do (--force recaptures)\n"
              f"index: {options.out / INDEX}")  # fmt: skip
        return EXIT_OK
    if index.get("n_truncated"):
        print(
            f"warning: {index['n_truncated']} sentences were longer than --max-length {options.max_length} "
            "and were truncated (see sentences.parquet, column truncated)",
            file=sys.stderr,
        )
    resumed = f" ({run['shards_reused']} already on disk)" if run["shards_reused"] else ""
    print(f"captured {what}; wrote {run['shards_written']} shard(s){resumed}")
    if not options.quiet:
        for r in run["ranks"]:
            rate = f"{r['tokens_per_s']:,.0f} tokens/s" if r["tokens_per_s"] else "idle"
            print(f"  rank {r['rank']}: {r['shards']} shard(s), {r['rows']:,} token rows run, {rate}")
    print(f"index: {options.out / INDEX}")
    return EXIT_OK


def _worker_argv(args: argparse.Namespace) -> list[str]:
    """The ``bertscope capture`` arguments that reproduce ``args``, less the launcher's own (``--nproc``)."""
    from bertscope.experiments.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["capture"]
    argv: list[str] = []
    for action in sub._actions:
        flag = next((o for o in action.option_strings if o.startswith("--")), None)
        if flag is None or action.dest in ("help", "nproc"):
            continue
        value = getattr(args, action.dest, None)
        if isinstance(action, argparse._StoreTrueAction):
            argv += [flag] if value else []
        elif value is not None:
            argv += [flag, str(value)]
    return argv


@contextmanager
def _process_group(device: str) -> Iterator[str]:
    """Join torchrun's process group when running as its worker (gloo on CPU, nccl on CUDA with one GPU per
    local rank); yields the device this rank uses, and leaves the group on exit."""
    import torch.distributed as dist

    if "WORLD_SIZE" not in os.environ or dist.is_initialized():
        yield device
        return
    spec = (device or "auto").strip().lower()
    cuda = spec.startswith("cuda") or (spec == "auto" and torch.cuda.is_available())
    if cuda and spec in ("auto", "cuda"):
        spec = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    if cuda and torch.cuda.is_available():
        torch.cuda.set_device(torch.device(spec))
    dist.init_process_group("nccl" if cuda else "gloo", timeout=COLLECTIVE_TIMEOUT)
    try:
        yield spec
    finally:
        dist.destroy_process_group()


@dataclass(frozen=True)
class _Group:
    """The ranks taking part: ``torch.distributed``'s default group when initialised, else this process."""

    rank: int = 0
    world: int = 1

    @classmethod
    def current(cls) -> _Group:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        return cls()

    def gather(self, obj: Any) -> list[Any]:
        """``obj`` from every rank, in rank order (a barrier too)."""
        if self.world == 1:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if self.world == 1:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        """Wait for every rank."""
        self.gather(None)


# ----------------------------------------------------------------------------------------------- helpers


@dataclass(frozen=True)
class _HookSpec:
    name: str
    row_shape: tuple[int, ...]
    dtype: torch.dtype
    attention: bool

    @property
    def row_bytes(self) -> int:
        return math.prod(self.row_shape) * torch.empty((), dtype=self.dtype).element_size()

    def describe(self) -> dict[str, Any]:
        layout = "[rows, head, key] (one row per query token)" if self.attention else "[rows, ...]"
        return {"row_shape": list(self.row_shape), "dtype": str(self.dtype).removeprefix("torch."),
                "layout": layout}  # fmt: skip


@dataclass
class _Shard:
    number: int
    sentences: list[tuple[int, int]] = field(default_factory=list)  # (batch number, row in batch)
    n_rows: int = 0

    @property
    def file(self) -> str:
        return f"shard-{self.number:05d}.safetensors"


class _ShardWriter:
    """Collects rows per planned shard and writes each shard when its last sentence arrives (memory: the
    shards being filled, at most two in batch order, plus one batch)."""

    def __init__(self, out_dir: Path, plan: list[_Shard], specs: list[_HookSpec], fingerprint: str,
                 skip: set[int]) -> None:  # fmt: skip
        # skip: shards not to write here (already on disk, or another rank's); they count as done
        self.out_dir, self.plan, self.specs, self.fingerprint = out_dir, plan, specs, fingerprint
        self.done = set(skip)
        self.shard_of: dict[tuple[int, int], int] = {}
        self.shards_of_batch: dict[int, set[int]] = {}
        for shard in plan:
            for key in shard.sentences:
                self.shard_of[key] = shard.number
                self.shards_of_batch.setdefault(key[0], set()).add(shard.number)
        self.pending: dict[int, dict[str, list[torch.Tensor]]] = {}
        self.remaining = {s.number: len(s.sentences) for s in plan}

    def batch_is_done(self, batch_number: int) -> bool:
        return self.shards_of_batch.get(batch_number, set()) <= self.done

    def add_batch(self, batch_number: int, batch: Any, cache: Any) -> None:
        mask = batch.attention_mask.bool()  # [batch, pos]
        wanted = [j for j in range(mask.shape[0]) if self.shard_of[(batch_number, j)] not in self.done]
        if not wanted:
            return
        lengths = mask.sum(dim=1).tolist()
        if not all(bool(mask[j, :n].all()) for j, n in enumerate(lengths)):
            raise RuntimeError("capture expects right padding: real tokens first in every row")
        rows = _batch_rows(batch, cache, self.specs)  # {name: [batch, pos, ...]}
        for j in wanted:
            number = self.shard_of[(batch_number, j)]
            store = self.pending.setdefault(number, {})
            for name, t in rows.items():
                store.setdefault(name, []).append(t[j, : lengths[j]])  # real tokens only, never padding (a view)
            self.remaining[number] -= 1
            if self.remaining[number] == 0:
                self._write(number)

    def finish(self) -> None:
        missing = sorted(set(self.remaining) - self.done)
        if missing:
            raise RuntimeError(f"capture bug: shards {missing} never completed")

    def _write(self, number: int) -> None:
        from safetensors.torch import save_file

        store = self.pending.pop(number)
        tensors = {name: torch.cat(parts).contiguous() for name, parts in store.items()}
        path = self.out_dir / self.plan[number].file
        # One metadata key: safetensors writes a multi-key metadata map in varying order, which would
        # make identical shards differ in their bytes.
        metadata = {"bertscope": json.dumps({"format": FORMAT, "fingerprint": self.fingerprint, "shard": number})}
        with io.atomic_path(path) as tmp:
            save_file(tensors, str(tmp), metadata=metadata)
        self.done.add(number)


def _hook_specs(model: Any, names: list[str], batch: Any, key_width: int, device: Any) -> list[_HookSpec]:
    # One tiny forward (first sentence) tells each hook's per-token shape and dtype.
    n = int(batch.attention_mask[0].sum())
    ids = batch.input_ids[:1, :n].to(device)
    with torch.inference_mode():
        _, cache = model.run_with_cache(
            ids, attention_mask=batch.attention_mask[:1, :n].to(device),
            token_type_ids=batch.token_type_ids[:1, :n].to(device), names_filter=names,
        )  # fmt: skip
    specs = []
    for name in names:
        t = cache[name]
        if name.endswith(ATTENTION_SUFFIXES):  # [1, head, query, key] -> row [head, key_width]
            specs.append(_HookSpec(name, (int(t.shape[1]), key_width), t.dtype, True))
        else:  # [1, pos, ...] -> row [...]
            specs.append(_HookSpec(name, tuple(int(d) for d in t.shape[2:]), t.dtype, False))
    return specs


def _plan_shards(batches: list[Any], specs: list[_HookSpec], shard_size: int) -> list[_Shard]:
    # Greedy over whole sentences in batch order: deterministic, and known before any forward pass.
    row_bytes = sum(s.row_bytes for s in specs) + 8 * len(ROW_FIELDS)
    plan = [_Shard(0)]
    for b, batch in enumerate(batches):
        for j, length in enumerate(batch.attention_mask.sum(dim=1).tolist()):
            shard = plan[-1]
            if shard.sentences and (shard.n_rows + length) * row_bytes > shard_size:
                shard = _Shard(len(plan))
                plan.append(shard)
            shard.sentences.append((b, j))
            shard.n_rows += int(length)
    return plan


def _assign_shards(plan: list[_Shard], batches: list[Any], world: int) -> list[int]:
    """The rank writing each shard: contiguous runs of shards, balanced by padded tokens (what a forward
    costs). Contiguous, so a rank runs a contiguous run of batches and only boundary batches run twice."""
    width = [int(b.attention_mask.shape[1]) for b in batches]
    cost = [sum(width[b] for b, _ in s.sentences) for s in plan]
    total, before, owner = sum(cost), 0, []
    for c in cost:
        owner.append(min(world - 1, int((before + c / 2) * world // total)))  # the rank owning its midpoint
        before += c
    return owner


def _run(model: Any, batch: Any, names: list[str], device: Any, stop_at: int | None) -> Any:
    kwargs = {"stop_at_layer": stop_at} if stop_at is not None else {}
    _, cache = model.run_with_cache(
        batch.input_ids.to(device),
        attention_mask=batch.attention_mask.to(device),
        token_type_ids=batch.token_type_ids.to(device),
        names_filter=names,
        cache_device="cpu",
        **kwargs,
    )
    return cache


def _batch_rows(batch: Any, cache: Any, specs: list[_HookSpec]) -> dict[str, torch.Tensor]:
    """Per hook a ``[batch, pos, ...]`` tensor (rows still padded), plus the ``rows.*`` metadata."""
    mask = batch.attention_mask.bool()  # [batch, pos]
    b, p = mask.shape
    lengths = mask.sum(dim=1)
    out: dict[str, torch.Tensor] = {}
    for spec in specs:
        t = cache[spec.name]
        if spec.attention:
            t = rearrange(t, "b h q k -> b q h k")
            key_width = spec.row_shape[1]
            padded = t.new_zeros((b, p, t.shape[2], key_width))
            keep = mask[:, None, None, :]  # zero the padding keys: [b, 1, 1, k]
            padded[..., : t.shape[3]] = torch.where(keep, t, torch.zeros((), dtype=t.dtype))
            t = padded
        out[spec.name] = t
    positions = torch.arange(p).expand(b, p)
    out["rows.sentence_index"] = torch.tensor(batch.sentence_index, dtype=torch.long)[:, None].expand(b, p)
    out["rows.position"] = positions
    out["rows.word_index"] = batch.word_ids.long()
    out["rows.token_id"] = batch.input_ids.long()
    out["rows.token_type"] = batch.token_type_ids.long()
    out["rows.seq_length"] = lengths[:, None].expand(b, p)
    return out


def _last_layer_needed(names: list[str]) -> int | None:
    # Stop the forward after the deepest block any selected hook lives in (embedding-only: block 0).
    layers = []
    for name in names:
        if name.startswith("embed."):
            layers.append(0)
        elif m := re.match(r"blocks\.(\d+)\.", name):
            layers.append(int(m.group(1)))
        else:
            return None  # e.g. ln_final: needs the full forward
    return max(layers)


def _fingerprint(model: Any, corpus: Any, specs: list[_HookSpec], max_length: int, batch_size: int,
                 shard_size: int, device: Any) -> str:  # fmt: skip
    payload = {
        "format": FORMAT,
        "model": model.weights_sha256,
        "corpus": corpus.sha256,
        "hooks": [s.describe() | {"name": s.name} for s in specs],
        "max_length": max_length,
        "batch_size": batch_size,
        "shard_size": shard_size,
        "device": torch.device(device).type,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _prepare_folder(out_dir: Path, fingerprint: str, force: bool) -> str | None:
    """Make ``out_dir`` ready: ``force`` empties it of our files; otherwise a capture with another
    fingerprint there is a problem, returned as a message (``None``: fine). Safe to run on every rank."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for p in out_dir.glob(f".*{io.PARTIAL_SUFFIX}"):  # a killed writer's leftovers
        p.unlink(missing_ok=True)
    if force:
        for p in [out_dir / INDEX, out_dir / SENTENCES, *sorted(out_dir.glob(SHARD_GLOB))]:
            p.unlink(missing_ok=True)  # another rank may have removed it already
        return None
    index = out_dir / INDEX
    foreign = []
    if index.is_file():
        try:
            if io.read_json(index).get("fingerprint") != fingerprint:
                foreign.append(index)
        except ValueError:
            foreign.append(index)
    foreign += [p for p in sorted(out_dir.glob(SHARD_GLOB)) if _shard_fingerprint(p) != fingerprint]
    if foreign:
        return (f"{out_dir} already holds a capture made with other settings ({foreign[0].name}); "
                "use --force to replace it, or choose another --out")  # fmt: skip
    return None


def _shard_metadata(path: Path) -> dict[str, Any]:
    from safetensors import safe_open

    try:
        with safe_open(path, framework="pt") as f:
            return json.loads((f.metadata() or {}).get("bertscope", "{}"))
    except Exception:  # unreadable or truncated file: not ours, not done
        return {}


def _shard_fingerprint(path: Path) -> str | None:
    return _shard_metadata(path).get("fingerprint")


def _shard_is_done(path: Path, fingerprint: str, number: int) -> bool:
    if not path.is_file():
        return False
    meta = _shard_metadata(path)
    return meta.get("fingerprint") == fingerprint and meta.get("shard") == number


def _write_sentences(path: Path, corpus: Any, batches: list[Any]) -> None:
    # One row per corpus sentence, so rows.sentence_index maps back to text; truncation is explicit.
    n_tokens, n_words_kept, truncated = {}, {}, {}
    for batch in batches:
        lengths = batch.attention_mask.sum(dim=1).tolist()
        for j, i in enumerate(batch.sentence_index):
            n_tokens[i], n_words_kept[i] = int(lengths[j]), int(batch.n_words[j])
            truncated[i] = bool(batch.truncated[j])
    table = pd.DataFrame(
        {
            "sentence_index": range(len(corpus)),
            "id": [s.id for s in corpus],
            "text": [s.text for s in corpus],
            "n_words": [len(s.words) for s in corpus],
            "n_words_kept": [n_words_kept.get(i, 0) for i in range(len(corpus))],
            "n_tokens": [n_tokens.get(i, 0) for i in range(len(corpus))],
            "truncated": [truncated.get(i, False) for i in range(len(corpus))],
        }
    )
    io.write_table(table, path, formats=("parquet",))


def _patterns(hooks: str | Sequence[str] | None) -> list[str]:
    if hooks is None:
        return []
    patterns = hooks.split(",") if isinstance(hooks, str) else [str(h) for h in hooks]
    return [p.strip() for p in patterns if p.strip()]


class _StoredHooks:
    """The hook names a capture holds, in the shape ``HookedModule.select_hooks`` expects (``hook_names()``),
    so loading resolves globs with the same implementation as capturing."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = list(names)

    def hook_names(self) -> list[str]:
        return self.names


def _select_stored(index: dict[str, Any], hooks: str | Sequence[str] | None) -> list[str]:
    stored = list(index["hooks"])
    patterns = _patterns(hooks)
    if not patterns:
        return stored
    try:
        return HookedModule.select_hooks(_StoredHooks(stored), patterns)  # type: ignore[arg-type]
    except KeyError as e:
        raise CaptureError(f"{e.args[0]} (the capture holds {', '.join(stored)})") from None


def _iter_rows(out_dir: Path, index: dict[str, Any]) -> Iterator[pd.DataFrame]:
    """Each shard's row table (metadata only: the activations are not read)."""
    from safetensors import safe_open

    for shard in index["shards"]:
        with safe_open(out_dir / shard["file"], framework="pt") as f:
            yield pd.DataFrame({k: f.get_tensor(f"rows.{k}").numpy() for k in index["row_fields"]})


if __name__ == "__main__":
    sys.exit(main())
