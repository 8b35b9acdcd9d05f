"""Circuits on a tiny checkpoint of every family: the rebuilt frozen-LN forward reproduces the clean run, and
patching, AtP, AtP*, EAP-IG, edges and the search all run (post-LN families through frozen LayerNorms, pre-LN
ModernBERT through plain EAP)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from bertscope.hooks import circuits
from bertscope.hooks.circuits.tasks import Task, pooled_similarity
from family_fixtures import FAMILIES, save_tiny_family
from fixtures_deberta_modernbert import save_tiny_deberta, save_tiny_modernbert
from helpers import save_tiny_bert

from bertscope import models

MAKERS = {
    "bert": save_tiny_bert,
    **{name: (lambda folder, name=name: save_tiny_family(name, folder)) for name in FAMILIES},
    "deberta": save_tiny_deberta,
    "modernbert": save_tiny_modernbert,
}
TEXTS = ["the cat sat on the mat.", "dogs bark"]


@pytest.fixture(scope="module", params=list(MAKERS))
def family(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    MAKERS[request.param](folder)
    return request.param, models.load(folder).eval()


def _task(model) -> Task:
    """Corrupted = clean with the second token's id changed (equal lengths whatever the tokenizer)."""
    clean = model.tokenize(TEXTS)
    corrupted = {k: v.clone() for k, v in clean.items()}
    ids = corrupted["input_ids"]
    ids[:, 1] = (ids[:, 1] + 7) % model.config.vocab_size
    return Task(clean, corrupted, pooled_similarity(model, ["cat", "dog"]))


@pytest.mark.slow  # ~1-3 s per family on a quiet machine
def test_circuits_run_on_every_family(family):
    name, model = family
    task = _task(model)
    ev = circuits.Evaluator(model, task)
    clean = circuits.metric_values(model, task).mean()
    assert ev.full == pytest.approx(float(clean), abs=2e-5), name  # frozen-LN rebuild = the clean run
    rows = torch.arange(task.n_pairs)
    c = circuits.graph.capture(model, task.batch(rows))
    k = circuits.graph.capture(model, task.batch(rows, "corrupted"), scales=c.scales)
    with torch.no_grad():
        _, tr = circuits.graph.circuit_forward(model, k, c.embed, ev.graph.valid, task.mask, trace=True)
        _, rec = circuits.graph.frozen_forward(model, c.scales, c.embed, task.mask)
    for key, x in rec.items():  # the one-pass frozen forward feeds every receiver what the rebuilt one does
        torch.testing.assert_close(x, tr.inputs[key], atol=2e-5, rtol=1e-4, msg=f"{name} {key}")
    n_heads = model.config.n_layers * model.config.n_heads
    exact = circuits.patch(model, task, "heads", n_boot=50)
    assert len(exact) == n_heads and np.isfinite(exact.effect).all()
    for method in ("atp", "atp*", "eap-ig"):
        est = circuits.attribute(model, task, method, steps=2, n_boot=50)
        assert np.isfinite(est.effect).all(), (name, method)
    star = circuits.attribution.attribute_effects(model, task, "atp-qk", "heads")[0]
    parts = [circuits.attribution.attribute_effects(model, task, "atp-qk", k)[0] for k in ("queries", "keys", "values")]
    np.testing.assert_allclose(star, sum(parts), rtol=1e-6, atol=1e-9, err_msg=name)  # a head = its q + k + v nodes
    for kind in ("keys", "mlps"):  # AtP* (QK fix + GradDrop): one pass per dropped layer, a magnitude
        est = circuits.attribution.attribute_effects(model, task, "atp*", kind)[0]
        assert np.isfinite(est).all() and (est >= 0).all(), (name, kind)
    keys = circuits.patch(model, task, "keys", n_boot=50)
    assert len(keys) == n_heads and np.isfinite(keys.effect).all() and keys.node.iloc[0] == "L0H0.k"
    mlps = circuits.patch(model, task, "mlps", n_boot=50)
    assert len(mlps) == model.config.n_layers
    for method in ("eap", "eap-ig"):
        scores = circuits.edges(model, task, method, steps=2)
        assert torch.isfinite(scores.scores).all() and scores.scores.abs().max() > 0, (name, method)
    circuit = circuits.find_circuit(model, task, scores, method="topn", n_edges=10, evaluator=ev)
    assert np.isfinite(circuit.faithfulness)
