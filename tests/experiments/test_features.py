"""The features experiment: known answers for latent labelling (a planted duplicate latent is labelled
"duplicate", a planted position latent "position", shuffled labels find nothing), SAEBench's k-sparse probing
conventions, and `bertscope run features` end to end at a tiny size."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from bertscope.experiments import features
from bertscope.experiments.features import labels as L
from bertscope.experiments.features import measures as M
from bertscope.experiments.features import steps as S


def synthetic_rows(n_sentences: int = 120, seed: int = 0) -> tuple[L.TokenRows, list[str]]:
    """Sentences of 6-14 pieces between [CLS] (id 0) and [SEP] (id 1) drawn from a 12-piece vocabulary (so
    repeats are common)."""
    rng = np.random.default_rng(seed)
    parts = {k: [] for k in ("sentence", "position", "token_id", "word", "cls", "sep")}
    for s in range(n_sentences):
        n = int(rng.integers(6, 15))
        ids = [0, *rng.integers(2, 14, n).tolist(), 1]
        for p, t in enumerate(ids):
            parts["sentence"].append(s)
            parts["position"].append(p)
            parts["token_id"].append(t)
            parts["word"].append(p - 1 if 0 < p < len(ids) - 1 else -1)
            parts["cls"].append(p == 0)
            parts["sep"].append(p == len(ids) - 1)
    a = {k: np.asarray(v) for k, v in parts.items()}
    rows = L.TokenRows(a["sentence"], a["position"], a["token_id"], a["word"], a["cls"], a["sep"])
    return rows, ["[CLS]", "[SEP]", ",", *[f"w{i}" for i in range(11)]]


def test_concepts_mark_repeats_earlier_copies_positions_and_sep_distance() -> None:
    rows = L.TokenRows(np.zeros(6, int), np.arange(6), np.array([0, 5, 7, 5, 5, 1]), np.array([-1, 0, 1, 2, 3, -1]),
                       np.array([1, 0, 0, 0, 0, 0], bool), np.array([0, 0, 0, 0, 0, 1], bool))
    y, names = L.concept_matrix(rows, [], ["[CLS]", "[SEP]"] + ["x"] * 10, syntax=False)
    col = dict(zip(names, y.T, strict=True))
    assert col["repeats_earlier"].tolist() == [False, False, False, True, True, False]
    assert col["earlier_copy"].tolist() == [False, True, False, True, False, False]
    assert col["position=3"].tolist() == [False, False, False, True, False, False]
    assert col["to_sep=1"].tolist() == [False] * 4 + [True, False]
    assert col["cls"][0] and col["sep"][5] and L.family_of("to_sep=3-5") == "position"
    # [CLS] is always position 0 and [SEP] distance 0: those are token identities ("cls", "sep"), never position
    assert "position=0" not in col and "to_sep=0" not in col
    position = np.stack([c for n, c in col.items() if L.family_of(n) == "position"], axis=1)
    assert not position[0].any() and not position[5].any()


def test_a_cls_detector_is_a_special_token_latent_and_a_position_detector_a_position_latent() -> None:
    """Known answer (issue 40.7): a latent firing on [CLS] only is labelled "cls" (family special), not
    position 0; one firing on the piece at position 3 only is labelled position=3; one on [SEP] only is "sep"."""
    rows, tokens = synthetic_rows()
    y, names = L.concept_matrix(rows, [], tokens, syntax=False)
    col = dict(zip(names, y.T, strict=True))
    a = np.zeros((len(rows), 3), np.float32)
    a[:, 0] = rows.is_cls * 2.0
    a[:, 1] = col["position=3"] * 1.5
    a[:, 2] = rows.is_sep * 1.0
    table = _label(a, rows, y, names).set_index("unit")
    assert (table.loc[0, "label"], table.loc[0, "family"]) == ("cls", "special")
    assert (table.loc[1, "label"], table.loc[1, "family"]) == ("position=3", "position")
    assert (table.loc[2, "label"], table.loc[2, "family"]) == ("sep", "special")
    assert np.allclose(table["test_mcc"], 1.0)
    assert "token identity" in L.meaning("cls") and "position 3" in L.meaning("position=3")


def _label(a: np.ndarray, rows: L.TokenRows, y: np.ndarray, names: list[str]) -> pd.DataFrame:
    dev = rows.sentence % 2 == 0  # dev sentences choose; the others are reported on
    splits = S.Splits({"dev": y[dev], "test": y[~dev]}, names)
    table, _ = S.label_table(a[dev], a[~dev], splits, rows.sentence[~dev], sparse=True, units=np.arange(a.shape[1]),
                             n_boot=50, seed=0)
    return table


def test_planted_duplicate_and_position_latents_get_their_labels_and_shuffled_labels_find_nothing() -> None:
    rows, tokens = synthetic_rows()
    y, names = L.concept_matrix(rows, [], tokens, syntax=False)
    col = dict(zip(names, y.T, strict=True))
    rng = np.random.default_rng(1)
    a = np.zeros((len(rows), 4), np.float32)
    a[:, 0] = col["repeats_earlier"] * rng.uniform(1, 2, len(rows))  # fires exactly on repeated tokens
    a[:, 1] = col["position=2"] * 3.0  # codes position 2
    a[:, 2] = (rng.random(len(rows)) < 0.1) * rng.uniform(0.5, 1, len(rows))  # noise
    a[:, 3] = np.where(rows.position > 0, 1.0 / np.maximum(rows.position, 1), 0)  # decays with position
    table = _label(a, rows, y, names).set_index("unit")
    assert table.loc[0, "label"] == "repeats_earlier" and table.loc[0, "family"] == "duplicate"
    assert table.loc[0, "test_mcc"] == pytest.approx(1.0) and table.loc[0, "ci_low"] == pytest.approx(1.0)
    assert table.loc[1, "label"] == "position=2" and table.loc[1, "test_mcc"] == pytest.approx(1.0)
    assert table.loc[3, "family"] == "position" and table.loc[3, "test_mcc"] > 0.5  # a graded code: one bin
    assert table.loc[2, "test_mcc"] < 0.2
    shuffled = y[np.random.default_rng(2).permutation(len(y))]
    null = _label(a, rows, shuffled, names)
    assert (null["test_mcc"] < 0.2).all()  # nothing above chance once labels are shuffled


def test_mcc_is_zero_at_chance_and_one_when_exact() -> None:
    assert M.mcc(10, 0, 0, 90) == 1.0 and M.mcc(0, 0, 10, 90) == 0.0
    assert M.mcc(5, 45, 5, 45) == pytest.approx(0.0)


def test_sparse_probing_follows_saebench() -> None:
    """Top-k by |mean(pos) - mean(neg)| on train (SAEBench's `get_top_k_mean_diff_mask`), balanced samples, and
    a logistic regression with sklearn's objective (C = 1)."""
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 6))
    y = x[:, 4] + 0.3 * rng.normal(size=600) > 1.0
    x[y, 1] += 0.8
    assert M.top_k_mean_diff(x, y, 2).tolist() == [4, 1]
    idx = M.balanced(y, np.random.default_rng(0), 10_000)
    assert y[idx].sum() == (~y[idx]).sum() == y.sum()
    w, b = M.logistic_fit(x[:, [4, 1]], y)
    ref = LogisticRegression(C=1.0, max_iter=1000, tol=1e-10).fit(x[:, [4, 1]], y)
    np.testing.assert_allclose(w, ref.coef_[0], rtol=1e-4)
    assert b == pytest.approx(ref.intercept_[0], rel=1e-4)
    sent = np.arange(600) // 6
    parts = M.sparse_probe(x[:300], y[:300], x[300:], y[300:], sent[300:], (1, 2), seed=0)
    assert parts[0]["units"] == [4] and parts[1]["accuracy"] > 0.85
    value, low, high = M.mean_accuracy_interval(parts[:1], n_boot=50, seed=0)
    assert low <= value <= high and value == pytest.approx(parts[0]["accuracy"])


SMALL = features.Settings(n_train=40, n_dev=16, n_test=16, layers=(0, 5), width="96", k=8, tokens=2048,
                          batch_size=256, buffer_rows=2048, n_boot=20, ks=(1, 2), max_per_class=300)


def test_features_runs_end_to_end(bundled, tmp_path: Path, monkeypatch) -> None:
    from bertscope.experiments.corpus import load_corpus
    from bertscope.experiments.options import Inputs, RunOptions, corpus_summary, model_summary
    from bertscope.experiments.runner import run_experiment

    corpus = load_corpus("builtin", max_sentences=80)
    monkeypatch.setattr(features, "Settings", lambda: SMALL)
    inputs = Inputs(bundled, corpus, torch.device("cpu"), torch.float32, model_summary(bundled),
                    corpus_summary(corpus))
    result = run_experiment(features, RunOptions(out=tmp_path, quiet=True), inputs)
    assert result.status == "complete", result.error
    out = tmp_path / features.DIRNAME
    r = pd.read_parquet(out / "results.parquet")
    assert set(r["basis"]) == {"latent", "neuron", "pca", "latent_shuffled_labels"}
    assert set(r["encoder"]) == {"trained", "reinit"} and (r["split"] == "test").all()
    assert set(r["site"]) == {"blocks.0.hook_resid_post", "blocks.5.hook_resid_post", "blocks.3.hook_resid_mid"}
    s = pd.read_parquet(out / "summary.parquet")
    assert {"n_position", "n_duplicate", "n_syntax", "n_special", "share_beating_neuron_and_pca"} <= set(s)
    p = pd.read_parquet(out / "sparse_probing_summary.parquet")
    assert set(p["source"]) == {"latent", "neuron", "pca", "reinit_latent"} and set(p["k"]) == {1, 2}
    assert (p["ci_low"] <= p["accuracy"] + 1e-9).all()
    page = (out / "feature_browser.html").read_text()
    assert "http://" not in page and "https://" not in page and "<script src" not in page
    # The trained dictionaries are saved for `bertscope explore --dictionary`, and the browser gives that command.
    saved = out / "dictionaries" / "blocks.5.hook_resid_post"
    assert (saved / "cfg.json").is_file() and (out / "dictionaries" / "blocks.3.hook_resid_mid" / "cfg.json").is_file()
    assert f"--dictionary {saved}" in page
    from bertscope.experiments.explorer import explore

    view = explore(bundled, "The cat sat on the mat.", dictionary=saved, latents=[0, 1], qk=False)
    assert view.payload["latents"]["site"] == "blocks.5.hook_resid_post"
    assert len(view.payload["sentences"][0]["latents"]) == 2
    found = features.findings(out)
    assert found and any("alive latents" in f.text for f in found)
    assert (out / "fig_labelled_units.png").is_file()
    from bertscope.experiments.report import build_report

    index = build_report(tmp_path).read_text()
    assert 'href="features/feature_browser.html"' in index  # the report links the browser
