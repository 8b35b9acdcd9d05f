"""Stream activations for a whole corpus to disk: safetensors shards plus an ``index.json``.

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

Memory is bounded by the shard size: shards are planned up front from the token counts (whole sentences,
in batch order), each is written atomically as soon as its last sentence is done and then freed. A rerun
with the same settings skips the shards already on disk (checked by their embedded fingerprint) and
produces the same bytes as an uninterrupted run.

>>> index = capture(model, corpus, "blocks.*.hook_resid_post", "acts", shard_size=parse_size("64MB"))
>>> tensors, rows = load_capture("acts", ["blocks.3.hook_resid_post"])   # [n_rows, d_model], DataFrame
"""

from __future__ import annotations

import datetime as _dt
import fnmatch
import hashlib
import json
import math
import re
import sys
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from bertscope.experiments import io
from bertscope.experiments.io import parse_size  # noqa: F401  (re-exported: capture sizes)
from einops import rearrange

FORMAT = "bertscope-capture/1"
INDEX = "index.json"
SENTENCES = "sentences.parquet"
SHARD_GLOB = "shard-*.safetensors"
ROW_FIELDS = ("sentence_index", "position", "word_index", "token_id", "token_type", "seq_length")
ATTENTION_SUFFIXES = ("hook_scores", "hook_pattern")
DEFAULT_SHARD_SIZE = 256 * 2**20


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
    Returns the index (also written to ``out_dir/index.json``).
    """
    from bertscope.experiments import corpus as corpus_mod

    if shard_size < 1:
        raise CaptureError(f"shard size must be positive, got {shard_size}")
    out_dir = Path(out_dir)
    names = select_hooks(model.hook_names(), hooks)
    with warnings.catch_warnings(record=True) as caught:  # kept in the index; the caller reports truncation
        warnings.simplefilter("always")
        encoded = corpus_mod.encode(corpus, model.tokenizer, max_length=max_length, batch_size=batch_size)
    batches = list(encoded)
    if not batches:
        raise CaptureError(f"corpus {corpus.name!r} has no sentences to capture")
    key_width = max(int(b.attention_mask.shape[1]) for b in batches)
    device = next(model.parameters()).device
    specs = _hook_specs(model, names, batches[0], key_width, device)
    fingerprint = _fingerprint(model, corpus, specs, max_length, batch_size, shard_size, device)
    plan = _plan_shards(batches, specs, shard_size)

    _prepare_folder(out_dir, fingerprint, force)
    index_path = out_dir / INDEX
    if index_path.is_file():  # same fingerprint: complete, unless shards were deleted since
        index = io.read_json(index_path)
        if all((out_dir / s["file"]).is_file() for s in index["shards"]):
            return index
        index_path.unlink()
    done = {s.number for s in plan if _shard_is_done(out_dir / s.file, fingerprint, s.number)}
    writer = _ShardWriter(out_dir, plan, specs, fingerprint, done)
    stop_at = _last_layer_needed(names)

    from tqdm.auto import tqdm

    bar = tqdm(batches, desc="capture", disable=quiet, dynamic_ncols=True, mininterval=0.5, file=sys.stderr)
    with torch.inference_mode():
        for batch_number, batch in enumerate(bar):
            if writer.batch_is_done(batch_number):
                continue
            cache = _run(model, batch, names, device, stop_at)
            writer.add_batch(batch_number, batch, cache)
    writer.finish()

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
        "shards": [
            {"file": s.file, "n_rows": s.n_rows, "n_sentences": len(s.sentences),
             "bytes": (out_dir / s.file).stat().st_size}
            for s in plan
        ],  # fmt: skip
        **(info or {}),
    }
    io.write_json(index_path, index)
    return index


def load_capture(
    out_dir: str | Path, names: Sequence[str] | None = None
) -> tuple[dict[str, torch.Tensor], pd.DataFrame]:
    """All shards of a finished capture, concatenated: ``{hook: [rows, ...]}`` and the row table
    (columns ``ROW_FIELDS`` plus ``shard``). ``names``: hooks to load (default all)."""
    parts: dict[str, list[torch.Tensor]] = {}
    row_tables = []
    for number, (tensors, rows) in enumerate(iter_capture(out_dir, names)):
        for name, t in tensors.items():
            parts.setdefault(name, []).append(t)
        row_tables.append(rows.assign(shard=number))
    tensors = {name: torch.cat(ts) for name, ts in parts.items()}
    return tensors, pd.concat(row_tables, ignore_index=True)


def iter_capture(
    out_dir: str | Path, names: Sequence[str] | None = None
) -> Iterator[tuple[dict[str, torch.Tensor], pd.DataFrame]]:
    """Yield ``({hook: [rows, ...]}, row table)`` shard by shard (memory: one shard at a time)."""
    from safetensors import safe_open

    out_dir = Path(out_dir)
    index = read_index(out_dir)
    wanted = list(index["hooks"]) if names is None else list(names)
    unknown = [n for n in wanted if n not in index["hooks"]]
    if unknown:
        raise CaptureError(f"{out_dir} has no capture of {unknown}; it holds {list(index['hooks'])}")
    for shard in index["shards"]:
        with safe_open(out_dir / shard["file"], framework="pt") as f:
            tensors = {n: f.get_tensor(n) for n in wanted}
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


def select_hooks(available: Sequence[str], hooks: str | Sequence[str]) -> list[str]:
    """Hook names matching any of ``hooks`` (names or globs; a string may be comma-separated), in
    forward order. A pattern that matches nothing is an error naming close matches."""
    patterns = [p.strip() for p in hooks.split(",")] if isinstance(hooks, str) else [str(p) for p in hooks]
    patterns = [p for p in patterns if p]
    if not patterns:
        raise CaptureError("no hook given; pass --hooks with a name or glob such as 'blocks.*.hook_resid_post'")
    chosen: set[str] = set()
    for pattern in patterns:
        matched = [n for n in available if fnmatch.fnmatchcase(n, pattern)]
        if not matched:
            tail = pattern.rsplit(".", 1)[-1].strip("*")
            close = [n for n in available if tail and tail in n][:4]
            hint = f"; close names: {', '.join(close)}" if close else "; `bertscope info` lists the names"
            raise CaptureError(f"--hooks {pattern!r} matches no hook point{hint}")
        chosen.update(matched)
    return [n for n in available if n in chosen]


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
    """Collects rows per planned shard and writes each shard when its last sentence arrives."""

    def __init__(self, out_dir: Path, plan: list[_Shard], specs: list[_HookSpec], fingerprint: str,
                 done: set[int]) -> None:  # fmt: skip
        self.out_dir, self.plan, self.specs, self.fingerprint = out_dir, plan, specs, fingerprint
        self.done = set(done)
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
        rows = _batch_rows(batch, cache, self.specs)  # {name: [batch, pos, ...]}
        mask = batch.attention_mask.bool()
        for j in range(mask.shape[0]):
            number = self.shard_of[(batch_number, j)]
            if number in self.done:
                continue
            store = self.pending.setdefault(number, {})
            for name, t in rows.items():
                store.setdefault(name, []).append(t[j][mask[j]])  # real tokens only, never padding
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


def _prepare_folder(out_dir: Path, fingerprint: str, force: bool) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    io.remove_partials(out_dir, recursive=False)
    ours = [out_dir / INDEX, out_dir / SENTENCES, *sorted(out_dir.glob(SHARD_GLOB))]
    existing = [p for p in ours if p.is_file()]
    if force:
        for p in existing:
            p.unlink()
        return
    index = out_dir / INDEX
    foreign = []
    if index.is_file():
        try:
            if io.read_json(index).get("fingerprint") != fingerprint:
                foreign.append(index)
        except ValueError:
            foreign.append(index)
    foreign += [p for p in out_dir.glob(SHARD_GLOB) if _shard_fingerprint(p) != fingerprint]
    if foreign:
        raise CaptureError(
            f"{out_dir} already holds a capture made with other settings ({foreign[0].name}); "
            "use --force to replace it, or choose another --out"
        )


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
