"""``capture``: run the model over a corpus and stream the activations at the selected hooks to shards,
in one process or as one rank of many; resumes a partial capture with the same settings."""

from __future__ import annotations

import datetime as _dt
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from bertscope.experiments import activations as stage
from bertscope.experiments import io

from .distributed import Group
from .layout import FORMAT, INDEX, ROW_FIELDS, SENTENCES, CaptureError, select_hooks
from .plan import Shard, assign_shards, auto_shard_size, fingerprint, hook_specs, last_layer_needed, plan_shards
from .writer import ShardWriter, prepare_folder, shard_is_done, write_sentences


def capture(
    model: Any,
    corpus: Any,
    hooks: str | Sequence[str],
    out_dir: str | Path,
    *,
    max_length: int = 128,
    batch_size: int = 32,
    shard_size: int | None = None,
    force: bool = False,
    quiet: bool = False,
    info: dict[str, Any] | None = None,
    encoded: Any = None,
    batch_hooks: Sequence[Sequence[tuple[Any, Any]]] | None = None,
) -> dict[str, Any]:
    """Capture the activations at ``hooks`` for every sentence of ``corpus`` into ``out_dir``.

    ``hooks``: hook names or globs (a comma-separated string or a list). ``shard_size``: bytes per shard
    (a shard holds at least one sentence); ``None`` picks one from the capture's size alone (about
    ``AUTO_SHARDS`` shards of 32 MiB to 256 MiB, see ``plan.auto_shard_size``), the same for any number of
    processes. ``force`` discards what ``out_dir`` holds; without it a capture
    with other settings in ``out_dir`` is an error, a finished identical one is returned as is, and a
    partial identical one is resumed. ``info`` is stored in the index (model/corpus descriptions, options).
    ``encoded``: the corpus already encoded (e.g. `activations.encode_sequences` of token windows, whose
    stand-in sentences are then ``corpus``), batched as it is; ``batch_hooks``: per batch of it, ``fwd_hooks``
    run during that batch's forward (an intervention; the sentence ids should say which).

    When ``torch.distributed`` is initialised, every rank of the default group must call this with the same
    arguments; each writes its share of the shards and rank 0 writes the index (see the package docstring).

    Returns the index (as written to ``out_dir/index.json``) plus ``"run"``, what this call did:
    ``already_complete``, ``shards_written``, ``shards_reused``, ``world_size`` and per rank ``ranks``
    (``shards``, ``rows`` computed, ``seconds``, ``tokens_per_s``).
    """
    if shard_size is not None and shard_size < 1:
        raise CaptureError(f"shard size must be positive, got {shard_size}")
    group = Group.current()
    out_dir = Path(out_dir)
    names = select_hooks(model, hooks)
    if encoded is None:
        encoded, batches, caught = _encode(model, corpus, max_length, batch_size)
    else:
        batches, caught = list(encoded), []
    if batch_hooks is not None and len(batch_hooks) != len(batches):
        raise ValueError("batch_hooks must give one list of hooks per batch")
    key_width = max(int(b.attention_mask.shape[1]) for b in batches)
    device = next(model.parameters()).device
    specs = hook_specs(model, names, batches[0], key_width, device)
    shard_size = auto_shard_size(batches, specs) if shard_size is None else shard_size
    fp = fingerprint(model, corpus, specs, max_length, batch_size, shard_size, device)
    plan = plan_shards(batches, specs, shard_size)
    mine, on_disk, existing = _claim_shards(out_dir, plan, batches, fp, force, group)
    if existing is not None:
        run = {"already_complete": True, "shards_written": 0, "shards_reused": len(plan),
               "world_size": group.world, "ranks": []}  # fmt: skip
        return existing | {"run": run}

    writer = ShardWriter(out_dir, plan, specs, fp, skip={s.number for s in plan} - (mine - on_disk))
    n_rows, seconds = _forward_all(model, batches, writer, names, quiet=quiet or group.rank != 0,
                                   batch_hooks=batch_hooks)  # fmt: skip
    ranks = group.gather(_rank_stats(group.rank, mine, on_disk, n_rows, seconds, out_dir, plan))
    shard_bytes = {n: b for r in ranks for n, b in r.pop("bytes").items()}

    index = None
    if group.rank == 0:
        write_sentences(out_dir / SENTENCES, corpus, batches)
        index = _index(fp, specs, plan, shard_bytes, corpus, encoded, caught, key_width, group, info,
                       max_length=max_length, batch_size=batch_size, shard_size=shard_size)  # fmt: skip
        io.write_json(out_dir / INDEX, index)
    index = group.broadcast(index)
    written = sum(r["shards_written"] for r in ranks)
    run = {"already_complete": False, "shards_written": written, "shards_reused": len(plan) - written,
           "world_size": group.world, "ranks": ranks}  # fmt: skip
    return index | {"run": run}


def _claim_shards(out_dir: Path, plan: list[Shard], batches: list[Any], fp: str, force: bool,
                  group: Group) -> tuple[set[int], set[int], dict[str, Any] | None]:  # fmt: skip
    """This rank's shards, those of them already on disk, and the finished index when the whole capture is
    complete already (else ``None``; a stale index of a partial capture is removed)."""
    owner = assign_shards(plan, batches, group.world)
    mine = {s.number for s in plan if owner[s.number] == group.rank}
    # Every rank checks the folder; nobody writes a shard before all have (a forced rerun deletes first).
    problems = [p for p in group.gather(prepare_folder(out_dir, fp, force)) if p]
    if problems:
        raise CaptureError(problems[0])
    index_path = out_dir / INDEX
    existing = io.read_json(index_path) if index_path.is_file() else None
    on_disk = {n for n in mine if shard_is_done(out_dir / plan[n].file, fp, n)}
    # Complete: rank 0 has the index and every rank its shards (on a folder that is not shared, too).
    if all(group.gather(on_disk == mine and (existing is not None or group.rank != 0))):
        return mine, on_disk, group.broadcast(existing)
    group.barrier()  # every rank has read the old index before rank 0 removes it
    if group.rank == 0 and index_path.is_file():  # same fingerprint, but shards were deleted since
        index_path.unlink()
    return mine, on_disk, None


def _rank_stats(rank: int, mine: set[int], on_disk: set[int], n_rows: int, seconds: float, out_dir: Path,
                plan: list[Shard]) -> dict[str, Any]:  # fmt: skip
    """What this rank did, for the ``run`` entry of the result (``bytes``: its shards' sizes)."""
    return {"rank": rank, "shards": len(mine), "shards_written": len(mine - on_disk),
            "rows": n_rows, "seconds": round(seconds, 3),
            "tokens_per_s": round(n_rows / seconds, 1) if seconds > 0 else None,
            "bytes": {n: (out_dir / plan[n].file).stat().st_size for n in sorted(mine)}}  # fmt: skip


def _encode(model: Any, corpus: Any, max_length: int, batch_size: int) -> tuple[Any, list[Any], list[Any]]:
    """The corpus encoded and batched (longest first), with the warnings it raised (kept in the index; the
    caller reports truncation)."""
    from bertscope.experiments import corpus as corpus_mod

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            encoded = corpus_mod.encode(corpus, model.tokenizer, max_length=max_length, batch_size=batch_size)
        except ValueError as e:  # CorpusError included: e.g. --max-length too small for a first word
            raise CaptureError(str(e)) from e
    batches = list(encoded)
    if not batches:
        raise CaptureError(f"corpus {corpus.name!r} has no sentences to capture")
    return encoded, batches, list(caught)


def _forward_all(model: Any, batches: list[Any], writer: ShardWriter, names: list[str],
                 *, quiet: bool, batch_hooks: Sequence[Sequence[tuple[Any, Any]]] | None = None,
                 ) -> tuple[int, float]:  # fmt: skip
    """Run every batch some unfinished shard of this rank needs, handing the rows to ``writer``; returns
    (token rows run, seconds)."""
    from tqdm.auto import tqdm

    todo = [b for b in range(len(batches)) if not writer.batch_is_done(b)]
    stop_at = last_layer_needed(names)
    bar = tqdm(todo, desc="capture", disable=quiet or not sys.stderr.isatty(),
               dynamic_ncols=True, mininterval=0.5, file=sys.stderr)  # fmt: skip
    started, n_rows = time.perf_counter(), 0
    with torch.inference_mode():
        for batch_number in bar:
            batch = batches[batch_number]
            cache = _run(model, batch, names, stop_at, () if batch_hooks is None else batch_hooks[batch_number])
            writer.add_batch(batch_number, batch, cache)
            n_rows += int(batch.attention_mask.sum())
    writer.finish()
    return n_rows, time.perf_counter() - started


def _run(model: Any, batch: Any, names: list[str], stop_at: int | None, fwd_hooks: Sequence[Any] = ()) -> Any:
    """One batch's forward through the activations stage (`activations.run_batch`), cached on the CPU."""
    return stage.run_batch(model, batch, names, stop_at_layer=stop_at, cache_device="cpu", fwd_hooks=fwd_hooks)


def _index(fp: str, specs: list[Any], plan: list[Shard], shard_bytes: dict[int, int], corpus: Any,
           encoded: Any, caught: list[Any], key_width: int, group: Group, info: dict[str, Any] | None,
           **sizes: int) -> dict[str, Any]:  # fmt: skip
    """The ``index.json`` of a finished capture (``sizes``: max_length, batch_size, shard_size)."""
    return {
        "format": FORMAT,
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "fingerprint": fp,
        "hooks": {s.name: s.describe() for s in specs},
        "row_fields": list(ROW_FIELDS),
        "key_width": key_width,
        "n_rows": sum(s.n_rows for s in plan),
        "n_sentences": len(corpus),
        "n_truncated": encoded.n_truncated,
        "warnings": [str(w.message) for w in caught],
        "max_length": sizes["max_length"],
        "batch_size": sizes["batch_size"],
        "shard_size": sizes["shard_size"],
        "world_size": group.world,
        "shards": [
            {"file": s.file, "n_rows": s.n_rows, "n_sentences": len(s.sentences), "bytes": shard_bytes[s.number]}
            for s in plan
        ],
        **(info or {}),
    }
