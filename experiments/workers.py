"""Forked workers, ordered results: ``map_forked(fn, items, workers)`` returns
``[fn(item) for item in items]``, in order, whatever worker ran each item.

Kept as the name the heads experiment and its tests use; the mechanism is the job service's
(`experiments.jobs.map_ordered`, the one worker mechanism: forked workers sharing this process's thread budget,
`experiments.jobs.worker_threads`, a worker that dies stops the map with an error). In this process the items run
on the caller's threads, so against the workers the results differ only by the rounding of matrix products on
another number of threads (~1e-7).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from bertscope.experiments.jobs import map_ordered


def map_forked(
    fn: Callable[[Any], Any],
    items: Sequence[Any],
    workers: int = 1,
    progress: Callable[[Iterable[Any]], Iterable[Any]] | None = None,
    device: Any = "cpu",
) -> list[Any]:
    """``[fn(item) for item in items]``; with ``workers > 1``, on a platform that can fork and a CPU ``device``,
    over that many forked processes, each on its share of this process's threads (`experiments.jobs.map_ordered`
    with ``threads=None``).
    ``fn`` must return picklable values (numpy arrays); ``progress`` wraps the results as they arrive, in
    order (e.g. a tqdm bar)."""
    return map_ordered(fn, items, workers=workers, threads=None, progress=progress, device=device)
