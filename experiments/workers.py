"""Independent items of work spread over forked worker processes: ``map_forked(fn, items, workers)`` returns
``[fn(item) for item in items]``, in order, whatever worker ran each item.

Used by the heads experiment (the attention pass by batch, the ablation and pruning forwards by sentence;
`heads.parallel.map_sentences`) and the structure experiment (its training passes). Workers are forked (they
share the parent's model and inputs copy-on-write) and run torch on one thread each. Small operations scale
worse over torch's intra-op threads than whole items over processes (every operation is a barrier for the
threads; a process never waits for the other), most of all on a loaded machine. Results are bit-identical run
to run; against the in-process loop they differ only by the rounding of a one-thread vs. multi-thread matrix
product (~1e-7). A worker that dies (killed for memory, a crash in native code) stops the map with an error,
never a wait.
"""

from __future__ import annotations

import multiprocessing
import signal
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import torch

_TASK: tuple[Callable[[Any], Any], Sequence[Any]] | None = None  # set in the parent before the fork


def map_forked(
    fn: Callable[[Any], Any],
    items: Sequence[Any],
    workers: int = 1,
    progress: Callable[[Iterable[Any]], Iterable[Any]] | None = None,
    device: torch.device | str = "cpu",
) -> list[Any]:
    """``[fn(item) for item in items]``; with ``workers > 1``, on a platform that can fork and a CPU ``device``
    (the device ``fn`` computes on: a forked copy of a process holding an accelerator context is unusable), over
    that many forked single-threaded processes. ``fn`` must return picklable values (numpy arrays);
    ``progress`` wraps the results as they arrive (e.g. a tqdm bar)."""
    wrap = progress if progress is not None else (lambda it: it)
    forkable = torch.device(device).type == "cpu" and "fork" in multiprocessing.get_all_start_methods()
    if workers <= 1 or len(items) < 2 or not forkable:
        return list(wrap(fn(item) for item in items))
    context = multiprocessing.get_context("fork")
    pool = ProcessPoolExecutor(min(workers, len(items)), mp_context=context, initializer=_worker_start)
    global _TASK
    _TASK = (fn, items)  # the workers fork at the first submit, after this
    try:
        return list(wrap(pool.map(_run, range(len(items)))))
    except BrokenProcessPool as error:
        raise RuntimeError(f"a worker process of map_forked died ({error}); rerun with workers=1 to see "
                           "the failure in this process") from None
    finally:  # on an error or Ctrl-C, items not yet started are dropped rather than waited for
        pool.shutdown(wait=True, cancel_futures=True)
        _TASK = None


def _worker_start() -> None:
    """One torch thread; SIGTERM ends the worker whatever handler the parent had installed (the executor stops
    the workers of a broken pool with it)."""
    torch.set_num_threads(1)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _run(i: int) -> Any:
    assert _TASK is not None, "map_forked: the task was not set before the fork"
    fn, items = _TASK
    return fn(items[i])
