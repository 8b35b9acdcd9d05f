"""The positions run's former worker module, kept as aliases of the job service (`experiments.jobs`): `Job`,
`parallel_map` (= `jobs.imap_unordered` with ``n_jobs`` workers), `run_jobs` (= `jobs.JobService.run`) and
`default_jobs` (= `jobs.default_workers`). New code uses `experiments.jobs` directly."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from bertscope.experiments.jobs import Job, JobService, imap_unordered
from bertscope.experiments.jobs import default_workers as default_jobs

T = TypeVar("T")
__all__ = ["Job", "default_jobs", "parallel_map", "run_jobs"]


def parallel_map(fns: Sequence[Callable[[], T]], *, n_jobs: int | None, threads: int | None = 1,
                 cost: Sequence[float] | None = None) -> Iterator[tuple[int, T]]:  # fmt: skip
    """``(i, fns[i]())`` in the order they finish, on ``n_jobs`` workers (`experiments.jobs.imap_unordered`)."""
    return imap_unordered(fns, workers=n_jobs, threads=threads, cost=cost)


class _Callables:
    """A step cache made of a ``step(name, fn, **key)`` and a ``cached(name, **key)`` callable (tables only)."""

    def __init__(self, step: Callable[..., Any], cached: Callable[..., bool]) -> None:
        self.step, self._cached = step, cached

    def is_cached(self, name: str, suffix: str, **key: Any) -> bool:
        return bool(self._cached(name, **key))

    def step_arrays(self, name: str, fn: Callable[[], Any], **key: Any) -> Any:  # pragma: no cover - tables only
        raise TypeError("positions.parallel.run_jobs caches tables only")


def run_jobs(jobs: Sequence[Job], *, step: Callable[..., Any], cached: Callable[..., bool], n_jobs: int | None,
             threads: int | None = 1, progress: Callable[..., Any] | None = None, desc: str = "probes") -> list[Any]:
    """The jobs' tables in order (`experiments.jobs.JobService.run` over the ``step`` / ``cached`` callables)."""
    service = JobService(workers=n_jobs, threads=threads, cache=_Callables(step, cached), progress=progress)
    return service.run(jobs, desc)
