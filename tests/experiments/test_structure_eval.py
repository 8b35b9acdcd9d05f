"""`bertscope run structure --eval-corpus`: train and select on --corpus, report on the other corpus. Known answer
for "no selection sees the evaluation sentences": two runs that differ only in the evaluation corpus have the same
training split, the same dev-split scores (exactly) and the same selections (best layer, smallest rank)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from bertscope.experiments import structure
from bertscope.experiments.corpus import load_corpus, write_conllu
from bertscope.experiments.options import Inputs, RunOptions, corpus_summary, model_summary
from bertscope.experiments.runner import run_experiment
from bertscope.experiments.structure import data
from bertscope.models import load

SMALL = structure.Settings(n_train=10, n_dev=4, n_test=6, max_epochs=2, ranks=(2,), random_weights=False,
                           sublayers=False, n_boot=20, n_examples=1, workers=1)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load(tiny_model_dir)


def run_eval(bundled, out: Path, monkeypatch, train, evaluate) -> Path:
    monkeypatch.setattr(structure, "Settings", lambda: SMALL)
    inputs = Inputs(bundled, train, torch.device("cpu"), torch.float32, model_summary(bundled), corpus_summary(train))
    inputs.eval_corpus, inputs.eval_corpus_info = evaluate, corpus_summary(evaluate)
    result = run_experiment(structure, RunOptions(out=out, quiet=True), inputs)
    assert result.status == "complete", result.error
    return out / structure.DIRNAME


def test_split_with_an_evaluation_corpus_draws_test_from_it() -> None:
    s = data.split_sentences(30, 10, 4, 6, np.random.default_rng(0), n_eval_available=8)
    assert len(s.train) == 10 and len(s.dev) == 4 and not set(s.train) & set(s.dev)
    assert len(s.test) == 6 and s.test.max() < 8
    again = data.split_sentences(30, 10, 4, 6, np.random.default_rng(0), n_eval_available=50)
    np.testing.assert_array_equal(s.train, again.train)  # the training split ignores the evaluation corpus
    np.testing.assert_array_equal(s.dev, again.dev)
    with pytest.raises(ValueError, match="evaluation"):
        data.split_sentences(30, 10, 4, 6, np.random.default_rng(0), n_eval_available=1)


def test_selections_never_see_the_evaluation_sentences(tiny, tmp_path, monkeypatch) -> None:
    corpus = load_corpus("builtin", max_sentences=70)
    train = load_corpus(write_conllu(corpus[:30], tmp_path / "train.conllu"))
    eval_a = load_corpus(write_conllu(corpus[30:50], tmp_path / "dev_a.conllu"))
    eval_b = load_corpus(write_conllu(corpus[50:70], tmp_path / "dev_b.conllu"))
    out_a = run_eval(tiny, tmp_path / "a", monkeypatch, train, eval_a)
    out_b = run_eval(tiny, tmp_path / "b", monkeypatch, train, eval_b)
    ra, rb = (pd.read_parquet(o / "results.parquet") for o in (out_a, out_b))
    assert set(ra["test_corpus"]) == {"dev_a"} and set(rb["test_corpus"]) == {"dev_b"}
    assert set(ra["corpus"]) == {"train"} and (ra["split"] == "test").all()
    probes = ra["encoder"] == "trained"
    np.testing.assert_array_equal(ra.loc[probes, "dev_value"], rb.loc[probes, "dev_value"])
    assert not np.allclose(ra.loc[probes, "value"], rb.loc[probes, "value"])  # reported on other sentences
    sa, sb = (pd.read_parquet(o / "summary.parquet") for o in (out_a, out_b))
    assert sa["best_on_dev"].tolist() == sb["best_on_dev"].tolist()
    np.testing.assert_array_equal(sa["smallest_rank"], sb["smallest_rank"])
    assert "of dev_a" in sa["selection"].iloc[0] and "of train" in sa["selection"].iloc[0]
    examples = pd.read_parquet(out_a / "examples.parquet")
    assert set(examples["sentence_id"]) <= {s.id for s in eval_a}


def test_spearman_leaves_out_one_word_sentences_outside_the_lengths() -> None:
    from bertscope.probes.structural import length_macro_mean

    total = np.array([np.nan, 3.0, 2.5])  # a one-word sentence's correlation is undefined
    count, length = np.array([1.0, 5.0, 5.0]), np.array([1, 5, 5])
    assert length_macro_mean(total, count, length) == pytest.approx(0.55)
    boot = length_macro_mean(total, count, length, weights=np.array([[1.0, 2.0, 0.0], [0.0, 1.0, 1.0]]))
    np.testing.assert_allclose(boot, [0.6, 0.55])
