"""positions ``--eval-corpus``: the window, sentence and [CLS]/[SEP] probes are fit on ``--corpus``'s windows and
sentences and scored on every window/sentence of the evaluation corpus (`probes.evaluate_split`), with control
tasks fit and scored the same way, and ``trained_on`` saying so."""

from __future__ import annotations

import bertscope.probes
import numpy as np
import pandas as pd
import pytest
from bertscope.experiments import cli, positions
from bertscope.experiments.corpus import load_corpus, write_conllu
from bertscope.experiments.positions import experiment, probing
from test_positions_activations import TINY, common


@pytest.fixture
def split_run(monkeypatch):
    """positions with `TINY` settings, the probe steps that train on --corpus, and a spy on `evaluate_split`."""
    monkeypatch.setattr(positions, "Settings", lambda: TINY)
    monkeypatch.setattr(positions, "plot", lambda out_dir: [])
    steps = experiment._steps

    def fewer(design, acts, tables, settings):
        keep = ("absolute_windows", "absolute_sentences", "specials", "capacity_sweep", "relative_pairs",
                "confusion")
        return {k: v for k, v in steps(design, acts, tables, settings).items() if k in keep}

    monkeypatch.setattr(experiment, "_steps", fewer)
    calls: list[tuple[np.ndarray, np.ndarray, int]] = []
    real = bertscope.probes.evaluate_split

    def spy(X_train, y_train, X_test, *args, **kwargs):
        calls.append((np.array(X_train), np.array(y_train), len(X_test)))
        return real(X_train, y_train, X_test, *args, **kwargs)

    monkeypatch.setattr(bertscope.probes, "evaluate_split", spy)
    return calls


def test_eval_corpus_probes_are_fit_on_corpus_and_scored_on_every_eval_row(tiny_model_dir, tmp_path,
                                                                          split_run) -> None:  # fmt: skip
    corpus = load_corpus("builtin", max_sentences=150)
    train = write_conllu(corpus[:50], tmp_path / "train.conllu")
    paths = [write_conllu(corpus[a:b], tmp_path / f"dev_{n}.conllu") for n, a, b in (("a", 50, 100), ("b", 100, 150))]
    fits, results = [], []
    for path in paths:
        out = tmp_path / path.stem
        start = len(split_run)
        argv = ["run", "positions", "--no-report", *common(tiny_model_dir), "--corpus", str(train),
                "--eval-corpus", str(path), "--out", str(out)]  # fmt: skip
        assert cli.main(argv) == 0
        fits.append(split_run[start:])
        results.append(pd.read_parquet(out / "positions" / "results.parquet"))
    # the fitted probes never see an eval row: their training inputs are the same whichever eval corpus is scored
    assert len(fits[0]) == len(fits[1]) > 0
    for (xa, ya, _), (xb, yb, _) in zip(*fits, strict=True):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
    for path, table in zip(paths, results, strict=True):
        assert set(table["corpus"]) == {path.stem} and set(table["selection_corpus"]) == {"train"}
        split = table[table["trained_on"] == "train"]
        assert set(split["data"]) == {"windows", "sentences"} and (split["n_folds"] == 0).all()
        assert {"content", "cls", "sep"} <= set(split["token"])
        assert {"none", "control_task", "selectivity", "shuffled"} <= set(split["control"])
        assert {"zeroed_positions"} <= set(split["control"]) or "zeroed_positions" not in set(table["control"])
        # scored on every eval row (one prediction each), trained on another number of rows
        win = split[(split["data"] == "windows") & (split["target"] == "abs_class") & (split["control"] == "none")]
        assert win["n_test"].nunique() == 1 and (win["n_test"] == TINY.max_windows * TINY.window_len).all()
        assert (win["ci_covers"] == "groups").all()
        ceiling = table[table["control"] == "memorisation_ceiling"]
        assert len(ceiling) and set(ceiling["trained_on"]) == {"train"} and (ceiling["n_folds"] == 0).all()
        pairs = table[table["token"] == "pair"]
        assert len(pairs) and set(pairs["trained_on"]) == {"train"} and (pairs["n_folds"] == 0).all()
        assert {"none", "control_task", "selectivity"} <= set(pairs["control"])
        sweep = table[table["probe"] == "sweep"]
        assert len(sweep) and set(sweep["trained_on"]) == {"train"} and (sweep["n_folds"] == 0).all()
        assert (sweep["n_test"] == TINY.max_windows * TINY.window_len).all()
        confusion = pd.read_parquet(tmp_path / path.stem / "positions" / "confusion.parquet")
        assert set(confusion["trained_on"]) == {"train"} and set(confusion["corpus"]) == {path.stem}
        # every eval window token predicted once per heatmap site (a tiny model lists one site twice)
        assert (confusion.groupby("site")["count"].sum() % (TINY.max_windows * TINY.window_len) == 0).all()
        summary = pd.read_parquet(tmp_path / path.stem / "positions" / "summary_absolute.parquet")
        assert set(summary["trained_on"]) == {"train"} and set(summary["corpus"]) == {path.stem}
    a, b = (t[t["trained_on"] == "train"].reset_index(drop=True) for t in results)
    np.testing.assert_array_equal(a["n_train"], b["n_train"])
    assert not np.allclose(a["value"], b["value"], equal_nan=True)  # each scored on its own corpus


def test_memorisation_ceiling_split_counts_eval_tokens_whose_type_was_trained_on() -> None:
    out = probing.memorisation_ceiling_split(np.array([1, 2, 3]), np.array([1, 1, 4, 5, 2, 9]),
                                             np.array([0, 0, 1, 1, 2, 2]), n_boot=50)  # fmt: skip
    assert out["value"] == pytest.approx(3 / 6) and 0 <= out["low"] <= 0.5 <= out["high"] <= 1
