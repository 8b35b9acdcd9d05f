"""End-to-end run of the `heads` experiment through the framework, on a tiny random encoder."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from bertscope.experiments import corpus as corpus_mod
from bertscope.experiments import heads
from bertscope.experiments.heads import experiment as heads_experiment
from bertscope.experiments.heads import plots as heads_plots
from bertscope.experiments.heads import syntax as syn
from bertscope.experiments.options import Inputs, RunOptions, corpus_summary, model_summary
from bertscope.experiments.runner import run_experiment

from bertscope import models


@pytest.fixture(scope="module")
def tiny(tiny_config: models.EncoderConfig, tokenizer) -> models.Encoder:
    return models.random_encoder(tiny_config, seed=0, tokenizer=tokenizer)


def test_experiment_writes_every_table_and_figure(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(heads_plots, "FORMATS", ("png",))  # PDFs cost time and prove nothing more here
    corpus = corpus_mod.load_corpus("builtin", max_sentences=12)
    inputs = Inputs(tiny, corpus, torch.device("cpu"), torch.float32, model_summary(tiny), corpus_summary(corpus))
    options = RunOptions(out=tmp_path, quiet=True)
    result = run_experiment(heads, options, inputs)
    assert result.status == "complete", result.error
    out = tmp_path / "heads"
    results = pd.read_parquet(out / "results.parquet")
    assert list(results.columns) == heads_experiment.RESULT_COLUMNS
    per_head = results[results["head"].notna()]
    assert per_head.groupby("metric").size().eq(8).all()  # every per-head metric for all 2 x 4 heads
    for metric in ("mass_cls", "norm_sep", "entropy", "ablation:uniform:pooled_cos", "grad_importance:projection"):
        assert metric in set(results["metric"])
    masses = per_head[per_head["metric"].str.startswith("argmax_offset")].groupby(["layer", "head"])["value"].sum()
    np.testing.assert_allclose(masses, 1.0)
    assert ((per_head["ci_low"] <= per_head["value"] + 1e-12) | per_head["ci_low"].isna()).all()
    roles = pd.read_csv(out / "roles.csv")
    assert {"threshold", "statistic", "value", "assigned"} <= set(roles.columns)
    syntax = pd.read_csv(out / "syntax.csv")
    assert syntax["relation"].iloc[-2:].tolist() == [syn.ALL_RELATIONS, syn.PER_RELATION]
    distances = pd.read_parquet(out / "distances.parquet")
    assert len(distances) == 8 * 8
    assert (distances.query("layer_a == layer_b and head_a == head_b")["distance"] == 0).all()
    assert (syntax["selection"] == "held-out").all() and "punct" not in set(syntax["relation"])
    log = json.loads((out / "manifest.json").read_text())["log"]
    # 12 sentences: relations under Settings.syntax_min_arcs are named, and roles come with a warning
    skipped = next(m for m in log if "left out of syntax.csv" in m)
    assert "Settings.syntax_min_arcs" in skipped and "(1)" in skipped
    assert any("roles assigned from only 12 sentences" in m for m in log)
    pruning = pd.read_csv(out / "pruning.csv")
    assert (pruning.query("n_removed == 0")["value"].abs() < 1e-6).all()
    random = pruning[pruning["order"] == "random (mean of 20 orders)"]
    assert len(random) and (random["interval_covers"] == "sentences x 20 orders").all()
    assert (pruning.loc[pruning["order"] != random["order"].iloc[0], "selection"] == "held-out").all()
    top = pd.read_csv(out / "top_heads.csv")
    assert (top["selection"] == "held-out").all() and list(top["rank"][:5]) == [1, 2, 3, 4, 5]
    figures = sorted(p.name for p in out.glob("fig_*.png"))
    assert len(figures) == 8
    assert {p.removesuffix(".png") for p in figures} <= set(heads.CAPTIONS)  # a caption for every figure
    found = heads.findings(out)
    specialisation = [f for f in found if f.claim == "specialisation"]
    assert len(specialisation) == 1 and specialisation[0].numbers
    for f in found:  # every number the sentence relies on comes from the tables, formatted in
        assert any(f"{v:.2f}" in f.text or f"{v:.3f}" in f.text or f"{int(v)}" in f.text for v in f.numbers.values())
    for p in out.glob("fig_*"):
        p.unlink()
    redrawn = heads.plot(out)  # from the saved tables alone
    assert sorted(p.name for p in redrawn) == figures


def test_corpus_without_gold_trees_skips_syntax(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(heads_plots, "FORMATS", ("png",))
    text = tmp_path / "plain.txt"
    text.write_text("The cat sat on the mat.\nDogs bark, cats sleep.\nA hedgehog crossed the road.\n")
    corpus = corpus_mod.load_corpus(str(text))
    inputs = Inputs(tiny, corpus, torch.device("cpu"), torch.float32, model_summary(tiny), corpus_summary(corpus))
    result = run_experiment(heads, RunOptions(out=tmp_path / "out", quiet=True), inputs)
    assert result.status == "complete", result.error
    out = tmp_path / "out" / "heads"
    assert not (out / "syntax.csv").exists() and not (out / "fig_syntax.png").exists()
    results = pd.read_parquet(out / "results.parquet")
    assert not results["metric"].str.startswith("syntax:").any()
    roles = pd.read_csv(out / "roles.csv")
    assert not roles.query("role == 'syntactic'")["assigned"].any()
    assert (out / "fig_heatmaps.png").exists() and (out / "fig_pruning.png").exists()


def test_pruning_pass_reads_each_half_with_the_order_chosen_on_the_other(tiny):
    """importance_pass's batched, half-by-half pruning equals pruning_curve with each order on every sentence."""
    from bertscope.experiments.heads import passes, pruning
    from bertscope.experiments.heads import statistics as hs

    corpus = corpus_mod.load_corpus("builtin", max_sentences=10)
    batches = list(corpus_mod.encode(corpus, tiny.tokenizer, batch_size=4).batches)
    settings = heads_experiment.Settings(pruning_points=4, pruning_random_orders=3, methods=("zero",))
    out = passes.importance_pass(tiny, batches, settings, seed=1, rng=np.random.default_rng(5))
    order = np.concatenate([b.sentence_index for b in batches])
    inverse = np.argsort(order)
    counts = out["pruning_counts"].tolist()
    n_heads = tiny.config.n_heads
    fold = hs.heldout_folds(len(corpus), 1)
    ablation = out["effects"][:, 0, :, :, 1]  # zero, pooled_cos
    for f in (0, 1):
        chosen = np.argsort(ablation[fold != f].mean(0).ravel(), kind="stable")
        full = pruning.pruning_curve(tiny, batches, [divmod(int(i), n_heads) for i in chosen], counts)[inverse]
        o = out["pruning_orders"].tolist().index("ablation (zero), least important first")
        np.testing.assert_allclose(out["pruning"][fold == f, o], full[fold == f], atol=1e-5)
    rng = np.random.default_rng(5)
    for r in range(3):
        flat = rng.permutation(tiny.config.n_layers * n_heads)
        full = pruning.pruning_curve(tiny, batches, [divmod(int(i), n_heads) for i in flat], counts)[inverse]
        np.testing.assert_allclose(out["pruning_random"][:, r], full, atol=1e-5)
