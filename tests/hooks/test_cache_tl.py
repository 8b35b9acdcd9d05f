"""TransformerLens-style cache access, residual decompositions, per-head results and gradients."""

from __future__ import annotations

import pytest
import torch
from bertscope.hooks import ActivationCache
from bertscope.hooks.cache import act_name
from helpers import assert_close_across_kernels

from bertscope import models

TEXTS = ["The cat sat on the mat while the dog slept.", "Dogs bark."]


@pytest.fixture(scope="module")
def cache(bundled):
    with torch.no_grad():
        return bundled.run_with_cache(TEXTS)[1]


@pytest.fixture(scope="module")
def pre_ln():
    """A random pre-LN model with non-trivial LayerNorm weights and biases."""
    cfg = models.EncoderConfig(vocab_size=50, d_model=16, n_layers=3, n_heads=4, d_mlp=32, max_positions=16,
                               norm_placement="pre")
    model = models.random_encoder(cfg, seed=1)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for mod in model.modules():
            if type(mod).__name__ == "LayerNorm":
                mod.weight.copy_(1 + 0.3 * torch.randn(mod.weight.shape, generator=g))
                mod.bias.copy_(0.3 * torch.randn(mod.bias.shape, generator=g))
    return model


@pytest.mark.parametrize(
    ("key", "full"),
    [
        (("pattern", 0), "blocks.0.attn.hook_pattern"),
        (("attn", 1), "blocks.1.attn.hook_pattern"),
        (("attn_scores", 2), "blocks.2.attn.hook_scores"),
        (("scores", 2), "blocks.2.attn.hook_scores"),
        (("z", 3), "blocks.3.attn.hook_z"),
        (("q", 0), "blocks.0.attn.hook_q"),
        (("key", 0), "blocks.0.attn.hook_k"),
        (("v", 5), "blocks.5.attn.hook_v"),
        (("result", 1), "blocks.1.attn.hook_result"),
        (("attn_out", 4), "blocks.4.hook_attn_out"),
        (("mlp_out", 4), "blocks.4.hook_mlp_out"),
        (("pre", 2), "blocks.2.mlp.hook_pre"),
        (("mlp_post", 2), "blocks.2.mlp.hook_post"),
        (("resid_pre", 0), "blocks.0.hook_resid_pre"),
        (("resid_mid", 3), "blocks.3.hook_resid_mid"),
        (("resid_post", 5), "blocks.5.hook_resid_post"),
        (("scale", 2, "ln1"), "blocks.2.ln1.hook_scale"),
        (("normalized", 2, "ln2"), "blocks.2.ln2.hook_normalized"),
        (("resid_mid_grad", 1), "blocks.1.hook_resid_mid_grad"),
        (("embed",), "embed.hook_word"),
        (("pos_embed",), "embed.hook_pos"),
        (("token_type_embed",), "embed.hook_type"),
        (("scale",), "ln_final.hook_scale"),
    ],
)
def test_act_name_follows_transformerlens(key, full, bundled):
    assert act_name(*key) == full
    if not full.endswith("_grad") and not full.startswith("ln_final"):
        assert full in bundled.hook_names()


def test_short_names_index_the_cache(cache, bundled):
    n = bundled.config.n_layers
    assert cache["pattern", 0] is cache["blocks.0.attn.hook_pattern"]
    assert cache["resid_post", n - 1] is cache["resid_post", -1]
    assert cache["embed"] is cache["embed.hook_word"]
    assert cache["scale", 1, "ln2"] is cache["blocks.1.ln2.hook_scale"]
    assert ("pattern", 0) in cache and ("pattern", n) not in cache
    with pytest.raises(KeyError, match="blocks.9.attn.hook_pattern"):
        cache["pattern", 9]
    with pytest.raises(KeyError, match="per-layer name"):
        cache["pattern"]
    with pytest.raises(KeyError, match="layer_type"):
        cache["scale", 1]
    bare = ActivationCache({"blocks.0.hook_resid_post": torch.zeros(1)})
    with pytest.raises(ValueError, match="negative layer index"):
        bare["resid_post", -1]


def test_stack_takes_suffix_glob_or_short_name(cache, bundled):
    by_suffix = cache.stack("hook_resid_post")
    for pattern in ("blocks.*.hook_resid_post", "resid_post"):
        torch.testing.assert_close(cache.stack(pattern), by_suffix, rtol=0, atol=0)
    assert by_suffix.shape[0] == bundled.config.n_layers
    torch.testing.assert_close(by_suffix[3], cache["resid_post", 3], rtol=0, atol=0)
    assert cache.stack("attn.hook_pattern").shape[:2] == (bundled.config.n_layers, len(TEXTS))
    assert cache.stack("ln1.hook_scale").shape[0] == bundled.config.n_layers
    with pytest.raises(KeyError):
        cache.stack("hook_scale")  # a suffix is exact: not ln1's and ln2's mixed
    with pytest.raises(KeyError) as err:
        cache.stack("blocks.*.hook_resid_nope")
    assert "blocks.*.blocks" not in str(err.value) and "'blocks.*.hook_resid_nope'" in str(err.value)


def test_accumulated_resid(cache, bundled):
    n = bundled.config.n_layers
    resid, labels = cache.accumulated_resid(return_labels=True)
    assert labels == [f"{i}_pre" for i in range(n)] + ["final_post"]
    torch.testing.assert_close(resid[2], cache["resid_pre", 2], rtol=0, atol=0)
    torch.testing.assert_close(resid[-1], cache["resid_post", n - 1], rtol=0, atol=0)
    up_to, labels = cache.accumulated_resid(layer=2, incl_mid=True, return_labels=True)
    assert labels == ["0_pre", "0_mid", "1_pre", "1_mid", "2_pre"]
    torch.testing.assert_close(up_to[1], cache["resid_mid", 0], rtol=0, atol=0)


def test_decompose_resid_sums_exactly_in_post_ln(cache, bundled):
    n = bundled.config.n_layers
    for layer in range(n):
        parts, labels = cache.decompose_resid(layer, return_labels=True)
        assert labels[:3] == ["embed", "pos_embed", "token_type_embed"] and labels[-1] == "ln_bias"
        assert len(labels) == 3 + 2 * layer + 1 == parts.shape[0]
        torch.testing.assert_close(parts.sum(0), cache["resid_pre", layer], atol=2e-5, rtol=0)
        mid = cache.decompose_resid(layer, mlp_input=True)
        torch.testing.assert_close(mid.sum(0), cache["resid_mid", layer], atol=2e-5, rtol=0)
    final = cache.decompose_resid()
    torch.testing.assert_close(final.sum(0), cache["resid_post", n - 1], atol=2e-5, rtol=0)


def test_decompose_resid_pre_ln_keeps_block_writes(pre_ln):
    ids = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        _, cache = pre_ln.run_with_cache(ids)
    parts, labels = cache.decompose_resid(2, return_labels=True)
    torch.testing.assert_close(parts.sum(0), cache["resid_pre", 2], atol=1e-5, rtol=0)
    # pre-LN: a block's write enters the stream unchanged (no LayerNorm on the stream)
    torch.testing.assert_close(parts[labels.index("1_mlp_out")], cache["mlp_out", 1], rtol=0, atol=0)
    torch.testing.assert_close(parts[labels.index("0_attn_out")], cache["attn_out", 0], rtol=0, atol=0)
    # the embedding pieces and the bias sum to the embedding output
    embed_part = parts[[labels.index(x) for x in ("embed", "pos_embed", "token_type_embed", "ln_bias")]].sum(0)
    torch.testing.assert_close(embed_part, cache["embed.hook_out"], atol=1e-5, rtol=0)


def test_stack_head_results_sum_to_attn_out(bundled):
    with torch.no_grad():
        _, cache = bundled.run_with_cache(TEXTS, names_filter=["blocks.2.attn.hook_z", "blocks.2.hook_attn_out",
                                                               "blocks.3.attn.hook_result", "blocks.3.hook_attn_out"])
    heads, labels = cache.stack_head_results(2, return_labels=True)
    assert heads.shape == (bundled.config.n_heads, *cache["attn_out", 2].shape)
    assert labels[:2] == ["L2H0", "L2H1"]
    b_O = bundled.blocks[2].attn.b_O.detach()
    torch.testing.assert_close(heads.sum(0) + b_O, cache["attn_out", 2], atol=1e-5, rtol=1e-5)
    with_bias = cache.stack_head_results(3, incl_bias=True)  # from the cached hook_result
    torch.testing.assert_close(with_bias.sum(0), cache["attn_out", 3], atol=1e-5, rtol=1e-5)
    # one head's write is z_h @ W_O[h]
    z = cache["z", 2][:, :, 5]
    torch.testing.assert_close(heads[5], z @ bundled.blocks[2].attn.W_O[5].detach(), atol=1e-6, rtol=1e-5)
    with pytest.raises(KeyError, match="hook_z"):
        cache.stack_head_results(0)
    plain = ActivationCache({"blocks.3.attn.hook_result": cache["result", 3]})
    assert plain.stack_head_results(3).shape[0] == bundled.config.n_heads
    with pytest.raises(ValueError, match="needs the model"):
        plain.stack_head_results(3, incl_bias=True)


def _autograd_reference(model, texts, names, loss_fn):
    """Gradients by hand: retain_grad on each hooked activation, then backward."""
    kept = {}

    def keep(t, hook):
        t.retain_grad()
        kept[hook.name] = t

    out = model.run_with_hooks(texts, fwd_hooks=[(names, keep)])
    loss_fn(out).backward()
    return {k: v.grad for k, v in kept.items()}


def test_incl_bwd_matches_autograd(bundled):
    names = ["embed.hook_word", "blocks.1.hook_resid_mid", "blocks.2.attn.hook_z", "blocks.4.hook_mlp_out",
             "blocks.5.hook_resid_pre"]

    def loss_fn(out):
        return out[:, 0].pow(2).sum() + out[1, 2].sum()

    _, cache = bundled.run_with_cache(TEXTS, names_filter=names, incl_bwd=True, loss_fn=loss_fn)
    bundled.zero_grad(set_to_none=True)
    ref = _autograd_reference(bundled, TEXTS, names, loss_fn)
    bundled.zero_grad(set_to_none=True)
    for name in names:
        assert cache[f"{name}_grad"].shape == cache[name].shape
        assert float(cache[f"{name}_grad"].abs().max()) > 0
        torch.testing.assert_close(cache[f"{name}_grad"], ref[name], atol=1e-6, rtol=1e-4)
    assert cache["resid_mid_grad", 1] is cache["blocks.1.hook_resid_mid_grad"]
    assert all(p.grad is None for p in bundled.parameters())  # incl_bwd leaves parameters alone


def test_incl_bwd_result_pattern_and_ln_scale(bundled):
    """Sites that the fused path leaves out of the graph still get their gradient."""
    names = ["blocks.2.attn.hook_result", "blocks.2.hook_attn_out", "blocks.2.attn.hook_pattern",
             "blocks.3.ln1.hook_scale"]

    def loss_fn(out):
        return out[:, 1:3].sum()

    _, cache = bundled.run_with_cache(TEXTS, names_filter=names, incl_bwd=True, loss_fn=loss_fn)
    # attn_out = sum_h result_h + b_O, so every head's result gets the attn_out gradient
    result_grad, attn_grad = cache["result_grad", 2], cache["attn_out_grad", 2]
    for h in range(bundled.config.n_heads):
        torch.testing.assert_close(result_grad[:, :, h], attn_grad, rtol=0, atol=0)
    # pattern gradient against a hand-made retain_grad run
    ref = _autograd_reference(bundled, TEXTS, ["blocks.2.attn.hook_pattern"], loss_fn)
    bundled.zero_grad(set_to_none=True)
    # caching hook_result computes attn_out head by head (another summation order than the reference run's), so
    # the two gradients agree to float32 summation order relative to their scale (measured 1.3-1.9e-6 of it)
    assert_close_across_kernels(cache["pattern_grad", 2], ref["blocks.2.attn.hook_pattern"])
    assert float(cache["scale_grad", 3, "ln1"].abs().max()) > 0


def test_incl_bwd_errors(bundled):
    with pytest.raises(ValueError, match="loss_fn"):
        bundled.run_with_cache(TEXTS, names_filter="blocks.0.hook_resid_post", incl_bwd=True)
    with torch.no_grad(), pytest.raises(RuntimeError, match="no_grad"):
        bundled.run_with_cache(TEXTS, names_filter="blocks.0.hook_resid_post", incl_bwd=True, loss_fn=torch.sum)


def test_incl_bwd_unused_activation_gets_zero(bundled):
    # with stop_at_layer=1 nothing after block 1 runs; the output does not depend on later inputs of
    # the batch's second text, so its gradient there is exactly zero
    _, cache = bundled.run_with_cache(TEXTS, names_filter="blocks.0.hook_resid_post", incl_bwd=True,
                                      loss_fn=lambda out: out[0].sum(), stop_at_layer=1)
    grad = cache["resid_post_grad", 0]
    assert float(grad[1].abs().max()) == 0.0 and float(grad[0].abs().max()) > 0
