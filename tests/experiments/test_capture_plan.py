"""Capture planning without a forward pass: shards are dealt out to ranks in contiguous runs, as evenly as
contiguous runs allow and with every rank given work while there are as many shards as ranks; the automatic
shard size depends on the capture alone (never on the number of processes)."""

from __future__ import annotations

import itertools
import random
from types import SimpleNamespace

import pytest
import torch
from bertscope.experiments import cli
from bertscope.experiments.capture import command, layout, plan


def batches_of(lengths: list[int], batch_size: int) -> list[SimpleNamespace]:
    """Right-padded batches (only ``attention_mask`` matters to the planner), longest first."""
    lengths = sorted(lengths, reverse=True)
    out = []
    for start in range(0, len(lengths), batch_size):
        chunk = lengths[start : start + batch_size]
        mask = torch.zeros(len(chunk), chunk[0], dtype=torch.long)
        for j, n in enumerate(chunk):
            mask[j, :n] = 1
        out.append(SimpleNamespace(attention_mask=mask))
    return out


SPECS = [plan.HookSpec(f"blocks.{i}.hook_resid_post", (384,), torch.float32, False) for i in range(6)]


def best_bottleneck(cost: list[int], world: int) -> int:
    """The least possible cost of the costliest run, over every way to cut ``cost`` into contiguous runs."""
    n = len(cost)
    best = sum(cost)
    for cuts in itertools.combinations(range(1, n), min(world, n) - 1):
        bounds = [0, *cuts, n]
        best = min(best, max(sum(cost[a:b]) for a, b in itertools.pairwise(bounds)))
    return best


def test_balanced_runs_known_answers() -> None:
    assert plan.balanced_runs([1] * 6, 4) == [0, 0, 1, 1, 2, 3]
    # a midpoint rule gave ranks 0, 2, 3, 3 here (rank 1 idle although there are as many shards as ranks)
    assert plan.balanced_runs([10, 10, 1, 1], 4) == [0, 1, 2, 3]
    assert plan.balanced_runs([3, 1, 1, 1, 1, 1], 2) == [0, 0, 1, 1, 1, 1]
    assert plan.balanced_runs([5, 5], 4) == [0, 1]  # fewer shards than ranks: ranks 2 and 3 idle
    assert plan.balanced_runs([7, 1, 1], 1) == [0, 0, 0]
    assert plan.balanced_runs([], 3) == []


def test_balanced_runs_are_contiguous_optimal_and_give_every_rank_work() -> None:
    rng = random.Random(0)
    for _ in range(1500):
        cost = [rng.randint(1, 20) for _ in range(rng.randint(1, 9))]
        world = rng.randint(1, 6)
        owner = plan.balanced_runs(cost, world)
        assert owner[0] == 0 and all(b - a in (0, 1) for a, b in itertools.pairwise(owner)), (cost, world, owner)
        assert set(owner) == set(range(min(world, len(cost)))), (cost, world, owner)  # no rank idle if avoidable
        loads = [sum(c for c, r in zip(cost, owner, strict=True) if r == rank) for rank in range(world)]
        assert max(loads) == best_bottleneck(cost, world), (cost, world, owner)


def test_assign_shards_balances_padded_tokens_of_a_real_plan() -> None:
    rng = random.Random(1)
    batches = batches_of([rng.randint(5, 120) for _ in range(3000)], 32)
    shards = plan.plan_shards(batches, SPECS, 16 * 2**20)
    width = [int(b.attention_mask.shape[1]) for b in batches]
    cost = [sum(width[b] for b, _ in s.sentences) for s in shards]
    assert len(shards) >= 16
    for world in (2, 3, 4, 8, len(shards)):
        owner = plan.assign_shards(shards, batches, world)
        loads = [sum(c for c, r in zip(cost, owner, strict=True) if r == rank) for rank in range(world)]
        assert min(loads) > 0, world
        # within one shard of an even split
        assert max(loads) <= sum(cost) / world + max(cost), (world, loads)


def test_auto_shard_size_depends_on_the_capture_alone() -> None:
    row = plan.row_bytes(SPECS)
    assert row == 6 * 384 * 4 + 8 * len(layout.ROW_FIELDS)
    small = batches_of([20] * 100, 32)  # 2,000 rows, 19 MB: one shard at the floor
    assert plan.auto_shard_size(small, SPECS) == layout.MIN_AUTO_SHARD_SIZE
    assert len(plan.plan_shards(small, SPECS, plan.auto_shard_size(small, SPECS))) == 1
    mid = batches_of([50] * 6000, 32)  # 300,000 rows, 2.8 GB: about 64 shards of 43 MB
    size = plan.auto_shard_size(mid, SPECS)
    assert layout.MIN_AUTO_SHARD_SIZE < size < layout.DEFAULT_SHARD_SIZE
    # whole sentences per shard: a shard may end up to a sentence short of the size, hence one more
    assert len(plan.plan_shards(mid, SPECS, size)) in (layout.AUTO_SHARDS, layout.AUTO_SHARDS + 1)
    huge = batches_of([100] * 40000, 256)  # 4,000,000 rows, 37 GB: capped at 256 MiB
    assert plan.auto_shard_size(huge, SPECS) == layout.DEFAULT_SHARD_SIZE


def test_shard_size_option_takes_auto_or_a_size() -> None:
    parser = cli.build_parser()
    base = ["capture", "--hooks", "embed.hook_out"]
    assert parser.parse_args(base).shard_size is None
    assert parser.parse_args([*base, "--shard-size", "auto"]).shard_size is None
    assert parser.parse_args([*base, "--shard-size", "64MB"]).shard_size == 64_000_000


@pytest.mark.parametrize("shards_per_rank", [(2, 1), (1, 0)])
def test_idle_processes_are_warned_about(shards_per_rank: tuple[int, int]) -> None:
    ranks = [{"rank": r, "shards": n} for r, n in enumerate(shards_per_rank)]
    shards = [{"bytes": 1000}] * sum(shards_per_rank)
    index = {"shards": shards, "shard_size": 1024, "run": {"world_size": 2, "ranks": ranks}}
    warning = command.idle_warning(index)
    if shards_per_rank[1]:
        assert warning is None
    else:
        assert warning is not None and "1 of 2 processes had no shard" in warning and "at most 500 " in warning
