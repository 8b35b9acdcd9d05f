"""Issue 26.5: context mixing is a subpackage of hooks/ with one method table; a method registered in the table
(one entry, one function) is available everywhere: contributions, its rollout/flow, the method lists, the mixing
experiment's defaults, the explorer's menu; the old public names and module paths keep working."""

from __future__ import annotations

import importlib

import pytest
import torch
from bertscope.hooks import mixing
from bertscope.hooks.mixing import table
from bertscope.hooks.mixing.kernels import Chunk

import bertscope
from bertscope import models


def _uniform(c: Chunk) -> torch.Tensor:
    """The toy method: every key contributes 1 to every query (padding is zeroed by the framework)."""
    return torch.ones_like(c.pattern[:, 0])


@pytest.fixture
def toy():
    spec = table.register(table.Method("uniform_toy", "layer", _uniform, "every key the same",
                                       sites=("attn.hook_pattern",)))  # fmt: skip
    try:
        yield spec
    finally:
        table.TABLE.pop(spec.name)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from helpers import save_tiny_bert

    folder = tmp_path_factory.mktemp("tiny")
    save_tiny_bert(folder)
    return models.load(folder).eval()


def test_a_registered_method_is_available_everywhere(toy, model):
    from bertscope.experiments.explorer import mixing_methods
    from bertscope.experiments.mixing import Settings

    assert {"uniform_toy", "rollout:uniform_toy", "flow:uniform_toy"} <= set(mixing.METHODS)
    assert "uniform_toy" in mixing.PER_LAYER and "uniform_toy" not in mixing.INPUT_ATTRIBUTIONS
    assert "uniform_toy" in Settings().methods  # the experiment's default methods come from the table
    assert mixing_methods("uniform_toy,rollout:uniform_toy") == ["uniform_toy", "rollout:uniform_toy"]

    inputs = model.tokenize(["the cat sat on the mat.", "dogs bark"])
    mask = inputs["attention_mask"].float()
    c = bertscope.contributions(model, inputs, "uniform_toy")
    assert c.shape[:2] == (2, model.config.n_layers)
    assert torch.equal(c, (mask[:, None, :, None] * mask[:, None, None, :]).expand_as(c))
    rolled = mixing.contributions(model, inputs, "rollout:uniform_toy", layers=[-1])
    # uniform rows with the identity mixed in (no residual declared): rollout stays row-stochastic over real keys
    assert torch.allclose(rolled.sum(-1), mask[:, None, :], atol=1e-6)
    together = mixing.per_layer_contributions(model, inputs, ["uniform_toy", "alti"])
    assert torch.equal(together["uniform_toy"], c)
    assert torch.allclose(together["alti"], mixing.contributions(model, inputs, "alti"), atol=1e-6)


def test_the_lists_have_one_source():
    """The name lists are the table's, read when asked for: nothing else holds a copy."""
    assert mixing.PER_LAYER == tuple(m.name for m in table.TABLE.values() if m.kind != "input")
    assert mixing.INPUT_ATTRIBUTIONS == ("grad_x_input", "integrated_gradients", "loo")
    assert mixing.PER_LAYER == ("attention", "attention_norm", "residual_norm", "alti", "value_zeroing")
    from bertscope.experiments.mixing import Settings

    s = Settings()
    assert s.methods == ("attention", "attention_norm", "residual_norm", "alti")  # the table's cheap ones
    assert s.costly_methods == ("value_zeroing",)
    with pytest.raises(ValueError, match="unknown contribution method 'nope'; choose one of attention,"):
        table.parse("nope")
    with pytest.raises(ValueError, match="registered already"):
        table.register(table.TABLE["alti"])


def test_old_names_and_paths_still_import():
    assert bertscope.contributions is mixing.contributions is bertscope.hooks.contributions
    for old, new in [("mixing_graph", "graph"), ("mixing_inputs", "inputs"), ("mixing_kernels", "kernels")]:
        assert importlib.import_module(f"bertscope.hooks.{old}") is importlib.import_module(
            f"bertscope.hooks.mixing.{new}")
    from bertscope.hooks.mixing import LayerParts, per_layer_contributions, token_decomposition, undefined_reason
    from bertscope.hooks.mixing_graph import flow_matrix, rollout  # noqa: F401

    assert callable(per_layer_contributions) and callable(token_decomposition) and callable(undefined_reason)
    assert LayerParts.__module__ == "bertscope.hooks.mixing.kernels"


def test_a_cache_must_hold_the_sites_the_methods_read(model):
    inputs = model.tokenize(["the cat sat."])
    names = mixing.needed_sites(["alti"], range(model.config.n_layers))
    _, cache = model.run_with_cache(inputs["input_ids"], inputs["attention_mask"], names_filter=names)
    from_cache = mixing.per_layer_contributions(model, inputs, ["alti"], cache=cache)["alti"]
    assert torch.equal(from_cache, mixing.contributions(model, inputs, "alti"))
    with pytest.raises(ValueError, match="cache lacks .*hook_pattern"):
        mixing.per_layer_contributions(model, inputs, ["attention"], cache={})
