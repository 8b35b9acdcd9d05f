"""``bertscope run NAME --activations DIR``: an experiment reads a capture instead of running its forward, with
the same tables; a capture that cannot serve the run is refused in one line (exit 2, nothing written)."""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

import pandas as pd
import pytest
from bertscope.experiments import cli
from bertscope.experiments import io as experiment_io
from bertscope.experiments.registry import EXPERIMENTS
from bertscope.experiments.same_token.collect import sites as same_token_sites

N, MAX_LENGTH, BATCH = 6, 48, 3
TINY = dict(max_sentences=N, n_boot=10, vocab_sample=20, example_max_tokens=14, random_corpus="repeated-random:m=3",
            random_sentences=4, distance_sentences=2, importance_sentences=2, importance_batch=4, n_projections=1,
            pruning_points=2)  # fmt: skip


def _common(model: Path, *extra: str) -> list[str]:
    return ["--model", str(model), "--max-sentences", str(N), "--batch-size", str(BATCH), "--max-length",
            str(MAX_LENGTH), "--device", "cpu", "--quiet", *extra]  # fmt: skip


@pytest.fixture(scope="module")
def captures(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("activations_cli")
    out = {"full": root / "full", "resid": root / "resid"}
    hooks = ",".join(same_token_sites(2))  # the tiny model's 2 layers: raw sites, patterns, values
    assert cli.main(["capture", "--hooks", hooks, "--out", str(out["full"]), *_common(tiny_model_dir)]) == 0
    assert cli.main(["capture", "--hooks", "blocks.*.hook_resid_post", "--out", str(out["resid"]),
                     *_common(tiny_model_dir)]) == 0  # fmt: skip
    return out


@pytest.fixture
def small(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("same-token", "heads"):
        module = importlib.import_module(EXPERIMENTS[name])
        fields = {f.name for f in dataclasses.fields(module.Settings)}
        settings = dataclasses.replace(module.Settings(), **{k: v for k, v in TINY.items() if k in fields})
        monkeypatch.setattr(module, "Settings", lambda s=settings: s)
        monkeypatch.setattr(module, "plot", lambda out_dir: [])
    monkeypatch.setattr(experiment_io, "save_figure", lambda *a, **k: [])


def test_same_token_reads_a_capture_with_equal_tables(tiny_model_dir, captures, tmp_path, small) -> None:
    run = ["run", "same-token", "--no-report", *_common(tiny_model_dir)]
    assert cli.main([*run, "--out", str(tmp_path / "forward")]) == 0
    assert cli.main([*run, "--out", str(tmp_path / "capture"), "--activations", str(captures["full"])]) == 0
    for table in ("results", "summary", "held_out"):
        a = pd.read_parquet(tmp_path / "forward" / "same_token" / f"{table}.parquet")
        b = pd.read_parquet(tmp_path / "capture" / "same_token" / f"{table}.parquet")
        pd.testing.assert_frame_equal(a, b, check_exact=True)


def test_heads_attention_pass_reads_a_capture(tiny_model_dir, captures, tmp_path, small) -> None:
    """heads' attention pass reads patterns and values from the capture (its ablations run the model)."""
    run = ["run", "heads", "--no-report", *_common(tiny_model_dir)]
    assert cli.main([*run, "--out", str(tmp_path / "forward")]) == 0
    assert cli.main([*run, "--out", str(tmp_path / "capture"), "--activations", str(captures["full"])]) == 0
    a = pd.read_parquet(tmp_path / "forward" / "heads" / "results.parquet")
    b = pd.read_parquet(tmp_path / "capture" / "heads" / "results.parquet")
    pd.testing.assert_frame_equal(a, b, check_exact=False, atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    ("name", "change", "message"),
    [
        ("same-token", {"capture": "resid"}, "lacks a site"),
        ("same-token", {"max_length": "40"}, "--max-length 48"),
        ("same-token", {"max_sentences": "8"}, "does not hold sentence"),
        ("same-token", {"capture": "missing"}, "not a folder"),
        ("positions", {}, "holds the corpus's sentences, not positions' windows"),
        ("circuits", {}, "circuits cannot read its activations from a capture: it patches"),
    ],
)
def test_refused_in_one_line_with_nothing_written(tiny_model_dir, captures, tmp_path, capsys, name, change,
                                                  message) -> None:  # fmt: skip
    folder = captures.get(change.get("capture", "full"), tmp_path / "no-such-capture")
    argv = _common(tiny_model_dir)
    argv[argv.index("--max-length") + 1] = change.get("max_length", str(MAX_LENGTH))
    argv[argv.index("--max-sentences") + 1] = change.get("max_sentences", str(N))
    out = tmp_path / "out"
    assert cli.main(["run", name, *argv, "--out", str(out), "--activations", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not out.exists() or not any(out.iterdir())


def test_another_models_capture_is_refused(tiny_model_dir, captures, tmp_path, capsys) -> None:
    from helpers import save_tiny_bert

    other = tmp_path / "other_model"
    save_tiny_bert(other, seed=1)
    capsys.readouterr()  # transformers' saving bar
    argv = _common(other)
    out = tmp_path / "out"
    assert cli.main(["run", "structure", *argv, "--out", str(out), "--activations", str(captures["full"])]) == 2
    err = capsys.readouterr().err.strip()
    assert "another model" in err and len(err.splitlines()) == 1, err
    assert not out.exists() or not any(out.iterdir())
