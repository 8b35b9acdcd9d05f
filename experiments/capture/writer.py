"""Writing a capture folder: rows of a batch to their planned shards (each written atomically when its last
sentence arrives), the folder check before a run, the shard metadata that makes resuming safe, and
``sentences.parquet``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from bertscope.experiments import io
from einops import rearrange

from .layout import FORMAT, INDEX, SENTENCES, SHARD_GLOB
from .plan import HookSpec, Shard


class ShardWriter:
    """Collects rows per planned shard and writes each shard when its last sentence arrives (memory: the
    shards being filled, at most two in batch order, plus one batch).

    ``skip``: shards not to write here (already on disk, or another rank's); they count as done.
    """

    def __init__(self, out_dir: Path, plan: list[Shard], specs: list[HookSpec], fingerprint: str,
                 skip: set[int]) -> None:  # fmt: skip
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
        """Whether every shard this batch feeds is done (so it need not run)."""
        return self.shards_of_batch.get(batch_number, set()) <= self.done

    def add_batch(self, batch_number: int, batch: Any, cache: Any) -> None:
        """Take the real-token rows of a batch's forward (``cache``) for the shards not done yet."""
        mask = batch.attention_mask.bool()  # [batch, pos]
        wanted = [j for j in range(mask.shape[0]) if self.shard_of[(batch_number, j)] not in self.done]
        if not wanted:
            return
        lengths = mask.sum(dim=1).tolist()
        if not all(bool(mask[j, :n].all()) for j, n in enumerate(lengths)):
            raise RuntimeError("capture expects right padding: real tokens first in every row")
        rows = batch_rows(batch, cache, self.specs)  # {name: [batch, pos, ...]}
        for j in wanted:
            number = self.shard_of[(batch_number, j)]
            store = self.pending.setdefault(number, {})
            for name, t in rows.items():
                store.setdefault(name, []).append(t[j, : lengths[j]])  # real tokens only, never padding (a view)
            self.remaining[number] -= 1
            if self.remaining[number] == 0:
                self._write(number)

    def finish(self) -> None:
        """Check that every shard of the plan was written or skipped."""
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


def batch_rows(batch: Any, cache: Any, specs: list[HookSpec]) -> dict[str, torch.Tensor]:
    """Per hook a ``[batch, pos, ...]`` tensor (rows still padded; attention hooks as ``[batch, query, head,
    key_width]`` with padding keys zeroed), plus the ``rows.*`` metadata as ``[batch, pos]``."""
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


def prepare_folder(out_dir: Path, fingerprint: str, force: bool) -> str | None:
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
    foreign += [p for p in sorted(out_dir.glob(SHARD_GLOB)) if shard_metadata(p).get("fingerprint") != fingerprint]
    if foreign:
        return (f"{out_dir} already holds a capture made with other settings ({foreign[0].name}); "
                "use --force to replace it, or choose another --out")  # fmt: skip
    return None


def shard_metadata(path: Path) -> dict[str, Any]:
    """The ``bertscope`` metadata a shard carries (format, fingerprint, shard number); ``{}`` if unreadable."""
    from safetensors import safe_open

    try:
        with safe_open(path, framework="pt") as f:
            return json.loads((f.metadata() or {}).get("bertscope", "{}"))
    except Exception:  # unreadable or truncated file: not ours, not done
        return {}


def shard_is_done(path: Path, fingerprint: str, number: int) -> bool:
    """Whether ``path`` is shard ``number`` of the capture with this fingerprint, complete on disk."""
    if not path.is_file():
        return False
    meta = shard_metadata(path)
    return meta.get("fingerprint") == fingerprint and meta.get("shard") == number


def write_sentences(path: Path, corpus: Any, batches: list[Any]) -> None:
    """``sentences.parquet``: one row per corpus sentence, so ``rows.sentence_index`` maps back to text;
    truncation is explicit."""
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
