"""positions through the activations stage: windows given as token ids (`activations.encode_sequences`), a capture
of them (`bertscope capture --for positions`) that `run positions --activations` reads with the same tables as the
forward run, its refusals, and `--eval-corpus` (every choice on --corpus: two runs differing only in the evaluation
corpus make the same choices)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from bertscope.experiments import cli, positions
from bertscope.experiments.activations import CaptureSource, encode_sequences, iter_activations
from bertscope.experiments.capture import read_index
from bertscope.experiments.corpus import load_corpus, write_conllu
from bertscope.experiments.positions import experiment
from bertscope.experiments.positions.data import collect, make_windows, shuffle_content
from bertscope.experiments.positions.windows import plan_inputs

from bertscope import models

TINY = positions.Settings(
    window_len=4, max_windows=8, tune_windows=6, max_sentences=12, n_folds=2, n_boot=10, pairs_per_window=4,
    table_pairs=100, mdl=False, alphas=(1.0, 10.0), ridge_alphas=(1.0, 100.0), sweep_alphas=(0.1, 10.0), repeats=1,
    sweep_boot=10, n_jobs=1, batch_size=8,
)  # fmt: skip
TABLES = ("results", "summary_absolute", "capacity_sweep", "confusion")


@pytest.fixture
def tiny_run(monkeypatch):
    """positions with `TINY` settings and only its cheaper steps (the tables compared need nothing else)."""
    monkeypatch.setattr(positions, "Settings", lambda: TINY)
    monkeypatch.setattr(positions, "plot", lambda out_dir: [])
    steps = experiment._steps

    def fewer(design, acts, tables, settings):
        keep = ("absolute_windows", "capacity_sweep", "confusion")
        return {k: v for k, v in steps(design, acts, tables, settings).items() if k in keep}

    monkeypatch.setattr(experiment, "_steps", fewer)


def common(model_dir: Path) -> list[str]:
    return ["--model", str(model_dir), "--max-sentences", "60", "--max-length", "64", "--device", "cpu", "--quiet"]


@pytest.fixture(scope="module")
def windows_capture(tiny_model_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("positions_capture") / "cap"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(positions, "Settings", lambda: TINY)
        assert cli.main(["capture", "--for", "positions", "--out", str(out), *common(tiny_model_dir)]) == 0
    return out


def test_token_sequences_go_through_the_stage_as_an_unpadded_forward_would(tiny_model_dir) -> None:
    model = models.load(tiny_model_dir)
    seqs = [np.array([101, *range(2000, 2000 + n), 102]) for n in (5, 2, 9)]
    sentences, encoded = encode_sequences(seqs, pad_token_id=0, ids=["a", "b", "c"], batch_size=2, order=[2, 0, 1])
    assert [b.sentence_index for b in encoded] == [[2, 0], [1]] and sentences[1].text == "101 2000 2001 102"
    site = "blocks.1.hook_resid_post"
    seen = {}
    for acts in iter_activations(model, sentences, site, encoded=encoded):
        rows, flat = acts.rows(), acts.flat(site)
        assert set(rows.groupby("sentence_index")["token_class"].first()) == {"cls"}
        for i in set(rows["sentence_index"]):
            mine = (rows["sentence_index"] == i).to_numpy()
            assert list(rows["token_class"][mine]) == ["cls"] + ["real"] * (len(seqs[i]) - 2) + ["sep"]
            seen[i] = flat[torch.from_numpy(mine.copy())]
    for i, s in enumerate(seqs):
        with torch.no_grad():
            _, cache = model.run_with_cache(torch.from_numpy(s)[None], names_filter=[site])
        torch.testing.assert_close(seen[i], cache[site][0], atol=1e-5, rtol=1e-5)
    zero = [("embed.hook_pos", lambda t, hook: t * 0)]
    a = next(iter_activations(model, sentences, "embed.hook_out", encoded=encoded))
    b = next(iter_activations(model, sentences, "embed.hook_out", encoded=encoded, fwd_hooks=zero))
    assert not torch.allclose(a["embed.hook_out"], b["embed.hook_out"])  # the intervention ran


def test_collect_from_a_capture_equals_the_forward_bit_for_bit(tiny_model_dir, windows_capture) -> None:
    model = models.load(tiny_model_dir)
    corpus = load_corpus("builtin", max_sentences=60)
    index = read_index(windows_capture)
    assert index["positions"]["window_len"] == 4 and index["positions"]["n_windows"] == 8
    source = CaptureSource(windows_capture, model)
    plan = plan_inputs(model, corpus, TINY, seed=0, max_sentences=60, max_length=64)
    for name, seqs, sites, hooks in plan.datasets():
        a = collect(model, seqs, sites, batch_size=8, fwd_hooks=hooks, name=name, max_length=64)
        b = collect(model, seqs, sites, batch_size=8, capture=source, name=name, max_length=64)
        for key, value in a.to_arrays().items():
            np.testing.assert_array_equal(value, b.to_arrays()[key], err_msg=f"{name} {key}")
    windows = make_windows(corpus, model.tokenizer, 5, max_windows=4, seed=5)  # not in the capture
    with pytest.raises(ValueError, match="does not hold"):
        collect(model, shuffle_content(windows), ["embed.hook_out"], capture=source, max_length=64)


def test_run_positions_reads_its_windows_from_the_capture(tiny_model_dir, windows_capture, tmp_path, tiny_run,
                                                          monkeypatch) -> None:  # fmt: skip
    reads = []
    original = CaptureSource.read
    monkeypatch.setattr(CaptureSource, "read", lambda self, *a, **k: reads.append(1) or original(self, *a, **k))
    run = ["run", "positions", "--no-report", *common(tiny_model_dir)]
    assert cli.main([*run, "--out", str(tmp_path / "forward")]) == 0
    assert not reads
    assert cli.main([*run, "--out", str(tmp_path / "capture"), "--activations", str(windows_capture)]) == 0
    assert reads
    for table in TABLES:
        a = pd.read_parquet(tmp_path / "forward" / "positions" / f"{table}.parquet")
        b = pd.read_parquet(tmp_path / "capture" / "positions" / f"{table}.parquet")
        assert len(a) > 0
        pd.testing.assert_frame_equal(a, b)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (["--set", "positions.max_windows=10"], "another window plan: max_windows 8 (this run: 10)"),
        (["--set", "positions.window_len=6"], "another window plan"),
        (["--max-sentences", "50"], "another corpus"),
        (["--max-length", "48"], "--max-length 64"),
        (["--other-model"], "another model"),
        (["--eval-corpus", "builtin"], "with --eval-corpus run it without --activations"),
        (["--sentences-capture"], "not positions' windows"),
    ],
)
def test_a_capture_that_does_not_fit_is_refused_in_one_line(tiny_model_dir, windows_capture, tmp_path, capsys,
                                                            monkeypatch, change, message) -> None:  # fmt: skip
    monkeypatch.setattr(positions, "Settings", lambda: TINY)
    argv, folder = common(tiny_model_dir), windows_capture
    if change == ["--other-model"]:
        from helpers import save_tiny_bert

        save_tiny_bert(tmp_path / "other", seed=1)
        argv[1] = str(tmp_path / "other")
    elif change == ["--sentences-capture"]:
        folder = tmp_path / "sentences"
        assert cli.main(["capture", "--hooks", "embed.hook_out", "--out", str(folder), *argv]) == 0
    else:
        for option, value in zip(change[::2], change[1::2], strict=True):
            argv = [*argv[: argv.index(option)], *argv[argv.index(option) + 2 :]] if option in argv else argv
            argv += [option, value]
    capsys.readouterr()
    out = tmp_path / "out"
    assert cli.main(["run", "positions", *argv, "--out", str(out), "--activations", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def test_run_all_with_a_sentence_capture_lets_positions_run_its_own_forward(tiny_model_dir, tmp_path, capsys,
                                                                           monkeypatch) -> None:  # fmt: skip
    from bertscope.experiments.cli.commands import check_activations
    from bertscope.experiments.options import RunOptions, prepare_inputs

    folder = tmp_path / "sentences"
    assert cli.main(["capture", "--hooks", "embed.hook_out", "--out", str(folder), *common(tiny_model_dir)]) == 0
    options = RunOptions(model=str(tiny_model_dir), max_sentences=60, max_length=64, activations=folder,
                         out=tmp_path / "o")  # fmt: skip
    inputs = prepare_inputs(options)
    capsys.readouterr()
    check_activations(options, inputs, {"positions": positions}, alone=False)
    assert "positions runs the model itself" in capsys.readouterr().err


def test_eval_corpus_choices_do_not_depend_on_the_eval_corpus(tiny_model_dir, tmp_path, tiny_run) -> None:
    corpus = load_corpus("builtin", max_sentences=150)
    train = write_conllu(corpus[:50], tmp_path / "train.conllu")
    paths = [write_conllu(corpus[a:b], tmp_path / f"dev_{n}.conllu") for n, a, b in (("a", 50, 100), ("b", 100, 150))]
    runs = []
    for path in paths:
        out = tmp_path / path.stem
        argv = ["run", "positions", "--no-report", *common(tiny_model_dir), "--corpus", str(train),
                "--eval-corpus", str(path), "--out", str(out)]  # fmt: skip
        assert cli.main(argv) == 0
        runs.append(out / "positions")
    notes = [json.loads((r / "manifest.json").read_text())["notes"] for r in runs]
    choices = [{k: v for k, v in n.items() if k.startswith("alpha_") or k == "capacity_choice"} for n in notes]
    assert choices[0] and choices[0] == choices[1]  # every choice made on --corpus's tuning windows
    results = [pd.read_parquet(r / "results.parquet") for r in runs]
    for path, table in zip(paths, results, strict=True):
        assert set(table["corpus"]) == {path.stem} and set(table["selection_corpus"]) == {"train"}
    a, b = (t[t["control"] == "none"].reset_index(drop=True) for t in results)
    np.testing.assert_array_equal(a["alpha"], b["alpha"])  # NaN where a row has no probe (probe-free measures)
    assert not np.allclose(a["value"], b["value"], equal_nan=True)  # each reported on its own corpus
    sweep = [pd.read_parquet(r / "capacity_sweep.parquet") for r in runs]
    assert list(sweep[0]["chosen"]) == list(sweep[1]["chosen"]) and set(sweep[0]["corpus"]) == {"dev_a"}

