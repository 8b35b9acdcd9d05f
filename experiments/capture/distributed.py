"""The ranks of a capture under ``torch.distributed``: joining torchrun's process group, and the few
collectives a capture needs (gather, broadcast, barrier); one process is a group of one."""

from __future__ import annotations

import datetime as _dt
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

COLLECTIVE_TIMEOUT = _dt.timedelta(hours=24)  # ranks that finish early wait this long for the others


@contextmanager
def process_group(device: str) -> Iterator[str]:
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
class Group:
    """The ranks taking part: ``torch.distributed``'s default group when initialised, else this process."""

    rank: int = 0
    world: int = 1

    @classmethod
    def current(cls) -> Group:
        """The default process group if initialised, else a group of one."""
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
