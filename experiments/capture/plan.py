"""Planning a capture before any forward pass: each hook's row shape and dtype, the shards (whole sentences
in batch order, bounded in bytes), which rank writes which shard, how deep the forward must go, and the
fingerprint that tells a resumable capture from a foreign one."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from bertscope.hooks.sites import is_attention_site, last_block

from .layout import (
    AUTO_SHARDS,
    DEFAULT_SHARD_SIZE,
    FORMAT,
    MIN_AUTO_SHARD_SIZE,
    ROW_FIELDS,
    shard_file,
)


@dataclass(frozen=True)
class HookSpec:
    """One captured hook: its per-row shape (``[head, key_width]`` for attention hooks) and dtype."""

    name: str
    row_shape: tuple[int, ...]
    dtype: torch.dtype
    attention: bool

    @property
    def row_bytes(self) -> int:
        """Bytes one row of this hook takes."""
        return math.prod(self.row_shape) * torch.empty((), dtype=self.dtype).element_size()

    def describe(self) -> dict[str, Any]:
        """The hook's entry in ``index.json``."""
        layout = "[rows, head, key] (one row per query token)" if self.attention else "[rows, ...]"
        return {"row_shape": list(self.row_shape), "dtype": str(self.dtype).removeprefix("torch."),
                "layout": layout}  # fmt: skip


@dataclass
class Shard:
    """A planned shard: the sentences it holds as ``(batch number, row in batch)``, and its token rows."""

    number: int
    sentences: list[tuple[int, int]] = field(default_factory=list)
    n_rows: int = 0

    @property
    def file(self) -> str:
        """Its file name in the capture folder."""
        return shard_file(self.number)


def hook_specs(model: Any, names: list[str], batch: Any, key_width: int, device: Any) -> list[HookSpec]:
    """Each hook's per-token shape and dtype, from one tiny forward of the batch's first sentence."""
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
        if is_attention_site(name):  # [1, head, query, key] -> row [head, key_width]
            specs.append(HookSpec(name, (int(t.shape[1]), key_width), t.dtype, True))
        else:  # [1, pos, ...] -> row [...]
            specs.append(HookSpec(name, tuple(int(d) for d in t.shape[2:]), t.dtype, False))
    return specs


def row_bytes(specs: list[HookSpec]) -> int:
    """Bytes one token row takes in a shard: every hook's row plus the ``rows.*`` metadata (int64 each)."""
    return sum(s.row_bytes for s in specs) + 8 * len(ROW_FIELDS)


def auto_shard_size(batches: list[Any], specs: list[HookSpec]) -> int:
    """The shard size when none is given: the capture's bytes over ``AUTO_SHARDS`` (enough shards to deal
    out among processes, and less memory), within ``MIN_AUTO_SHARD_SIZE`` .. ``DEFAULT_SHARD_SIZE``. It
    depends on the capture alone, never on the number of processes, so any ``--nproc`` plans the same shards."""
    n_rows = sum(int(b.attention_mask.sum()) for b in batches)
    wanted = math.ceil(n_rows * row_bytes(specs) / AUTO_SHARDS)
    return min(DEFAULT_SHARD_SIZE, max(MIN_AUTO_SHARD_SIZE, wanted))


def plan_shards(batches: list[Any], specs: list[HookSpec], shard_size: int) -> list[Shard]:
    """Greedy over whole sentences in batch order: deterministic, and known before any forward pass."""
    row_size = row_bytes(specs)
    plan = [Shard(0)]
    for b, batch in enumerate(batches):
        for j, length in enumerate(batch.attention_mask.sum(dim=1).tolist()):
            shard = plan[-1]
            if shard.sentences and (shard.n_rows + length) * row_size > shard_size:
                shard = Shard(len(plan))
                plan.append(shard)
            shard.sentences.append((b, j))
            shard.n_rows += int(length)
    return plan


def assign_shards(plan: list[Shard], batches: list[Any], world: int) -> list[int]:
    """The rank writing each shard: contiguous runs of shards balanced by padded tokens (what a forward
    costs), see `balanced_runs`. Contiguous, so a rank runs a contiguous run of batches and only boundary
    batches run twice."""
    width = [int(b.attention_mask.shape[1]) for b in batches]
    return balanced_runs([sum(width[b] for b, _ in s.sentences) for s in plan], world)


def balanced_runs(cost: list[int], world: int) -> list[int]:
    """Deal items of positive ``cost`` out to ``world`` ranks in contiguous runs, in order: the owner of each
    item. The costliest run is as cheap as contiguous runs allow (the least bound that a greedy fill
    meets with ``world`` runs, found by bisection), and every rank gets an item while there are as many
    items as ranks (a fill that would leave a later rank empty hands on early instead)."""
    n = len(cost)
    if world <= 1 or n == 0:
        return [0] * n
    lo, hi = max(cost), sum(cost)
    while lo < hi:  # the least bound for which the greedy fill needs at most `world` runs
        mid = (lo + hi) // 2
        if _greedy_runs(cost, mid) <= world:
            hi = mid
        else:
            lo = mid + 1
    owner, rank, load = [], 0, 0
    for i, c in enumerate(cost):
        if load and rank < world - 1 and (load + c > lo or n - i <= world - 1 - rank):
            rank, load = rank + 1, 0
        owner.append(rank)
        load += c
    return owner


def _greedy_runs(cost: list[int], bound: int) -> int:
    """How many contiguous runs, each filled up to ``bound``, hold ``cost`` (each item at most ``bound``)."""
    runs, load = 1, 0
    for c in cost:
        if load + c > bound:
            runs, load = runs + 1, 0
        load += c
    return runs


def last_layer_needed(names: list[str]) -> int | None:
    """The deepest block any selected hook lives in (embedding-only: block 0), so the forward can stop
    there; ``None`` when a hook needs the full forward (e.g. ``ln_final``)."""
    return last_block(names)


def fingerprint(model: Any, corpus: Any, specs: list[HookSpec], max_length: int, batch_size: int,
                shard_size: int, device: Any) -> str:  # fmt: skip
    """sha256 of everything that decides a shard's bytes: model and corpus hashes, hooks, sizes, device type."""
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
