"""Every contribution method on a tiny checkpoint of every family ``models.load`` supports: where a decomposition
claims exactness it rebuilds the hooked output; where a method is undefined (``residual_norm`` on pre-LN
ModernBERT) it fails with an error naming the reason, and the ``mixing`` experiment skips it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from bertscope.hooks import mixing
from family_fixtures import FAMILIES, save_tiny_family
from fixtures_deberta_modernbert import save_tiny_deberta, save_tiny_modernbert
from helpers import save_tiny_bert

from bertscope import contributions, hooks, models

MAKERS = {
    "bert": save_tiny_bert,
    **{name: (lambda folder, name=name: save_tiny_family(name, folder)) for name in FAMILIES},
    "deberta": save_tiny_deberta,
    "modernbert": save_tiny_modernbert,
}
POST_LN = [f for f in MAKERS if f != "modernbert"]
TEXTS = ["the cat sat on the mat.", "dogs bark"]  # different lengths: padding must stay zero


@pytest.fixture(scope="module", params=list(MAKERS))
def family(request, tmp_path_factory) -> tuple[str, models.Encoder]:
    folder = tmp_path_factory.mktemp(request.param)
    MAKERS[request.param](folder)
    return request.param, models.load(folder)


@pytest.mark.slow  # ~2 s per family on a quiet machine, 15-30 s on a busy one
def test_every_method_on_every_family(family) -> None:
    name, model = family
    inputs = model.tokenize(TEXTS)
    real = inputs["attention_mask"].float()
    n_layers, n = model.config.n_layers, inputs["input_ids"].shape[1]
    assert (model.config.norm_placement == "post") == (name in POST_LN)
    for method in mixing.METHODS:
        reason = mixing.undefined_reason(model, method)
        if reason is not None:
            assert name == "modernbert" and "residual_norm" in method  # the one undefined combination
            with pytest.raises(NotImplementedError, match="pre'-LN, with no LayerNorm after the residual sum"):
                contributions(model, inputs, method)
            continue
        # flow is the same graph computation on any family: its last layer only; IG with few steps (cost)
        layers = [n_layers - 1] if method.startswith("flow:") else None
        c = contributions(model, inputs, method, layers=layers, n_steps=4)
        per_sentence = method in mixing.INPUT_ATTRIBUTIONS
        n_out = 1 if layers else n_layers
        assert c.shape == ((2, 1, n) if per_sentence else (2, n_out, n, n)), method
        assert torch.isfinite(c).all(), method
        pad = 1 - real
        assert (c * pad[:, None, :] if per_sentence else c * pad[:, None, None, :]).abs().max() == 0, method
        if not per_sentence and method not in ("attention_norm", "residual_norm"):  # row-stochastic methods
            rows = c.sum(-1)[real.bool()[:, None, :].expand(-1, n_out, -1)]
            assert torch.allclose(rows, torch.ones_like(rows), atol=1e-5), method


def test_decompositions_rebuild_the_hooked_output_on_every_family(family) -> None:
    """residual_norm's parts (post-LN) sum to hook_resid_mid; ALTI's resultant is the same tensor (pre-LN: the
    block's x + attn(x), whose per-key parts still hold: values are a function of the key's own input, under
    DeBERTa's disentangled scores and ModernBERT's rotary positions alike)."""
    name, model = family
    inputs = model.tokenize(TEXTS)
    real = inputs["attention_mask"].bool()
    for layer in range(model.config.n_layers):
        parts, rest, out = hooks.token_decomposition(model, inputs, layer)
        assert (parts.sum(2) + rest - out)[real].abs().max() < 1e-5, (name, layer)
        _, cache = model.run_with_cache(**inputs, names_filter=f"blocks.{layer}.hook_resid_mid")
        assert torch.allclose(out, cache[f"blocks.{layer}.hook_resid_mid"], atol=1e-5), (name, layer)


def test_per_layer_contributions_equal_the_single_method_calls(family) -> None:
    name, model = family
    inputs = model.tokenize(TEXTS)
    methods = [m for m in mixing.PER_LAYER if mixing.undefined_reason(model, m) is None]
    together = mixing.per_layer_contributions(model, inputs, methods)
    for m in methods:
        assert torch.allclose(together[m], contributions(model, inputs, m), atol=1e-6), (name, m)


@pytest.mark.slow
def test_mixing_experiment_skips_residual_norm_on_modernbert(tmp_path: Path, monkeypatch) -> None:
    import json

    import pandas as pd
    from bertscope.experiments import cli
    from bertscope.experiments.mixing import plots

    monkeypatch.setattr(plots, "FORMATS", ("png",))
    save_tiny_modernbert(tmp_path / "m")
    code = cli.main(["run", "mixing", "--model", str(tmp_path / "m"), "--max-sentences", "3", "--out",
                     str(tmp_path / "out"), "--device", "cpu", "--quiet", "--no-report"])  # fmt: skip
    assert code == 0
    results = pd.read_parquet(tmp_path / "out" / "mixing" / "results.parquet")
    assert not results.method.str.contains("residual_norm").any()
    assert {"attention", "alti", "value_zeroing", "rollout:alti"} <= set(results.method)
    notes = json.loads((tmp_path / "out" / "mixing" / "manifest.json").read_text())["notes"]
    assert "pre'-LN" in notes["skipped_methods"]["residual_norm"]
