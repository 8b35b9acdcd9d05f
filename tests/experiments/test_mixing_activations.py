"""Issue 26 (mixing): the mixing experiment collects its hooked tensors through the activations stage, and
``--activations DIR`` reads them from a capture (value zeroing re-runs each block from the captured
``hook_resid_pre``) with tables identical to the forward run; a capture without the sites is refused in one line."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from bertscope.experiments import cli
from bertscope.experiments import io as experiment_io
from bertscope.experiments.mixing import activation_sites

from bertscope import models

N, MAX_LENGTH, BATCH = 5, 40, 3


SMALL = ["--set", "mixing.n_boot=10", "--set", "mixing.ig_steps=2", "--set", "mixing.n_examples=1"]


def _common(model: Path) -> list[str]:
    return ["--model", str(model), "--max-sentences", str(N), "--batch-size", str(BATCH), "--max-length",
            str(MAX_LENGTH), "--device", "cpu", "--quiet"]  # fmt: skip


@pytest.fixture
def no_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(experiment_io, "save_figure", lambda *a, **k: [])


def test_mixing_reads_a_capture_with_identical_tables(tiny_model_dir: Path, tmp_path: Path, no_figures,
                                                      monkeypatch) -> None:  # fmt: skip
    sites = activation_sites(models.load(tiny_model_dir))
    assert {s.split(".", 2)[2] for s in sites} == {"hook_resid_pre", "attn.hook_pattern", "attn.hook_v",
                                                   "hook_attn_out", "hook_resid_mid"}  # fmt: skip
    capture = tmp_path / "acts"
    assert cli.main(["capture", "--hooks", ",".join(sites), "--out", str(capture), *_common(tiny_model_dir)]) == 0
    run = ["run", "mixing", "--no-report", *_common(tiny_model_dir), *SMALL]
    assert cli.main([*run, "--out", str(tmp_path / "forward")]) == 0
    from bertscope.experiments import activations

    def no_forward(*args, **kwargs):
        raise AssertionError("the stage ran the forward although a capture was given")

    monkeypatch.setattr(activations, "run_batch", no_forward)  # the stage's only forward: never reached below
    assert cli.main([*run, "--out", str(tmp_path / "capture"), "--activations", str(capture)]) == 0
    for table in ("results", "summary", "example_maps"):
        a = pd.read_parquet(tmp_path / "forward" / "mixing" / f"{table}.parquet")
        b = pd.read_parquet(tmp_path / "capture" / "mixing" / f"{table}.parquet")
        pd.testing.assert_frame_equal(a, b, check_exact=True)
    methods = set(pd.read_parquet(tmp_path / "capture" / "mixing" / "results.parquet").method)
    assert {"value_zeroing", "alti", "rollout:alti", "loo"} <= methods
    manifest = experiment_io.read_json(tmp_path / "capture" / "mixing" / "manifest.json")
    assert "input attributions" in str(manifest["notes"]["activations"])  # what still ran the model is said


def test_a_capture_without_the_sites_is_refused(tiny_model_dir: Path, tmp_path: Path, capsys) -> None:
    capture = tmp_path / "resid"
    assert cli.main(["capture", "--hooks", "blocks.*.hook_resid_pre", "--out", str(capture),
                     *_common(tiny_model_dir)]) == 0  # fmt: skip
    capsys.readouterr()
    out = tmp_path / "out"
    argv = ["run", "mixing", *_common(tiny_model_dir), *SMALL, "--out", str(out), "--activations", str(capture)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "lacks a site" in err and "attn.hook_pattern" in err and len(err.splitlines()) == 1, err
    assert not out.exists()
