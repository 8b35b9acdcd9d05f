"""The job service: run a list of independent jobs on worker processes or in this process, caching each result
in the step cache the moment it arrives.

Every experiment that runs many independent pieces of work (the positions probes, the structure training
passes, the heads forwards by sentence; later dictionary training and patching sweeps) runs them here, through
ONE worker mechanism:

- **Workers are forked** (``multiprocessing`` "fork" start method, a ``ProcessPoolExecutor``): they share the parent's
  model and arrays copy-on-write, so nothing but each job's result travels between processes, and a worker costs no
  import. The workers share this process's thread budget (`worker_threads`: its torch threads, which the CLI sets once
  from ``--threads``, `set_thread_budget`, divided by the number of workers, at least 1), for torch and for BLAS/OpenMP
  alike, so N workers never run N times the cores' threads; each exits on SIGTERM whatever handler the parent installed.
  A worker that dies (killed for memory, a crash in native code) stops the map with an error, never a wait. Where fork
  is unavailable, or the jobs compute on an accelerator (a forked copy of a process holding an accelerator context is
  unusable), the jobs run in this process.
- **Results are the serial run's**: a job runs under the same thread limit (``threads``: torch, BLAS and OpenMP
  threads, `probes.thread_limit`) in a worker and in this process, so with ``threads`` set the results are bit
  for bit those of ``workers=1`` (``tests/experiments/test_jobs.py``). Independent results do not depend on the order
  the jobs finish in; the costliest jobs start first (``cost``), so the last worker does not run one long job alone.
- **Cached as they arrive**: `JobService.run` computes the jobs whose step is not cached yet and writes each
  result to the step cache (`context.StepCache`) as soon as it reaches this process, so Ctrl-C keeps every job
  that finished; a rerun reads them back and computes only the rest.

Measurement code gets a `JobService` (never the run context): ``run`` makes one with ``ctx.jobs(...)``.

>>> service = ctx.jobs(workers=2)                             # in an experiment's run
>>> tables = service.run([Job("probe", {"site": s}, partial(fit, X[s])) for s in sites], "probes")
>>> arrays = service.map_ordered(forward, batches, desc="forwards")   # uncached, results in order
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import signal
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

T = TypeVar("T")

#: Kinds of cached result: a pandas DataFrame (``steps/<name>-<key>.parquet``) or a dict of numpy arrays (``.npz``).
KINDS = {"table": "parquet", "arrays": "npz"}

_TASKS: dict[int, tuple[Sequence[Callable[[], Any]], int | None]] = {}  # set in the parent before the fork
_TASK_IDS = itertools.count()
_WORKER_THREADS: int | None = None  # in a worker process: its share of the parent's threads (`_worker_start`)


def set_thread_budget(threads: int | None = None) -> int:
    """Set this process's torch intra-op threads once, where the CLI starts (``--threads``; None: what
    ``OMP_NUM_THREADS`` says when it is set, as torchrun sets it for its workers, else every core this process may
    use, `default_workers`), and return the number set. Worker processes divide it (`worker_threads`): torch's
    own threads and the workers' never oversubscribe the cores."""
    import torch

    if threads is None:
        n = torch.get_num_threads() if os.environ.get("OMP_NUM_THREADS") else default_workers()
    else:
        n = int(threads)
    if n < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    torch.set_num_threads(n)
    return n


def worker_threads(n_workers: int, budget: int | None = None) -> int:
    """Threads each of ``n_workers`` worker processes gets: the thread budget (``budget``; None: this process's
    torch threads, what `set_thread_budget` set) divided among them, at least 1."""
    import torch

    total = torch.get_num_threads() if budget is None else int(budget)
    return max(1, total // max(1, int(n_workers)))


def default_workers() -> int:
    """The number of CPU cores this process may run on (its affinity mask; ``os.cpu_count()`` elsewhere)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def can_fork(device: Any = "cpu") -> bool:
    """Whether jobs computing on ``device`` may run on forked workers here (a CPU device, a platform that forks)."""
    import torch

    return torch.device(device).type == "cpu" and "fork" in multiprocessing.get_all_start_methods()


def imap_unordered(
    fns: Sequence[Callable[[], T]],
    *,
    workers: int | None = 1,
    threads: int | None = 1,
    cost: Sequence[float] | None = None,
    device: Any = "cpu",
) -> Iterator[tuple[int, T]]:
    """Yield ``(i, fns[i]())`` for every callable, in the order they finish: the one worker mechanism.

    ``workers``: forked worker processes (None: `default_workers`; 1, a single callable, an accelerator ``device`` or no
    fork on this platform: run here, in the order given). ``threads``: torch/BLAS/OpenMP threads per call, the same in a
    worker and here (None: a worker runs on its share of this process's threads, `worker_threads`, a call here on what
    the caller set). ``cost``: relative cost of each call; the costliest start first (ties in the order given). The
    callables may be closures over the parent's model and arrays (workers are forked, nothing is pickled on the way in);
    their results must be picklable. Ctrl-C or an error drops the calls not yet started."""
    n = len(fns)
    n_workers = min(default_workers() if workers is None else int(workers), n)
    if n_workers <= 1 or not can_fork(device):
        for i in range(n):
            yield _call(fns, threads, i)
        return
    order = sorted(range(n), key=lambda i: -float(cost[i])) if cost is not None else list(range(n))
    task = next(_TASK_IDS)
    _TASKS[task] = (fns, threads)  # the workers fork at the first submit, after this
    pool = ProcessPoolExecutor(n_workers, mp_context=multiprocessing.get_context("fork"), initializer=_worker_start,
                               initargs=(worker_threads(n_workers),))
    try:
        pending = {pool.submit(_run, task, i) for i in order}
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                yield future.result()
    except BrokenProcessPool as error:
        raise RuntimeError(f"a worker process of the job service died ({error}); rerun with one worker to see "
                           "the failure in this process") from None
    finally:  # on an error, Ctrl-C or an abandoned generator, calls not yet started are dropped, not waited for
        pool.shutdown(wait=True, cancel_futures=True)
        del _TASKS[task]


def map_ordered(
    fn: Callable[[Any], T],
    items: Sequence[Any],
    *,
    workers: int | None = 1,
    threads: int | None = None,
    progress: Callable[[Iterable[T]], Iterable[T]] | None = None,
    device: Any = "cpu",
) -> list[T]:
    """``[fn(item) for item in items]`` through `imap_unordered` (same workers, same threads rule), results in
    the order of ``items``; ``progress`` wraps the results as they arrive, in order (e.g. a tqdm bar)."""
    fns = [_Bound(fn, item) for item in items]
    arrivals = imap_unordered(fns, workers=workers, threads=threads, device=device)
    wrap = progress if progress is not None else (lambda it: it)
    return list(wrap(_in_order(arrivals, len(fns))))


class StepCache(Protocol):
    """What the job service needs of the step cache (`context.StepCache`): whether a step is cached, and
    ``step`` / ``step_arrays`` that read it back or compute it and write it atomically."""

    def is_cached(self, name: str, suffix: str, **key: Any) -> bool: ...  # pragma: no cover - protocol

    def step(self, name: str, fn: Callable[[], Any], **key: Any) -> Any: ...  # pragma: no cover - protocol

    def step_arrays(self, name: str, fn: Callable[[], Any], **key: Any) -> Any: ...  # pragma: no cover - protocol


@dataclass
class Job:
    """One cached job: ``fn()`` computes the raw result (in a worker or here; a closure over arrays is fine),
    ``post(raw)`` turns it into the cached result (in this process: labels, frames), ``name`` and ``key`` name
    its step in the cache, ``cost`` orders the work (costliest first), ``kind`` says what is cached
    (``"table"``: a DataFrame; ``"arrays"``: a dict of numpy arrays)."""

    name: str
    key: dict[str, Any]
    fn: Callable[[], Any]
    post: Callable[[Any], Any] = field(default=lambda raw: raw)
    cost: float = 1.0
    kind: str = "table"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Job.kind must be one of {sorted(KINDS)}, got {self.kind!r}")


@dataclass
class JobService:
    """Runs jobs for one experiment run: on ``workers`` forked processes (None: every core this process may
    use; 1: here), each under ``threads`` threads, on ``device``; results cached in ``cache`` (None: nothing is
    cached); ``progress(iterable, desc, total)`` wraps the arrivals (e.g. ``ctx.progress``)."""

    workers: int | None = 1
    threads: int | None = 1
    device: Any = "cpu"
    cache: StepCache | None = None
    progress: Callable[..., Iterable[Any]] | None = None

    def run(self, jobs: Sequence[Job], desc: str = "jobs") -> list[Any]:
        """The jobs' results in the order given: read from the cache when cached, else computed by
        `imap_unordered` and each written to the cache as it arrives (Ctrl-C keeps every finished job)."""
        todo = [i for i, job in enumerate(jobs) if not self._cached(job)]
        done: dict[int, Any] = {}
        arrivals: Iterable[tuple[int, Any]] = imap_unordered(
            [jobs[i].fn for i in todo], workers=self.workers, threads=self.threads,
            cost=[jobs[i].cost for i in todo], device=self.device)  # fmt: skip
        if self.progress is not None and todo:
            arrivals = self.progress(arrivals, desc, total=len(todo))
        for k, raw in arrivals:
            job = jobs[todo[k]]
            done[todo[k]] = self._store(job, lambda job=job, raw=raw: job.post(raw))
        return [done[i] if i in done else self._store(job, lambda job=job: job.post(job.fn()))
                for i, job in enumerate(jobs)]  # fmt: skip

    def step(self, name: str, fn: Callable[[], Any], *, kind: str = "table", **key: Any) -> Any:
        """One job computed here (no worker), cached like `run`'s: for a small result many later jobs need."""
        return self._store(Job(name, key, fn, kind=kind), fn)

    def map(self, fns: Sequence[Callable[[], T]], cost: Sequence[float] | None = None) -> list[T]:
        """``[fn() for fn in fns]`` on the service's workers and threads, not cached."""
        out = dict(imap_unordered(fns, workers=self.workers, threads=self.threads, cost=cost, device=self.device))
        return [out[i] for i in range(len(fns))]

    def map_ordered(self, fn: Callable[[Any], T], items: Sequence[Any], desc: str | None = None) -> list[T]:
        """``[fn(item) for item in items]`` on the service's workers and threads (`map_ordered`), not cached."""
        progress = None
        if self.progress is not None and desc is not None:
            progress = lambda it: self.progress(it, desc, total=len(items))  # noqa: E731
        return map_ordered(fn, items, workers=self.workers, threads=self.threads, progress=progress,
                           device=self.device)  # fmt: skip

    def _cached(self, job: Job) -> bool:
        return self.cache is not None and self.cache.is_cached(job.name, KINDS[job.kind], **job.key)

    def _store(self, job: Job, fn: Callable[[], Any]) -> Any:
        if self.cache is None:
            return fn()
        write = self.cache.step if job.kind == "table" else self.cache.step_arrays
        return write(job.name, fn, **job.key)


# ------------------------------------------------------------------------------------------------ workers


class _Bound:
    """``fn(item)`` as an argument-free callable (a plain class, not a lambda: cheap and inspectable)."""

    __slots__ = ("fn", "item")

    def __init__(self, fn: Callable[[Any], Any], item: Any) -> None:
        self.fn, self.item = fn, item

    def __call__(self) -> Any:
        return self.fn(self.item)


def _in_order(arrivals: Iterator[tuple[int, T]], n: int) -> Iterator[T]:
    """The results of ``arrivals`` in index order, each yielded as soon as every earlier one has arrived."""
    held: dict[int, T] = {}
    nxt = 0
    for i, result in arrivals:
        held[i] = result
        while nxt in held:
            yield held.pop(nxt)
            nxt += 1
    if nxt != n:  # pragma: no cover - imap_unordered yields every index once
        raise RuntimeError(f"the job service returned {nxt} of {n} results")


def _call(fns: Sequence[Callable[[], T]], threads: int | None, i: int) -> tuple[int, T]:
    from bertscope.probes import thread_limit

    with thread_limit(threads if threads is not None else _WORKER_THREADS):  # torch's threads and BLAS/OpenMP's
        return i, fns[i]()


def _worker_start(threads: int = 1) -> None:
    """``threads`` torch threads, and as many BLAS/OpenMP threads for every call (the worker's share,
    `worker_threads`); SIGTERM ends the worker whatever handler the parent had installed (the executor stops the
    workers of a broken pool with it)."""
    import torch

    global _WORKER_THREADS
    _WORKER_THREADS = threads
    torch.set_num_threads(threads)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _run(task: int, i: int) -> tuple[int, Any]:
    assert task in _TASKS, "job service: the task was not set before the fork"
    fns, threads = _TASKS[task]
    return _call(fns, threads, i)
