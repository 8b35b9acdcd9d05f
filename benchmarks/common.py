"""Shared helpers for the benchmark scripts (not part of the installed package)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def make_batch(batch: int, length: int, vocab: int, device: torch.device, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random word-piece ids framed by [CLS] ... [SEP], no padding: ``[batch, length]``."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, vocab, (batch, length), generator=g)
    ids[:, 0], ids[:, -1] = 101, 102
    return {
        "input_ids": ids.to(device),
        "attention_mask": torch.ones_like(ids).to(device),
        "token_type_ids": torch.zeros_like(ids).to(device),
    }


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_interleaved(
    fns: dict[str, Callable[[], object]], device: torch.device, repeats: int, warmup: int = 2
) -> dict[str, float]:
    """Median seconds per call of each function, measured round-robin so that machine drift hits all alike.

    The order rotates every round, so no function always runs right after the same neighbour (a run after
    one that freed large buffers pays for fresh pages).
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    sync(device)
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            fn = fns[name]
            sync(device)
            start = time.perf_counter()
            fn()
            sync(device)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def reference_model(path: str, impl: str, device: torch.device):
    from transformers import BertModel

    return BertModel.from_pretrained(path, attn_implementation=impl).to(device).eval()
