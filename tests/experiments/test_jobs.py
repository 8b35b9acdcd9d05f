"""The job service (`experiments.jobs`): results identical to the serial run, each cached as it arrives, an
interruption keeps what finished, a dead worker stops the run with an error."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from bertscope.experiments import jobs
from bertscope.experiments.context import StepCache
from bertscope.experiments.jobs import Job, JobService, imap_unordered, map_ordered


def _cache(tmp_path: Path) -> StepCache:
    return StepCache(tmp_path, {"experiment": "test"}, "code", {"scale": 1})


def _product(seed: int) -> pd.DataFrame:
    """A result whose last bits depend on the thread count: a float32 matrix product summed."""
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(300, 200, generator=g), torch.randn(200, 300, generator=g)
    return pd.DataFrame({"seed": [seed], "value": [float((a @ b).sum())], "pid": [os.getpid()]})


def _jobs(n: int = 5) -> list[Job]:
    return [Job("product", {"seed": i}, lambda i=i: _product(i), cost=float(i % 3)) for i in range(n)]


def test_workers_give_the_serial_results_bit_for_bit(tmp_path: Path) -> None:
    serial = JobService(workers=1, threads=1).run(_jobs())
    parallel = JobService(workers=2, threads=1).run(_jobs())
    assert [t["seed"].item() for t in parallel] == list(range(5))  # in the order given, whatever finished first
    for s, p in zip(serial, parallel, strict=True):
        assert s["value"].item() == p["value"].item()
    assert {t["pid"].item() for t in parallel} - {os.getpid()}  # the jobs did run in other processes
    assert {t["pid"].item() for t in serial} == {os.getpid()}


def test_imap_unordered_yields_every_result_once_and_map_ordered_keeps_the_order() -> None:
    fns = [lambda i=i: i * i for i in range(7)]
    assert sorted(imap_unordered(fns, workers=1)) == [(i, i * i) for i in range(7)]
    assert sorted(imap_unordered(fns, workers=3, cost=[1, 5, 2, 4, 3, 0, 0])) == [(i, i * i) for i in range(7)]
    assert map_ordered(lambda x: x + 1, list(range(9)), workers=2) == list(range(1, 10))


def test_each_result_is_cached_as_it_arrives_and_a_rerun_computes_only_the_rest(tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    service = JobService(workers=2, cache=cache)
    first = service.run(_jobs(3))
    assert all(cache.is_cached("product", "parquet", seed=i) for i in range(3))
    posts: list[int] = []
    more = [Job(j.name, j.key, j.fn, post=lambda t, k=j.key["seed"]: posts.append(k) or t) for j in _jobs(5)]
    second = service.run(more)
    assert sorted(posts) == [3, 4]  # only the two new jobs were computed; the first three were read back
    for a, b in zip(first, second[:3], strict=True):
        pd.testing.assert_frame_equal(a, b)


def test_an_interruption_keeps_every_job_that_finished(tmp_path: Path) -> None:
    """Ctrl-C after the first arrival (raised where the results are consumed, as a real one would be): the
    first job is in the cache, the others are not, and the rerun gives the uninterrupted run's results."""
    cache = _cache(tmp_path)

    def interrupt_after_one(arrivals, desc, total):
        for n, item in enumerate(arrivals):
            if n == 1:
                raise KeyboardInterrupt
            yield item

    for workers in (1, 2):
        with pytest.raises(KeyboardInterrupt):
            JobService(workers=workers, cache=cache, progress=interrupt_after_one).run(_jobs(4))
        cached = [i for i in range(4) if cache.is_cached("product", "parquet", seed=i)]
        assert len(cached) == 1
        for p in (tmp_path / "steps").iterdir():
            p.unlink()
    resumed = JobService(workers=2, cache=cache).run(_jobs(4))
    expected = JobService(workers=1).run(_jobs(4))
    assert [t["value"].item() for t in resumed] == [t["value"].item() for t in expected]


def test_a_failing_job_leaves_the_finished_ones_cached(tmp_path: Path) -> None:
    cache = _cache(tmp_path)

    def fail() -> pd.DataFrame:
        raise ValueError("planted")

    work = [*_jobs(3), Job("product", {"seed": 99}, fail, cost=-1.0)]  # the cheapest starts last
    with pytest.raises(ValueError, match="planted"):
        JobService(workers=1, cache=cache).run(work)
    assert all(cache.is_cached("product", "parquet", seed=i) for i in range(3))
    assert not cache.is_cached("product", "parquet", seed=99)


def test_arrays_jobs_are_cached_as_npz(tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    job = Job("vectors", {"site": "a"}, lambda: {"x": np.arange(4.0)}, kind="arrays")
    out = JobService(workers=2, cache=cache).run([job, Job("vectors", {"site": "b"}, lambda: {"x": np.ones(2)},
                                                             kind="arrays")])  # fmt: skip
    np.testing.assert_array_equal(out[0]["x"], np.arange(4.0))
    assert cache.is_cached("vectors", "npz", site="a") and cache.is_cached("vectors", "npz", site="b")
    with pytest.raises(ValueError, match="kind"):
        Job("x", {}, lambda: None, kind="pickle")


def _die_on_three(x: int) -> int:
    if x == 3:
        os._exit(1)  # what a worker killed for memory looks like to the parent: gone, no exception sent back
    return x


def test_a_worker_that_dies_stops_the_run_with_an_error_not_a_wait() -> None:
    with pytest.raises(RuntimeError, match="worker process of the job service died"):
        map_ordered(_die_on_three, list(range(6)), workers=2)
    assert map_ordered(_die_on_three, [0, 1, 2], workers=2) == [0, 1, 2]  # the next map is unharmed


def test_accelerator_jobs_and_single_jobs_run_here() -> None:
    assert not jobs.can_fork("meta")
    pids = dict(imap_unordered([os.getpid, os.getpid], workers=2, device="meta"))
    assert set(pids.values()) == {os.getpid()}
