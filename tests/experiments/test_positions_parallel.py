"""The positions run on worker processes gives the serial run's tables, bit for bit (the job service,
`experiments.jobs`, through the `positions.parallel` aliases)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch
from bertscope.experiments import positions
from bertscope.experiments.corpus import load_corpus
from bertscope.experiments.positions.parallel import Job, parallel_map, run_jobs
from test_positions import SMALL

from bertscope import models


def _square(x: int) -> int:
    return x * x


def test_parallel_map_yields_every_result_once_and_runs_costliest_first_in_serial_order_when_one_job():
    fns = [lambda i=i: _square(i) for i in range(5)]
    assert sorted(parallel_map(fns, n_jobs=1)) == [(i, i * i) for i in range(5)]
    assert sorted(parallel_map(fns, n_jobs=2, cost=[1, 5, 2, 4, 3])) == [(i, i * i) for i in range(5)]


def test_run_jobs_reads_cached_steps_and_writes_the_rest_in_order():
    store: dict[str, int] = {"b": 10}
    computed: list[str] = []

    def step(name, fn, **key):
        if name not in store:
            store[name] = fn()
            computed.append(name)
        return store[name]

    jobs = [Job(n, {}, lambda v=v: v, post=lambda raw: raw + 1) for n, v in (("a", 1), ("b", 2), ("c", 3))]
    out = run_jobs(jobs, step=step, cached=lambda name, **key: name in store, n_jobs=1)
    assert out == [2, 10, 4] and computed == ["a", "c"]  # "b" came from the cache, not from its job


@pytest.mark.slow
def test_two_workers_give_the_serial_tables_exactly(tmp_path, tokenizer, tiny_config, monkeypatch):
    from bertscope.experiments.options import Inputs, RunOptions, corpus_summary, model_summary
    from bertscope.experiments.runner import run_experiment

    model = models.random_encoder(tiny_config, seed=0, tokenizer=tokenizer).eval()
    corpus = load_corpus("builtin", max_sentences=150)
    inputs = Inputs(model, corpus, torch.device("cpu"), torch.float32, model_summary(model), corpus_summary(corpus))
    tables = {}
    for n_jobs in (1, 2):
        settings = dataclasses.replace(SMALL, n_jobs=n_jobs)
        monkeypatch.setattr(positions, "Settings", lambda settings=settings: settings)
        out = tmp_path / f"jobs{n_jobs}"
        result = run_experiment(positions, RunOptions(out=out, quiet=True, max_length=64), inputs)
        assert result.status == "complete", result.error
        tables[n_jobs] = {name: pd.read_parquet(out / positions.DIRNAME / f"{name}.parquet")
                          for name in ("results", "summary_absolute", "capacity_sweep", "confusion")}  # fmt: skip
    for name, serial in tables[1].items():
        parallel = tables[2][name]
        assert list(parallel.columns) == list(serial.columns)
        pd.testing.assert_frame_equal(parallel, serial, check_exact=True)
    assert np.isfinite(tables[2]["results"]["value"]).any()
