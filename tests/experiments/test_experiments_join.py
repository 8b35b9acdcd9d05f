"""The three experiments' tables join: the same model identifier (the source `bertscope info` prints) and the
same corpus identifier in every results table."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest
import torch
from bertscope.experiments import heads, positions, same_token
from bertscope.experiments.corpus import load_corpus
from bertscope.experiments.options import Inputs, RunOptions, corpus_summary, model_summary
from bertscope.experiments.runner import run_experiment

from bertscope import models


@pytest.mark.slow
def test_model_and_corpus_identifiers_join_across_experiments(tmp_path, tiny_model_dir, monkeypatch):
    from test_positions import SMALL

    model = models.load(tiny_model_dir)
    corpus = load_corpus("builtin", max_sentences=150)
    inputs = Inputs(model, corpus, torch.device("cpu"), torch.float32, model_summary(model), corpus_summary(corpus))
    options = RunOptions(out=tmp_path, quiet=True, max_length=64)
    small = {
        same_token: same_token.Settings(max_sentences=6, n_boot=10, vocab_sample=100),
        heads: heads.Settings(max_sentences=12, distance_sentences=6, importance_sentences=4, n_boot=10,
                              pruning_points=2, n_projections=1),  # fmt: skip
        positions: dataclasses.replace(SMALL, mdl=False, n_boot=0, sublayer_controls=False),
    }
    ids = {}
    for experiment, settings in small.items():
        monkeypatch.setattr(experiment, "Settings", lambda s=settings: s)
        monkeypatch.setattr(experiment, "plot", lambda out_dir: [])  # figures are not the point here
        result = run_experiment(experiment, options, inputs)
        assert result.status == "complete", result.error
        table = pd.read_parquet(tmp_path / experiment.DIRNAME / "results.parquet")
        ids[experiment.NAME] = (set(table["model"]), set(table["corpus"]))
    assert all(models_ == {str(model.source)} for models_, _ in ids.values()), ids
    assert str(model.source) == inputs.model_info["source"]  # what `bertscope info` prints as `model`
    assert all(corpus.name in corpora for _, corpora in ids.values()), ids
    joined = pd.read_parquet(tmp_path / "heads" / "results.parquet")[["model", "corpus"]].drop_duplicates().merge(
        pd.read_parquet(tmp_path / "positions" / "results.parquet")[["model", "corpus"]].drop_duplicates()
    ).merge(pd.read_parquet(tmp_path / "same_token" / "results.parquet")[["model", "corpus"]].drop_duplicates())
    assert len(joined) == 1
