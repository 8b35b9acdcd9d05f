"""Reading a finished capture: its index, shard by shard (``iter_capture``) or whole in corpus order
(``load_capture``, also ``bertscope.load_capture``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from bertscope.experiments import io
from bertscope.hooks.hook_points import HookedModule

from .layout import FORMAT, INDEX, SENTENCES, SHARD_GLOB, CaptureError, patterns


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
    names = select_stored(index, hooks)
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
    memory: one shard at a time. The row table has the ``rows.*`` fields (see the package docstring)."""
    from safetensors import safe_open

    out_dir = Path(out_dir)
    index = read_index(out_dir)
    names = select_stored(index, hooks)
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
        if not out_dir.exists():
            raise CaptureError(f"{out_dir} does not exist; give the folder a capture was written to (bertscope "
                               f"capture --hooks ... --out FOLDER)")  # fmt: skip
        if not out_dir.is_dir():
            raise CaptureError(f"{out_dir} is a file; give the folder a capture was written to")
        if not any(out_dir.glob(SHARD_GLOB)):
            raise CaptureError(f"{out_dir} holds no capture (no {INDEX}, no shards); write one there with "
                               f"`bertscope capture --hooks ... --out {out_dir}`")  # fmt: skip
        raise CaptureError(
            f"capture in {out_dir} is unfinished (shards but no {INDEX}); rerun the same `bertscope capture` "
            "command to finish it"
        )
    index = io.read_json(path)
    if index.get("format") != FORMAT:
        raise CaptureError(f"{path}: format {index.get('format')!r}, expected {FORMAT!r}")
    return index


class _StoredHooks:
    """The hook names a capture holds, in the shape ``HookedModule.select_hooks`` expects (``hook_names()``),
    so loading resolves globs with the same implementation as capturing."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = list(names)

    def hook_names(self) -> list[str]:
        return self.names


def select_stored(index: dict[str, Any], hooks: str | Sequence[str] | None) -> list[str]:
    """The stored hook names of a capture's ``index`` matching ``hooks`` (names or globs; ``None``: all), in
    stored order; a pattern matching none is a `CaptureError` naming what the capture holds."""
    stored = list(index["hooks"])
    wanted = patterns(hooks)
    if not wanted:
        return stored
    try:
        return HookedModule.select_hooks(_StoredHooks(stored), wanted)  # type: ignore[arg-type]
    except KeyError as e:
        raise CaptureError(f"{e.args[0]} (the capture holds {', '.join(stored)})") from None


def _iter_rows(out_dir: Path, index: dict[str, Any]) -> Iterator[pd.DataFrame]:
    """Each shard's row table (metadata only: the activations are not read)."""
    from safetensors import safe_open

    for shard in index["shards"]:
        with safe_open(out_dir / shard["file"], framework="pt") as f:
            yield pd.DataFrame({k: f.get_tensor(f"rows.{k}").numpy() for k in index["row_fields"]})


_select_stored = select_stored  # the former private name
