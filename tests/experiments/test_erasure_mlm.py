"""Erasure's (d): masked-LM accuracy where the model has a masked-LM head, on a tiny random BertForMaskedLM saved
offline. Known answer: the clean hits equal transformers' own BertForMaskedLM on the same masked pieces; the
experiment writes ``mlm_accuracy`` rows whose delta is erased minus clean."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch
import transformers
from bertscope.experiments import erasure
from bertscope.experiments.corpus import encode, load_corpus
from bertscope.experiments.erasure import measures
from bertscope.experiments.options import Inputs, RunOptions, corpus_summary, model_summary
from bertscope.experiments.runner import run_experiment
from bertscope.models import load
from helpers import save_tiny_bert
from test_erasure_experiment import SMALL


@pytest.fixture(scope="module")
def tiny_mlm(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_mlm")
    hf = save_tiny_bert(folder, cls=transformers.BertForMaskedLM, seed=3)
    return hf, load(folder)


def test_clean_mlm_hits_equal_transformers_masked_lm(tiny_mlm) -> None:
    hf, model = tiny_mlm
    assert model.mlm_head is not None
    corpus = load_corpus("builtin", max_sentences=6)
    enc = encode(corpus, model.tokenizer, batch_size=4)
    n_words = [len(s) for s in corpus]
    act = measures.collect(model, enc, ["blocks.0.hook_resid_post"], n_words, mlm_every=3)
    assert act.mlm is not None
    hits, count = act.mlm
    want_hits, want_count = np.zeros(len(corpus)), np.zeros(len(corpus))
    with torch.no_grad():
        for batch in enc:
            word = batch.word_ids >= 0
            chosen = word & (torch.cumsum(word.long(), 1) % 3 == 0)
            masked = torch.where(chosen, model.tokenizer.mask_token_id, batch.input_ids)
            logits = hf(input_ids=masked, attention_mask=batch.attention_mask).logits
            right = (logits.argmax(-1) == batch.input_ids) & chosen
            want_hits[batch.sentence_index] += right.sum(1).numpy()
            want_count[batch.sentence_index] += chosen.sum(1).numpy()
    np.testing.assert_array_equal(count, want_count)
    np.testing.assert_array_equal(hits, want_hits)
    assert count.sum() > 0


def test_erasure_reports_mlm_accuracy_change(tiny_mlm, tmp_path, monkeypatch) -> None:
    _, model = tiny_mlm
    small = dataclasses.replace(SMALL, mlm_every=2, methods=("leace",))
    monkeypatch.setattr(erasure, "Settings", lambda: small)
    corpus = load_corpus("builtin", max_sentences=60)
    inputs = Inputs(model, corpus, torch.device("cpu"), torch.float32, model_summary(model), corpus_summary(corpus))
    result = run_experiment(erasure, RunOptions(out=tmp_path, quiet=True), inputs)
    assert result.status == "complete", result.error
    r = pd.read_parquet(tmp_path / erasure.DIRNAME / "results.parquet")
    mlm = r[r["measure"] == "mlm_accuracy"].set_index("method")
    assert {"none", "leace", "random"} <= set(mlm.index)
    assert mlm.loc["none", "delta"] == 0
    assert 0 <= mlm.loc["leace", "value"] <= 1
    assert mlm.loc["leace", "value"] - mlm.loc["none", "value"] == pytest.approx(mlm.loc["leace", "delta"], abs=1e-9)
    assert (mlm["split"] == "eval").all()
