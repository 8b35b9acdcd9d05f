"""Independent probes of the positions run on several worker processes, with the serial run's results.

Every probe of the positions run is a pure function of arrays (features, labels, groups, a seed) and runs with
one BLAS thread (``Settings.blas_threads``), so probes can run side by side on separate cores. `parallel_map`
runs a list of argument-free callables on ``n_jobs`` worker processes (joblib's loky backend: cloudpickle
carries closures such as a control-label function, arrays over 1 MB travel as memory maps) and yields
``(index, result)`` as each one finishes; each worker caps its BLAS/OpenMP threads exactly as the serial run
does, so every result is bit for bit the serial one (`tests/test_positions_parallel.py`). The longest jobs
(``cost``) start first, so the last worker does not run one long probe alone at the end of a step.

`Job` is one cached probe step (its step name and key, the callable that computes it in a worker, and the
``post`` that labels the result in the run's process); `run_jobs` computes the jobs not yet cached in
parallel and writes each to the step cache as soon as it arrives, so Ctrl-C keeps every finished probe.

Threads were the other choice; processes were kept because scikit-learn's L-BFGS loop holds the GIL between
its matrix products. A worker costs one start (imports: about 5 CPU s) per run: the pool is reused by every
step of the run.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")


def default_jobs() -> int:
    """The number of CPU cores this process may run on (its affinity mask; ``os.cpu_count()`` elsewhere)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def parallel_map(
    fns: Sequence[Callable[[], T]],
    *,
    n_jobs: int | None,
    threads: int | None = 1,
    cost: Sequence[float] | None = None,
) -> Iterator[tuple[int, T]]:
    """Yield ``(i, fns[i]())`` for every callable, in the order they finish.

    ``n_jobs``: worker processes (None: `default_jobs`; 1, or a single callable: run here, in order, with no
    worker). ``threads``: BLAS/OpenMP threads per call (None: leave as is). ``cost``: relative cost of each
    call; the costliest start first (ties in the order given). The callables must not hold the run context
    (a model, open files): they are pickled to the workers."""
    n = len(fns)
    workers = min(default_jobs() if n_jobs is None else int(n_jobs), n)
    if workers <= 1:
        for i, fn in enumerate(fns):
            yield _call(i, fn, threads)
        return
    from joblib import Parallel, delayed

    order = sorted(range(n), key=lambda i: -float(cost[i])) if cost is not None else list(range(n))
    run = Parallel(n_jobs=workers, backend="loky", return_as="generator_unordered", batch_size=1)
    yield from run(delayed(_call)(i, fns[i], threads) for i in order)


def _call(i: int, fn: Callable[[], T], threads: int | None) -> tuple[int, T]:
    from bertscope.probes._checks import thread_limit

    with thread_limit(threads):  # torch's threads as well as BLAS/OpenMP (the torch probe backend)
        return i, fn()


@dataclass
class Job:
    """One cached probe step: ``fn()`` computes the raw table (in a worker; it must be picklable and hold no
    run context), ``post(raw)`` turns it into the cached table (in the run's process), ``name`` and ``key``
    name the step (`Context.step`), ``cost`` orders the work (costliest first)."""

    name: str
    key: dict[str, Any]
    fn: Callable[[], Any]
    post: Callable[[Any], Any] = field(default=lambda raw: raw)
    cost: float = 1.0


def run_jobs(
    jobs: Sequence[Job],
    *,
    step: Callable[..., Any],
    cached: Callable[..., bool],
    n_jobs: int | None,
    threads: int | None = 1,
    progress: Callable[..., Any] | None = None,
    desc: str = "probes",
) -> list[Any]:
    """The jobs' tables in the order given: read from the step cache when ``cached(name, **key)``, else computed
    by `parallel_map` and written by ``step(name, fn, **key)`` as each arrives."""
    todo = [i for i, job in enumerate(jobs) if not cached(job.name, **job.key)]
    done: dict[int, Any] = {}
    results = parallel_map([jobs[i].fn for i in todo], n_jobs=n_jobs, threads=threads,
                           cost=[jobs[i].cost for i in todo])  # fmt: skip
    if progress is not None:
        results = progress(results, desc, total=len(todo))
    for k, raw in results:
        job = jobs[todo[k]]
        done[todo[k]] = step(job.name, lambda job=job, raw=raw: job.post(raw), **job.key)
    return [done[i] if i in done else step(job.name, lambda job=job: job.post(job.fn()), **job.key)
            for i, job in enumerate(jobs)]  # fmt: skip
