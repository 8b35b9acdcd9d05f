"""Known-answer tests of the positions experiment: probes, data design, controls and the full run."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from bertscope.experiments import positions
from bertscope.experiments.corpus import Sentence, load_corpus
from bertscope.experiments.positions import probing as positions_experiment
from bertscope.experiments.positions.data import (
    CLS,
    CONTENT,
    SEP,
    collect,
    main_sites,
    make_windows,
    position_sites,
    shuffle_content,
    site_layer,
)

from bertscope import models

P = 16  # window length in these tests


def _accuracy(res: pd.DataFrame, control: str = "none") -> pd.Series:
    return res[(res["metric"] == "accuracy") & (res["control"] == control)].iloc[0]


@pytest.fixture(scope="module")
def corpus():
    return load_corpus("builtin", max_sentences=200)


# ------------------------------------------------------------------------------------------- probe answers


def test_one_hot_positions_give_accuracy_one_and_noise_gives_chance():
    n_win = 40
    y = np.tile(np.arange(P), n_win)
    groups = np.repeat(np.arange(n_win), P)
    one_hot = np.eye(P)[y]
    res = positions_experiment.probe_scores(one_hot, y, groups, task="classification", alpha=1e-3, n_boot=200)
    assert _accuracy(res)["value"] == 1.0
    assert _accuracy(res)["baseline_chance"] == pytest.approx(1 / P)

    noise = np.random.default_rng(0).normal(size=(len(y), 24))
    res = positions_experiment.probe_scores(noise, y, groups, task="classification", alpha=1e-3, n_boot=200)
    row = _accuracy(res)
    assert row["ci_low"] <= 1 / P <= row["ci_high"]
    assert row["value"] < 2.5 / P


def test_control_task_is_learnable_from_word_identity_but_position_is_not():
    # features = word identity only; each type a fixed random label: the control is learnable, position is not
    rng = np.random.default_rng(1)
    n_win, vocab = 60, 20
    types = rng.integers(0, vocab, size=n_win * P)
    y = np.tile(np.arange(P), n_win)
    groups = np.repeat(np.arange(n_win), P)
    from bertscope.probes import control_labels

    control = control_labels(types, y, seed=0)
    res = positions_experiment.probe_scores(np.eye(vocab)[types], y, groups, task="classification", alpha=0.1,
                                 n_boot=200, control=control)  # fmt: skip
    assert _accuracy(res, "control_task")["value"] == 1.0
    assert _accuracy(res)["value"] < 2.5 / P
    sel = _accuracy(res, "selectivity")
    assert sel["ci_high"] < -0.8


def test_grouped_splits_hold_a_window_identity_signal_is_not_learnable(tokenizer, corpus):
    # one-hot window id as features and a random label per window: learnable only if a window sat in both
    # train and test; the groups the experiment uses (window ids) must keep it at chance
    seqs = make_windows(corpus, tokenizer, P, max_windows=60, seed=0)
    group = np.repeat(seqs.groups, P)
    assert len(np.unique(seqs.groups)) == len(seqs)
    window_idx = np.unique(group, return_inverse=True)[1]
    label = np.random.default_rng(2).integers(0, 4, size=len(seqs))[window_idx]
    X = np.eye(len(seqs))[window_idx]
    res = positions_experiment.probe_scores(X, label, group, task="classification", alpha=0.01, n_boot=200)
    assert _accuracy(res)["value"] < 0.45  # chance is about 0.25; leakage would give 1.0
    token_groups = np.arange(len(label))  # the wrong design, for contrast
    leaky = positions_experiment.probe_scores(X, label, token_groups, task="classification", alpha=0.01, n_boot=0)
    assert _accuracy(leaky)["value"] > 0.95


def test_oof_predictions_never_train_on_their_own_window():
    groups = np.repeat(np.arange(20), 4)
    y = np.random.default_rng(0).integers(0, 10, size=20)[groups].astype(float)  # one value per window
    X = np.eye(20)[groups]  # window identity only: it predicts y exactly if the window was trained on
    pred = positions_experiment.grouped_oof_predict(X, y, groups, task="regression", alpha=1e-6, n_folds=5)
    assert np.mean(np.abs(pred - y) < 0.01) < 0.2
    for g in range(20):  # an unseen window gets the intercept: one value for every row of the window
        assert np.ptp(pred[groups == g]) < 1e-9


# ---------------------------------------------------------------------------------------- position tables


def test_sinusoidal_table_is_decoded_exactly_and_a_random_table_is_not():
    config = models.EncoderConfig(vocab_size=100, d_model=32, n_layers=1, n_heads=4, d_mlp=64, max_positions=128,
                                  position_encoding="sinusoidal")  # fmt: skip
    table = models.random_encoder(config, seed=0).W_pos.detach().numpy()
    res = positions_experiment.table_probes(table, n_folds=5, n_boot=100, n_pairs=400, seed=0)
    exact = res[(res["target"] == "abs_reg") & (res["metric"] == "exact")]["value"].iloc[0]
    r2 = res[(res["target"] == "abs_reg") & (res["metric"] == "r2")]["value"].iloc[0]
    assert exact == 1.0
    assert r2 > 0.9999
    order = res[(res["target"] == "order") & (res["features"] == "diff") & (res["metric"] == "accuracy")]
    assert order["value"].iloc[0] > 0.9

    learned = models.random_encoder(config.replace(position_encoding="learned"), seed=0).W_pos.detach().numpy()
    res = positions_experiment.table_probes(learned, n_folds=5, n_boot=0, n_pairs=400, seed=0)
    assert res[(res["target"] == "abs_reg") & (res["metric"] == "exact")]["value"].iloc[0] < 0.2


def test_position_table_views():
    table = np.random.default_rng(0).normal(size=(10, 6))
    pca, cosine = positions_experiment.position_table_views(table, n_components=3)
    assert len(pca) == 30 and sorted(pca["component"].unique()) == [1, 2, 3]
    explained = pca.groupby("component")["explained_variance"].first().to_numpy()
    assert np.all(np.diff(explained) <= 0) and 0 < explained.sum() < 1
    scores = pca.pivot(index="position", columns="component", values="score").to_numpy()
    assert np.allclose(scores.mean(0), 0, atol=1e-9)  # scores of the centred table
    m = cosine.pivot(index="i", columns="j", values="cosine").to_numpy()
    assert np.allclose(np.diag(m), 1.0, atol=1e-6) and np.allclose(m, m.T)


# ----------------------------------------------------------------------------------------------- data design


def test_windows_are_fixed_length_cuts_of_the_token_stream(tokenizer, corpus):
    seqs = make_windows(corpus, tokenizer, P, seed=0)
    stream = np.concatenate(tokenizer([s.text for s in corpus], add_special_tokens=False)["input_ids"])
    assert len(seqs) == len(stream) // P
    for w, ids in zip(seqs.groups[:5], seqs.ids[:5], strict=True):
        assert len(ids) == P + 2
        assert ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
        assert np.array_equal(ids[1:-1], stream[w * P : (w + 1) * P])
    sub = make_windows(corpus, tokenizer, P, max_windows=7, seed=3)
    assert len(sub) == 7 and np.all(np.diff(sub.groups) > 0)


def test_shuffle_keeps_tokens_specials_and_length(tokenizer, corpus):
    seqs = make_windows(corpus, tokenizer, P, max_windows=20, seed=0)
    shuffled = shuffle_content(seqs, seed=1)
    moved = 0
    for a, b in zip(seqs.ids, shuffled.ids, strict=True):
        assert a[0] == b[0] and a[-1] == b[-1] and len(a) == len(b)
        assert sorted(a[1:-1]) == sorted(b[1:-1])
        moved += int(not np.array_equal(a, b))
    assert moved >= 18 and shuffled.shuffled


def test_windows_reject_a_too_small_corpus(tokenizer):
    tiny = [Sentence(id="0", words=("a", "b"), text="a b")]
    with pytest.raises(ValueError, match="fewer than 2 windows"):
        make_windows(tiny, tokenizer, P)


def test_site_layers():
    assert position_sites(2)[:3] == ["embed.hook_word", "embed.hook_out", "blocks.0.hook_attn_out"]
    assert len(position_sites(6)) == 26 and len(main_sites(6)) == 8
    assert site_layer("embed.hook_out") == (0, "embed")
    assert site_layer("blocks.3.hook_resid_mid") == (4, "resid_mid")
    with pytest.raises(ValueError, match="not a residual-stream site"):
        site_layer("blocks.0.attn.hook_pattern")


def test_collect_matches_unpadded_forward(tokenizer, tiny_config):
    model = models.random_encoder(tiny_config, seed=0, tokenizer=tokenizer).eval()
    corpus = load_corpus("builtin", max_sentences=30)
    from bertscope.experiments.corpus import encode
    from bertscope.experiments.positions.data import sentences_from_encoded

    seqs = sentences_from_encoded(encode(corpus, tokenizer, max_length=64))
    sites = ["embed.hook_out", "blocks.1.hook_resid_post"]
    acts = collect(model, seqs, sites, batch_size=8)
    assert len(acts.seq) == int(seqs.lengths.sum())
    for i in (0, 7):
        with torch.no_grad():
            _, cache = model.run_with_cache(torch.from_numpy(seqs.ids[i])[None], names_filter=sites)
        rows = acts.seq == i
        assert np.array_equal(acts.pos[rows], np.arange(len(seqs.ids[i])))
        assert acts.kind[rows][0] == CLS and acts.kind[rows][-1] == SEP and (acts.kind[rows][1:-1] == CONTENT).all()
        for site in sites:
            assert np.allclose(acts.feats[site][rows], cache[site][0].numpy(), atol=1e-5)


def test_zeroed_position_embeddings_leave_no_position_at_embed_out_on_shuffled_windows(bundled, corpus):
    seqs = shuffle_content(make_windows(corpus, bundled.tokenizer, P, max_windows=90, seed=0), seed=0)
    site = "embed.hook_out"
    results = {}
    zero_positions = [("embed.hook_pos", lambda t, hook: torch.zeros_like(t))]
    for name, hooks in (("zeroed", zero_positions), ("intact", [])):
        acts = collect(bundled, seqs, [site], batch_size=32, fwd_hooks=hooks)
        sel = acts.kind == CONTENT
        res = positions_experiment.probe_scores(acts.feats[site][sel], acts.pos[sel] - 1, acts.group[sel],
                                     task="classification", alpha=5e-4, n_boot=200)  # fmt: skip
        results[name] = _accuracy(res)
    assert results["zeroed"]["ci_low"] <= 1 / P + 0.01 and results["zeroed"]["value"] < 2 / P
    assert results["intact"]["value"] > 0.9


# ------------------------------------------------------------------------------------------------- full run


SMALL = positions.Settings(
    window_len=8, max_windows=24, tune_windows=12, max_sentences=40, n_folds=3, n_boot=50, pairs_per_window=6,
    table_pairs=300, mdl_blocks=4, sublayer_controls=True, alphas=(1.0, 10.0), ridge_alphas=(1.0, 100.0),
    sweep_alphas=(0.1, 10.0), repeats=2, sweep_boot=20, n_jobs=1,
)  # fmt: skip
# n_jobs=1: the probes run in the test's process (no worker start per test);
# tests/experiments/test_positions_parallel.py checks that worker processes give the same tables


def test_full_run_writes_tables_and_figures_with_controls(tmp_path, tokenizer, tiny_config, monkeypatch):
    from bertscope.experiments.options import Inputs, RunOptions, corpus_summary, model_summary
    from bertscope.experiments.runner import run_experiment

    model = models.random_encoder(tiny_config, seed=0, tokenizer=tokenizer).eval()
    corpus = load_corpus("builtin", max_sentences=150)
    options = RunOptions(out=tmp_path, quiet=True, max_length=64)
    inputs = Inputs(model, corpus, torch.device("cpu"), torch.float32, model_summary(model),
                           corpus_summary(corpus))  # fmt: skip
    monkeypatch.setattr(positions, "Settings", lambda: SMALL)
    result = run_experiment(positions, options, inputs)
    assert result.status == "complete", result.error
    out = tmp_path / positions.DIRNAME
    table = pd.read_parquet(out / "results.parquet")
    for col in ("model", "site", "layer", "target", "probe", "control", "metric", "value", "ci_low", "ci_high",
                "n_train", "n_test"):  # fmt: skip
        assert col in table
    assert set(table["site"]) >= set(position_sites(2))
    controls = set(table["control"])
    assert controls >= {"none", "control_task", "selectivity", "shuffled", "zeroed_positions", "position_table",
                        "permuted_positions", "memorisation_ceiling"}  # fmt: skip
    assert set(table["target"]) >= {"abs_class", "abs_reg", "order", "distance_bucket", "sep_position",
                                    "cls_length", "abs_position"}  # fmt: skip
    assert {"cls", "sep", "content", "pair", "table"} <= set(table["token"])
    assert (table["probe"] == "mdl").any()
    scored = table[(table["metric"] == "accuracy") & ~table["control"].isin(["selectivity", "memorisation_ceiling"])]
    assert scored["baseline_chance"].notna().all() and scored["baseline_majority"].notna().all()
    summary = pd.read_csv(out / "summary_absolute.csv")
    assert list(summary["site"]) == main_sites(2)
    for name in ("fig_absolute_vs_layer", "fig_selectivity_vs_layer", "fig_relative_vs_layer",
                 "fig_probe_free_vs_layer", "fig_confusion", "fig_position_table", "fig_mdl_vs_layer"):  # fmt: skip
        assert (out / f"{name}.png").is_file() and (out / f"{name}.pdf").is_file()

    # figures come back from the saved tables alone
    for png in out.glob("fig_*.png"):
        png.unlink()
    paths = positions.plot(out)
    assert all(Path(p).is_file() for p in paths) and len(paths) >= 14


def test_ctrl_c_after_n_probes_keeps_those_n_on_the_rerun(tmp_path, tokenizer, tiny_config, monkeypatch):
    from bertscope.experiments.options import Inputs, RunOptions, corpus_summary, model_summary
    from bertscope.experiments.positions import probing
    from bertscope.experiments.runner import run_experiment

    model = models.random_encoder(tiny_config, seed=0, tokenizer=tokenizer).eval()
    corpus = load_corpus("builtin", max_sentences=150)
    options = RunOptions(out=tmp_path, quiet=True, max_length=64, keep_steps=True)
    inputs = Inputs(model, corpus, torch.device("cpu"), torch.float32, model_summary(model), corpus_summary(corpus))
    settings = dataclasses.replace(SMALL, mdl=False, sublayer_controls=False, n_boot=0)
    monkeypatch.setattr(positions, "Settings", lambda: settings)
    real, calls, n_done = probing.probe_scores, [], 5

    def probe_then_interrupt(*args, **kwargs):
        if interrupt and len(calls) == n_done:
            raise KeyboardInterrupt  # Ctrl-C while probe N + 1 runs
        calls.append(kwargs["alpha"])
        return real(*args, **kwargs)

    monkeypatch.setattr(probing, "probe_scores", probe_then_interrupt)
    interrupt = True
    with pytest.raises(KeyboardInterrupt):
        run_experiment(positions, options, inputs)
    steps = tmp_path / positions.DIRNAME / "steps"
    assert len(list(steps.glob("probe-*.parquet"))) == n_done
    assert len(list(steps.glob("activations-*.npz"))) == 6  # every activation set was cached before the probes

    interrupt, calls[:] = False, []
    result = run_experiment(positions, options, inputs)
    assert result.status == "complete", result.error
    n_probes = len(list(steps.glob("probe-*.parquet")))
    assert n_probes > n_done and len(calls) == n_probes - n_done  # the N finished probes were not refitted
