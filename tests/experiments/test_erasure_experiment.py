"""`bertscope run erasure` at a tiny size: the tables, the train/eval split, LEACE's guarantee at the erased site,
the equal-rank random control, and --eval-corpus."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from bertscope.experiments import erasure
from bertscope.experiments.corpus import load_corpus, write_conllu
from bertscope.experiments.erasure import measures
from bertscope.experiments.options import Inputs, RunOptions, corpus_summary, model_summary, prepare_inputs
from bertscope.experiments.runner import run_experiment

SMALL = erasure.Settings(n_train=24, n_eval=12, concepts=("upos",), probed=("upos", "position"),
                         methods=("leace", "inlp", "mean"), erase_layers=(1,), inlp_iterations=2,
                         structural_epochs=2, structural_rank=8, n_boot=20, source="run")


def run_small(bundled, tmp_path: Path, monkeypatch, *, eval_corpus=None, corpus=None) -> Path:
    corpus = corpus or load_corpus("builtin", max_sentences=60)
    monkeypatch.setattr(erasure, "Settings", lambda: SMALL)
    inputs = Inputs(bundled, corpus, torch.device("cpu"), torch.float32, model_summary(bundled),
                    corpus_summary(corpus))
    if eval_corpus is not None:
        inputs.eval_corpus, inputs.eval_corpus_info = eval_corpus, corpus_summary(eval_corpus)
    result = run_experiment(erasure, RunOptions(out=tmp_path, quiet=True), inputs)
    assert result.status == "complete", result.error
    return tmp_path / erasure.DIRNAME


def test_erasure_runs_and_leace_leaves_the_majority_at_the_site(bundled, tmp_path, monkeypatch) -> None:
    out = run_small(bundled, tmp_path, monkeypatch)
    r = pd.read_parquet(out / "results.parquet")
    assert set(r["method"]) == {"none", "leace", "inlp", "mean", "random"}
    assert (r["split"] == "eval").all() and r["train_corpus"].iloc[0] == "builtin:train-part"
    site = r[(r["measure"] == "site_probe_accuracy")].set_index("method")
    # the ridge probe's coefficients are Σxx⁻¹ Σxz: after LEACE it predicts the training majority everywhere
    assert site.loc["leace", "value"] == pytest.approx(site.loc["leace", "majority"], abs=0.02)
    for method in ("leace", "inlp", "mean"):  # each erasure has its equal-rank random control
        rank = int(r[r["method"] == method]["rank"].iloc[0])
        assert ((r["method"] == "random") & (r["rank"] == rank)).any()
    assert {"uuas", "dspr", "probe_accuracy", "embedding_cosine", "similarity_spearman",
            "site_control_accuracy"} <= set(r["measure"])
    assert not (r["measure"] == "mlm_accuracy").any()  # the bundled model has no masked-LM head
    clean = r[(r["method"] == "none") & (r["measure"] == "probe_accuracy")]
    assert clean["delta"].abs().max() == 0
    probing = pd.read_parquet(out / "probing.parquet")
    assert set(probing["label"]) == {"task", "control", "selectivity"}
    assert set(probing["layer"]) == set(range(bundled.config.n_layers + 1))
    # per layer and sublayer: the attention and MLP outputs of every block beside the residual stream
    assert set(probing["component"]) == {"embed", "resid_post", "attn_out", "mlp_out"}
    sub = probing[(probing["component"] == "mlp_out") & (probing["label"] == "selectivity")]
    assert set(sub["site"]) == {f"blocks.{b}.hook_mlp_out" for b in range(bundled.config.n_layers)}
    assert sub["value"].notna().all()
    summary = pd.read_parquet(out / "summary.parquet")
    assert {"same_delta", "random_same_delta", "uuas_delta", "random_uuas_delta"} <= set(summary)
    assert (out / "erasure_uuas.png").is_file()
    found = erasure.findings(out)
    assert found and "random subspace of the same rank" in found[0].text


def test_split_never_shares_sentences(bundled, tmp_path) -> None:
    corpus = load_corpus("builtin", max_sentences=60)
    opts = RunOptions(out=tmp_path, quiet=True)
    inputs = Inputs(bundled, corpus, torch.device("cpu"), torch.float32, model_summary(bundled),
                    corpus_summary(corpus))
    from bertscope.experiments.context import Context

    ctx = Context("erasure", opts, inputs, tmp_path, settings=SMALL)
    from bertscope.experiments.erasure.experiment import _choose_sentences

    split = _choose_sentences(ctx, SMALL)
    assert not {s.id for s in split.train} & {s.id for s in split.eval}
    assert len(split.eval) == SMALL.n_eval and len(split.train) == SMALL.n_train


def test_eval_corpus_option_reports_on_the_other_corpus(bundled, tmp_path, monkeypatch) -> None:
    corpus = load_corpus("builtin", max_sentences=80)
    train_path = write_conllu(corpus[:50], tmp_path / "train.conllu")
    eval_path = write_conllu(corpus[50:], tmp_path / "dev.conllu")
    opts = RunOptions(corpus=str(train_path), eval_corpus=str(eval_path), out=tmp_path / "o", quiet=True)
    inputs = prepare_inputs(opts)
    assert inputs.eval_corpus is not None and len(inputs.eval_corpus) == 30
    out = run_small(bundled, tmp_path / "run", monkeypatch, eval_corpus=inputs.eval_corpus, corpus=inputs.corpus)
    r = pd.read_parquet(out / "results.parquet")
    assert set(r["train_corpus"]) == {"train"} and set(r["eval_corpus"]) == {"dev"}


def test_eval_corpus_missing_file_is_a_usage_error(tmp_path) -> None:
    from bertscope.experiments.options import UsageError

    with pytest.raises(UsageError, match="--eval-corpus"):
        prepare_inputs(RunOptions(eval_corpus=str(tmp_path / "nope.conllu"), out=tmp_path))


def test_word_labels_and_ridge_probe() -> None:
    corpus = load_corpus("builtin", max_sentences=5)
    pos = measures.word_labels(corpus, "position", max_position=3, max_depth=7)
    assert pos[:4].tolist() == ["0", "1", "2", "3"] and len(pos) == corpus.n_words
    depth = measures.word_labels(corpus, "depth", max_position=3, max_depth=1)
    assert set(depth) <= {"0", "1"}
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 300)
    x = rng.normal(size=(300, 6)) + np.eye(3)[y] @ rng.normal(size=(3, 6)) * 4
    assert np.mean(measures.fit_probe(x, y, alpha=1e-3).predict(x) == y) > 0.9


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="unknown concepts"):
        dataclasses.replace(SMALL, concepts=("colour",))
    with pytest.raises(ValueError, match="methods"):
        dataclasses.replace(SMALL, methods=("pca",))
