"""The tuned lens and the per-stream metrics (``bertscope.probes.lens``): known answers on the constructed MLM,
an untrained tuned lens is the logit lens, training lowers held-out KL, save/load, intervals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from bertscope.models import load
from bertscope.probes.lens import TunedLens, fit_tuned_lens, lens_metrics, masked_streams
from helpers import corpus_texts, save_tiny_bert
from mlm_fixtures import ANSWER, N_LAYERS, K, constructed_mlm

MASK_ID = 0


def _ids(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` rows of 6 tokens drawn from 1..10 (never the answer, never the mask id), no padding."""
    ids = torch.randint(1, 11, (n, 6), generator=torch.Generator().manual_seed(seed))
    return ids, torch.ones_like(ids)


def _table(metrics):
    return metrics.pivot(index="stream", columns="measure", values="value")


def test_constructed_mlm_logit_and_tuned_lens():
    """Logit lens: agreement with the final prediction 0 before stream K, 1 from K on. A tuned lens fitted on
    other sentences agrees everywhere on held-out ones and has lower KL than the logit lens before K."""
    model = constructed_mlm()
    train = masked_streams(model, _ids(60, 0), rate=0.3, mask_id=MASK_ID)
    test = masked_streams(model, _ids(30, 1), rate=0.3, seed=1, mask_id=MASK_ID)
    logit = _table(lens_metrics(model, test, n_boot=50))
    assert np.array_equal(logit["top1_agreement"].to_numpy(), [0.0] * K + [1.0] * (N_LAYERS + 1 - K))
    assert (logit["masked_accuracy"] == 0).all()  # the answer is never a masked token
    assert logit["kl_to_final"].iloc[K:].max() < 1e-3 < logit["kl_to_final"].iloc[:K].min()
    lens, losses = fit_tuned_lens(model, train, epochs=60, lr=0.05, batch_size=64)
    assert losses[-1] < losses[0]
    tuned = _table(lens_metrics(model, test, lens, n_boot=50))
    assert (tuned["top1_agreement"] == 1.0).all()
    assert (tuned["kl_to_final"].iloc[:K] < logit["kl_to_final"].iloc[:K] / 10).all()
    with torch.no_grad():
        top = lens.logits(model, test.hidden[0], 0).argmax(-1)
    assert bool((top == ANSWER).all())


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bert-mlm")
    save_tiny_bert(folder, transformers.BertForMaskedLM, num_hidden_layers=3)
    model = load(folder)
    with torch.no_grad():  # a peaky head (random init's N(0, 0.02) makes every stream's distribution near uniform)
        g = torch.Generator().manual_seed(3)
        model.mlm_head.dense.weight.copy_(torch.randn(model.mlm_head.dense.weight.shape, generator=g))
        model.mlm_head.bias.copy_(torch.randn(model.mlm_head.bias.shape, generator=g))
    texts = corpus_texts(model.tokenizer, 60, 16)
    return model, masked_streams(model, texts[:40]), masked_streams(model, texts[40:], seed=1)


def test_untrained_tuned_lens_is_the_logit_lens(tiny):
    model, _, test = tiny
    logit = lens_metrics(model, test, n_boot=20)
    tuned = lens_metrics(model, test, TunedLens.for_model(model), n_boot=20)
    assert logit.drop(columns="lens").equals(tuned.drop(columns="lens"))
    last = _table(logit).iloc[-1]
    assert last["kl_to_final"] == pytest.approx(0, abs=1e-9) and last["top1_agreement"] == 1.0


def test_training_lowers_held_out_kl_and_round_trips(tiny, tmp_path):
    model, train, test = tiny
    before = model.state_dict()
    lens, _ = fit_tuned_lens(model, train, epochs=30, lr=1e-3)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before) and all(p.requires_grad for p in model.parameters())
    logit, tuned = lens_metrics(model, test, n_boot=200), lens_metrics(model, test, lens, n_boot=200)
    kl_logit, kl_tuned = _table(logit)["kl_to_final"], _table(tuned)["kl_to_final"]
    assert (kl_tuned.iloc[:-1] < kl_logit.iloc[:-1]).all(), (kl_logit, kl_tuned)
    assert ((tuned["low"] <= tuned["value"] + 1e-12) & (tuned["value"] <= tuned["high"] + 1e-12)).all()
    assert set(tuned["n_sentences"]) == {20}
    path = lens.save(tmp_path / "lens.safetensors")
    again = TunedLens.load(path)
    h = test.hidden[1]
    with torch.no_grad():
        assert torch.equal(lens.logits(model, h, 1), again.logits(model, h, 1))
    (tmp_path / "other.safetensors").write_bytes(b"not a lens")
    with pytest.raises(Exception):  # noqa: B017 (safetensors' own error for a file that is not one)
        TunedLens.load(tmp_path / "other.safetensors")
