"""`bertscope run erasure --activations DIR`: the clean passes read a capture through the activations stage (the
erased runs always run the model), with the tables of the forward run up to float32 rounding of other batches."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
from bertscope.experiments import cli as cli_main
from bertscope.experiments import erasure
from bertscope.experiments import io as experiment_io
from bertscope.experiments.activations import CaptureSource
from bertscope.models import load
from test_erasure_experiment import SMALL


def test_erasure_reads_its_clean_activations_from_a_capture(tiny_model_dir, tmp_path, monkeypatch) -> None:
    common = ["--model", str(tiny_model_dir), "--max-sentences", "40", "--batch-size", "8", "--device", "cpu",
              "--quiet"]
    hooks = ",".join(erasure.activation_sites(load(tiny_model_dir)))
    assert cli_main.main(["capture", "--hooks", hooks, "--out", str(tmp_path / "cap"), *common]) == 0
    small = dataclasses.replace(SMALL, n_train=20, n_eval=10, methods=("leace",))
    monkeypatch.setattr(erasure, "Settings", lambda: small)
    monkeypatch.setattr(erasure, "plot", lambda out_dir: [])
    monkeypatch.setattr(experiment_io, "save_figure", lambda *a, **k: [])
    reads = []
    original = CaptureSource.read
    monkeypatch.setattr(CaptureSource, "read", lambda self, *a, **k: reads.append(1) or original(self, *a, **k))
    run = ["run", "erasure", "--no-report", *common]
    assert cli_main.main([*run, "--out", str(tmp_path / "forward")]) == 0
    assert not reads
    assert cli_main.main([*run, "--out", str(tmp_path / "capture"), "--activations", str(tmp_path / "cap")]) == 0
    assert reads  # the clean passes came from the capture
    for table in ("results", "probing"):
        a = pd.read_parquet(tmp_path / "forward" / "erasure" / f"{table}.parquet")
        b = pd.read_parquet(tmp_path / "capture" / "erasure" / f"{table}.parquet")
        assert len(a) == len(b)
        np.testing.assert_allclose(a["value"], b["value"], atol=0.05)
