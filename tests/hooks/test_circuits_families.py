"""Circuits on a tiny checkpoint of every family: the rebuilt frozen-LN forward reproduces the clean run, and
patching, AtP, AtP*, EAP-IG, edges and the search all run (post-LN families through frozen LayerNorms, pre-LN
ModernBERT through plain EAP); on DeBERTa and ModernBERT a planted head's known answers (ranked first, AtP exact
where the model is linear in it)."""

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


def _planted_linear(model, scale_head: tuple[int, float] | None = None):
    """Issue 40.13: the DeBERTa / ModernBERT circuit known answer. In double precision, every head outside the last
    layer writes nothing (its output-projection columns zeroed), the last layer's MLP writes nothing, and every
    LayerNorm after the last layer's attention is made affine (eps = 1e12 with its weight scaled by 1e6, so
    ``(y - mean) w sqrt(eps / (var + eps)) + b`` differs from affine by var / 2e12): the metric, a dot product of the
    mean-pooled final hidden state, is then linear in each last-layer head's output. ``scale_head = (h, s)``
    multiplies head h's output-projection columns by s."""
    from bertscope.models.encoder import LayerNorm

    model = model.double()
    n, last, dh = model.config.n_layers, model.config.n_layers - 1, model.config.d_model // model.config.n_heads
    with torch.no_grad():
        for L in range(n - 1):
            model.blocks[L].attn.out.weight.zero_()
        model.blocks[last].mlp.fc_out.weight.zero_()
        if model.blocks[last].mlp.fc_out.bias is not None:
            model.blocks[last].mlp.fc_out.bias.zero_()
        downstream = [model.blocks[last].ln2, getattr(model, "ln_final", None)]
        if model.blocks[last].post_ln:
            downstream.append(model.blocks[last].ln1)
        for ln in downstream:
            if isinstance(ln, LayerNorm):
                ln.eps = 1e12
                ln.weight.mul_(1e6)
        if scale_head is not None:
            h, s = scale_head
            model.blocks[last].attn.out.weight[:, h * dh:(h + 1) * dh] *= s
    return model


@pytest.mark.parametrize("name", ["deberta", "modernbert"])
def test_planted_head_is_ranked_first_and_atp_is_exact_where_the_model_is_linear(name, tmp_path):
    """Known answers on the tiny DeBERTa and ModernBERT checkpoints (issue 40.13): heads that write nothing have
    zero effect by exact patching (up to float rounding) and by AtP; the last layer's heads, in which the model is
    linear here, have AtP equal to exact patching (with the LayerNorms left as they are AtP is off by about 2e-3 of
    the largest effect); scaling head P's output projection by s multiplies its exact effect by s; with s set so
    that P's effect is 10 times the largest other head's, exact patching, AtP and AtP* rank P first."""
    (save_tiny_deberta if name == "deberta" else save_tiny_modernbert)(tmp_path)
    base = _planted_linear(models.load(tmp_path).eval())
    clean = base.tokenize(["the cat sat on the mat.", "dogs bark at the moon", "a tree"])
    corrupted = {k: v.clone() for k, v in clean.items()}
    corrupted["input_ids"][:, 1] = (corrupted["input_ids"][:, 1] + 7) % base.config.vocab_size
    u = torch.randn(base.config.d_model, generator=torch.Generator().manual_seed(0), dtype=torch.float64)

    def dot(hidden, mask, rows):
        pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
        return pooled @ u

    task = Task(clean, corrupted, circuits.Metric(dot, "dot-u"))
    last = slice((base.config.n_layers - 1) * base.config.n_heads, None)
    exact, _ = circuits.patching.patch_effects(base, task, "heads")
    atp, _ = circuits.attribution.attribute_effects(base, task, "atp", "heads")
    scale = np.abs(exact[:, last]).max()
    assert scale > 1e-4
    assert np.abs(exact[:, :last.start]).max() < 1e-9 * scale  # float rounding of the batched patching only
    assert np.abs(atp[:, :last.start]).max() == 0.0
    np.testing.assert_allclose(atp[:, last], exact[:, last], rtol=1e-6, atol=1e-9 * np.abs(exact).max())
    planted = 1
    others = np.abs(np.delete(exact[:, last].mean(0), planted)).max()
    s = 10 * others / abs(exact[:, last][:, planted].mean())
    model = _planted_linear(models.load(tmp_path).eval(), (planted, s))
    exact_s, _ = circuits.patching.patch_effects(model, task, "heads")
    np.testing.assert_allclose(exact_s[:, last.start + planted], s * exact[:, last.start + planted], rtol=1e-6)
    for method in ("exact", "atp", "atp*"):
        est = exact_s if method == "exact" else circuits.attribution.attribute_effects(model, task, method, "heads")[0]
        assert int(np.argmax(np.abs(est.mean(0)))) == last.start + planted, (name, method)
