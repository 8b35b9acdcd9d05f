"""Context mixing (hooks/mixing*.py): conventions pinned to the papers' code, exactness, known answers."""

from __future__ import annotations

import copy

import networkx as nx
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from bertscope.hooks import mixing
from bertscope.hooks.mixing import LayerParts
from bertscope.hooks.mixing import graph as mixing_graph

from bertscope import contributions, hooks, models

SENTENCES = ["The cat sat on the mat.", "Dogs bark at night, don't they?"]


def tiny(norm_placement: str = "post", seed: int = 0) -> models.Encoder:
    """A tiny random encoder whose LayerNorm gains/biases and all biases are non-trivial (so they matter)."""
    cfg = models.EncoderConfig(vocab_size=50, d_model=16, n_layers=3, n_heads=4, d_mlp=32, max_positions=16,
                               norm_placement=norm_placement)
    model = models.random_encoder(cfg, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "ln" in name:
                p.add_(0.3 * torch.randn(p.shape, generator=g))
            elif p.dim() == 2:
                p.mul_(10)  # std 0.2: attention far from uniform
    return model


def tiny_inputs(batch: int = 2, n: int = 7, pad_last: int = 2) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(5, 50, (batch, n), generator=g)
    mask = torch.ones_like(ids)
    if pad_last:
        mask[-1, -pad_last:] = 0
        ids[-1, -pad_last:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def force_pattern(perm: list[int]):
    """A hook making every head of every layer attend from query i to key perm[i] only."""

    def fn(pattern: torch.Tensor, hook) -> torch.Tensor:
        out = torch.zeros_like(pattern)
        out[..., torch.arange(len(perm)), torch.tensor(perm)] = 1.0
        return out

    return [("blocks.*.attn.hook_pattern", fn)]


@pytest.fixture(scope="module")
def sentences(bundled):
    return bundled.tokenize(SENTENCES)


# ====================================================================== exactness
@pytest.mark.parametrize("placement", ["post", "pre"])
def test_decomposition_rebuilds_the_hooked_output(placement):
    model, inp = tiny(placement), tiny_inputs()
    real = inp["attention_mask"].bool()
    for layer in range(model.config.n_layers):
        parts, rest, out = hooks.token_decomposition(model, inp, layer)
        _, cache = model.run_with_cache(**inp, names_filter=f"blocks.{layer}.hook_resid_mid")
        hooked = cache[f"blocks.{layer}.hook_resid_mid"]  # a separate run (fused attention kernel)
        assert (parts.sum(2) + rest - hooked)[real].abs().max() < 1e-5
        assert (parts.sum(2) + rest - out)[real].abs().max() < 1e-5


def test_exact_on_the_bundled_model_and_the_torch_std_difference(bundled, sentences):
    real = sentences["attention_mask"].bool()
    double = copy.deepcopy(bundled).double()  # float64: the decomposition itself, free of float32 rounding
    for layer in range(bundled.config.n_layers):
        parts, rest, out = hooks.token_decomposition(bundled, sentences, layer)
        assert (parts.sum(2) + rest - out)[real].abs().max() < 2e-5  # float32 rounding of outputs up to ~28
        parts, rest, out = hooks.token_decomposition(double, sentences, layer)
        exact_err = (parts.sum(2) + rest - out)[real].abs().max()
        assert exact_err < 1e-10  # true LayerNorm: population variance, with eps
        if layer not in (0, 5):
            continue
        ref_parts, ref_rest, _ = hooks.token_decomposition(double, sentences, layer, layer_norm="reference")
        unbiased, ub_rest, _ = hooks.token_decomposition(double, sentences, layer, layer_norm="unbiased")
        # eps (1e-12) is tiny next to the variance but measurable in float64; Bessel's correction rescales by
        # sqrt((d-1)/d), which breaks the reconstruction by far more than float32 rounding.
        ref_err = (ref_parts.sum(2) + ref_rest - out)[real].abs().max()
        assert exact_err < ref_err < 1e-8
        assert (unbiased.sum(2) + ub_rest - out)[real].abs().max() > 1e-3


def test_alti_resultant_is_the_layer_output(bundled, sentences):
    """ALTI's y_i (sum of T_i(x_j) plus bias terms) is the attention block's output LN1(x + attn(x))."""
    for layer in (0, 5):
        (p,) = mixing._collect(bundled, (sentences["input_ids"], sentences["attention_mask"], None), [layer], "exact")
        y = torch.einsum("bhqk,bkhm->bqm", p.pattern, p.head_vectors("u")) / p.s + p.r / p.s + p.rest
        assert (y - ((p.attn_sum + p.r) / p.s + p.rest)).abs().max() < 1e-5  # the shortcut through hook_attn_out
        real = sentences["attention_mask"].bool()
        assert (y - p.output)[real].abs().max() < 1e-5


# ====================================================================== conventions, per method
def test_attention_is_the_head_mean_of_the_pattern(sentences, bundled):
    c = contributions(bundled, sentences, "attention")
    _, cache = bundled.run_with_cache(**sentences, names_filter="blocks.*.attn.hook_pattern")
    mask = sentences["attention_mask"].float()
    expected = cache.stack("attn.hook_pattern").mean(2).transpose(0, 1) * mask[:, None, :, None]
    assert torch.allclose(c, expected, atol=1e-7)


def test_attention_norm_is_the_norm_of_the_head_sum(sentences, bundled):
    """Kobayashi et al. 2020's summed_weighted_norm: ||sum_h alpha_h (x W_V + b_V) W_O^h||, b_O excluded."""
    c = contributions(bundled, sentences, "attention_norm", layers=[0, 3])
    names = ["blocks.*.attn.hook_pattern", "blocks.*.hook_resid_pre"]
    _, cache = bundled.run_with_cache(**sentences, names_filter=names)
    mask = sentences["attention_mask"].float()
    for slot, layer in enumerate([0, 3]):
        attn = bundled.blocks[layer].attn
        x = cache[f"blocks.{layer}.hook_resid_pre"]
        value = torch.einsum("bpm,hmd->bhpd", x, attn.W_V) + attn.b_V[None, :, None]  # from the weights, not hook_v
        transformed = torch.einsum("bhpd,hdm->bhpm", value, attn.W_O)
        weighted = torch.einsum("bhqk,bhkm->bhqkm", cache[f"blocks.{layer}.attn.hook_pattern"], transformed)
        expected = weighted.sum(1).norm(dim=-1) * mask[:, :, None] * mask[:, None, :]
        assert torch.allclose(c[:, slot], expected, atol=1e-5, rtol=1e-4)
        per_head_sum = weighted.norm(dim=-1).sum(1) * mask[:, :, None] * mask[:, None, :]
        assert not torch.allclose(c[:, slot], per_head_sum, atol=1e-3)  # not the sum of per-head norms


def test_planted_pattern_attention_norm_and_residual_norm():
    """Every head attends from i to perm[i]: norms are those of single, hand-computed vectors."""
    model, perm = tiny(), [1, 2, 0, 4, 3, 5]
    inp = {"input_ids": torch.tensor([[7, 8, 9, 10, 11, 12]])}
    with model.hooks(force_pattern(perm)):
        att = contributions(model, inp, "attention")
        norm = contributions(model, inp, "attention_norm")
        res = contributions(model, inp, "residual_norm")
        ratio = hooks.mixing_ratio(model, inp, "residual_norm")
        _, cache = model.run_with_cache(**inp, names_filter="blocks.*.hook_resid_pre")
    onehot = torch.zeros(6, 6)
    onehot[torch.arange(6), torch.tensor(perm)] = 1
    assert torch.equal(att[0, 0], onehot)
    for layer in range(3):
        block = model.blocks[layer]
        x = cache[f"blocks.{layer}.hook_resid_pre"][0]
        f = block.attn.out(block.attn.qkv(x)[:, 2 * 16:]) - block.attn.out.bias  # (x W_V + b_V) W_O, all heads
        assert torch.allclose(norm[0, layer], onehot * f.norm(dim=-1)[None, :], atol=1e-5)
        pre = x + f[perm] + block.attn.out.bias  # what LN1 sees
        s = (pre.var(-1, unbiased=False, keepdim=True) + block.ln1.eps).sqrt()
        gamma = block.ln1.weight
        other = (f[perm] - f[perm].mean(-1, keepdim=True)) * gamma / s  # T_i(x_perm(i))
        own = (x - x.mean(-1, keepdim=True)) * gamma / s  # T_i(x_i): the residual
        expected = torch.diag(own.norm(dim=-1))
        expected[torch.arange(6), torch.tensor(perm)] += other.norm(dim=-1) * (torch.tensor(perm) != torch.arange(6))
        fixed = 5  # perm[5] == 5: attention and residual are one vector
        expected[fixed, fixed] = (own[fixed] + other[fixed]).norm()
        assert torch.allclose(res[0, layer], expected, atol=1e-5)
        mixed = other.norm(dim=-1) / (other.norm(dim=-1) + own.norm(dim=-1))
        mixed[fixed] = 0.0
        assert torch.allclose(ratio[0, layer], mixed, atol=1e-5)


def test_alti_hand_computed_case():
    """Manhattan distance to the resultant, ||y||_1 minus it, clipped at 0, rows normalised (mt-upc's min_sum)."""
    pattern = torch.tensor([[[[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.0, 0.5, 0.5]]]])  # [b=1, h=1, q, k]
    u = torch.tensor([[[[1.0, 0.0], [0.0, 2.0], [-4.0, 0.0]]]])  # [b, h, k, m=2]
    zeros = torch.zeros(1, 3, 2)
    parts = LayerParts(pattern, u, u, zeros, torch.ones(1, 3, 1), zeros, zeros)
    c = mixing._alti(parts, chunk_tokens=2)[0]
    # row 0: T = (1,0),(0,0),(0,0); y = (1,0): d = 0,1,1 -> ||y||-d = 1,0,0
    # row 1: T = (.5,0),(0,1),(0,0); y = (.5,1), ||y|| = 1.5: d = 1, .5, 1.5 -> .5, 1, 0 -> 1/3, 2/3, 0
    # row 2: T = (0,0),(0,1),(-2,0); y = (-2,1), ||y|| = 3: d = 3, 2, 1 -> 0, 1, 2 -> 0, 1/3, 2/3
    expected = torch.tensor([[1.0, 0, 0], [1 / 3, 2 / 3, 0], [0, 1 / 3, 2 / 3]])
    assert torch.allclose(c, expected, atol=1e-6)
    # the clip: a vector pointing away from the resultant gets 0, not a negative share
    u2 = torch.tensor([[[[1.0, 0.0], [-3.0, 0.0], [0.0, 0.0]]]])
    pattern2 = torch.tensor([[[[0.5, 0.5, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]]])
    c2 = mixing._alti(LayerParts(pattern2, u2, u2, zeros, torch.ones(1, 3, 1), zeros, zeros), 64)[0]
    # row 0: T = (.5,0),(-1.5,0); y = (-1,0), ||y|| = 1: d = 1.5, .5 -> -.5 -> 0, .5 -> 0, 1
    assert torch.allclose(c2[0], torch.tensor([0.0, 1.0, 0.0]))


def test_alti_matches_the_reference_recipe_on_the_bundled_model(sentences, bundled):
    """Same numbers as mt-upc's get_contributions + normalize_contributions('min_sum'), built from the vectors."""
    c = contributions(bundled, sentences, "alti", layers=[2], chunk_tokens=100)
    parts, rest, out = hooks.token_decomposition(bundled, sentences, 2)
    y = parts.sum(2) + rest
    importance = -F.pairwise_distance(parts, y[:, :, None].expand_as(parts), p=1, eps=0)
    expected = (importance + y.abs().sum(-1)[..., None]).clip(min=0)
    mask = sentences["attention_mask"].float()
    expected = expected * mask[:, :, None] * mask[:, None, :]
    expected = expected / expected.sum(-1, keepdim=True).clamp_min(1e-30)
    assert torch.allclose(c[:, 0], expected, atol=1e-5)
    assert torch.allclose(c.sum(-1)[mask.bool()[:, None].expand(-1, 1, -1)], torch.tensor(1.0), atol=1e-5)


def test_value_zeroing_against_one_rerun_per_token():
    model, inp = tiny(), tiny_inputs()
    c = contributions(model, inp, "value_zeroing", chunk_tokens=20)  # several chunks
    ids, mask = inp["input_ids"], inp["attention_mask"]
    _, cache = model.run_with_cache(**inp, names_filter=["blocks.1.hook_resid_pre", "blocks.1.hook_resid_post"])
    x, y = cache["blocks.1.hook_resid_pre"], cache["blocks.1.hook_resid_post"]
    for b in range(2):
        n = int(mask[b].sum())
        rows = torch.zeros(n, n)
        for j in range(n):
            def zero(v, hook, j=j):
                v = v.clone()
                v[:, j] = 0
                return v

            with model.hooks([("blocks.1.attn.hook_v", zero)]):
                new = model.forward_from(1, x[b : b + 1, :n], stop_at_layer=1)
            rows[:, j] = 1 - F.cosine_similarity(new[0], y[b, :n], dim=-1)
        expected = rows / rows.sum(-1, keepdim=True)
        assert torch.allclose(c[b, 1, :n, :n], expected, atol=1e-5)
        assert c[b, 1, n:].abs().sum() == 0 and c[b, 1, :, n:].abs().sum() == 0
    assert ids.shape == mask.shape


def test_value_zeroing_planted_pattern_is_one_hot():
    """When every head reads only perm[i], zeroing any other value leaves token i untouched."""
    model, perm = tiny(), [3, 0, 1, 2, 4]
    with model.hooks(force_pattern(perm)):
        c = contributions(model, {"input_ids": torch.tensor([[5, 6, 7, 8, 9]])}, "value_zeroing")
    onehot = torch.zeros(5, 5)
    onehot[torch.arange(5), torch.tensor(perm)] = 1
    assert torch.allclose(c[0], onehot.expand(3, 5, 5), atol=1e-5)


# ====================================================================== rollout and flow
def test_rollout_is_the_hand_multiplied_product(sentences, bundled):
    att = contributions(bundled, sentences, "attention")
    roll = contributions(bundled, sentences, "rollout:attention")
    b, n = 1, int(sentences["attention_mask"][1].sum())
    a = [0.5 * att[b, L, :n, :n] + 0.5 * torch.eye(n) for L in range(6)]
    expected = a[5] @ a[4] @ a[3] @ a[2] @ a[1] @ a[0]
    assert torch.allclose(roll[b, 5, :n, :n], expected, atol=1e-6)
    alti = contributions(bundled, sentences, "alti", layers=[0, 1, 2])
    roll_alti = contributions(bundled, sentences, "rollout:alti", layers=[2])
    assert torch.allclose(roll_alti[:, 0], alti[:, 2] @ alti[:, 1] @ alti[:, 0], atol=1e-6)  # no identity added


def test_flow_matches_networkx_max_flow():
    rng = np.random.default_rng(0)
    caps = rng.random((3, 4, 4))
    caps /= caps.sum(-1, keepdims=True)
    ours = mixing_graph.flow_matrix(caps)
    graph = nx.DiGraph()
    n = 4
    for L in range(3):
        for i in range(n):
            for j in range(n):
                graph.add_edge((L + 1, i), (L, j), capacity=caps[L, i, j])
    expected = np.array([[nx.maximum_flow_value(graph, (3, i), (0, j)) for j in range(n)] for i in range(n)])
    expected /= expected.sum(-1, keepdims=True)
    assert np.allclose(ours, expected, atol=1e-5)


def test_flow_through_the_api_on_a_tiny_model():
    model, inp = tiny(), tiny_inputs(n=5, pad_last=1)
    flow = contributions(model, inp, "flow:attention", layers=[1])
    mats = mixing_graph.layer_matrices(contributions(model, inp, "attention"), inp["attention_mask"], "attention")
    n = 4  # the padded sentence's real length
    expected = mixing_graph.flow_matrix(mats[1, :2, :n, :n].double().numpy())
    assert np.allclose(flow[1, 0, :n, :n].numpy(), expected, atol=1e-6)
    assert flow[1, 0, n:].abs().sum() == 0 and flow[1, 0, :, n:].abs().sum() == 0
    with pytest.raises(ValueError, match="max_flow_tokens"):
        contributions(model, inp, "flow:attention", max_flow_tokens=3)


# ====================================================================== input attributions
def test_loo_against_direct_replacement():
    model, inp = tiny(), tiny_inputs(pad_last=2)
    model.tokenizer = type("Tok", (), {"mask_token_id": 4, "pad_token_id": 0})()
    c = contributions(model, inp, "loo", baseline="mask", chunk_tokens=30)
    removed = contributions(model, inp, "loo", baseline="remove")
    for b, n in ((1, 5),):  # the padded sentence
        ids = inp["input_ids"][b : b + 1, :n]
        clean = model(ids).mean(1)
        for j in range(n):
            dropped = ids.clone()
            dropped[0, j] = 4
            expected = 1 - F.cosine_similarity(model(dropped).mean(1), clean, dim=-1)
            assert torch.allclose(c[b, 0, j], expected[0], atol=1e-5)
            keep = torch.ones_like(ids)
            keep[0, j] = 0  # "remove": masked out of attention and of the pooling, positions unchanged
            pooled = (model(ids, keep) * keep[..., None]).sum(1) / (n - 1)
            expected = 1 - F.cosine_similarity(pooled, clean, dim=-1)
            assert torch.allclose(removed[b, 0, j], expected[0], atol=1e-5)
        assert c[b, 0, n:].abs().sum() == 0


def test_integrated_gradients_completeness_and_grad_x_input():
    model, inp = tiny(), tiny_inputs(batch=1, pad_last=0)
    model.tokenizer = type("Tok", (), {"mask_token_id": 4, "pad_token_id": 0})()
    ig = contributions(model, inp, "integrated_gradients", baseline="mask", n_steps=64)
    hidden = model(**inp)
    base_ids = torch.full_like(inp["input_ids"], 4)
    clean, base = hidden.mean(1), model(base_ids).mean(1)
    gap = 1 - F.cosine_similarity(base, clean, dim=-1)
    assert abs(ig.sum() - gap[0]) < 0.02 * abs(gap[0]) + 1e-4  # completeness: sum = s(x) - s(baseline)
    gxi = contributions(model, inp, "grad_x_input")  # auto target: pooled_projection
    word = model.W_E[inp["input_ids"]].detach().clone().requires_grad_(True)
    with model.hooks([("embed.hook_word", lambda t, h: word)]):
        pooled = model(**inp).mean(1)
    (pooled * F.normalize(clean.detach(), dim=-1)).sum().backward()
    assert torch.allclose(gxi[0, 0], (word.grad * word).sum(-1)[0].detach(), atol=1e-5)
    with pytest.raises(ValueError, match="identically zero"):
        contributions(model, inp, "grad_x_input", target="pooled_cosine")


# ====================================================================== padding, errors, architectures
@pytest.mark.parametrize("method", ["attention_norm", "residual_norm", "alti", "value_zeroing", "rollout:alti", "loo"])
def test_padding_does_not_change_a_sentence(method):
    model, inp = tiny(), tiny_inputs(n=7, pad_last=3)
    model.tokenizer = type("Tok", (), {"mask_token_id": 4, "pad_token_id": 0})()
    both = contributions(model, inp, method)
    alone = contributions(model, {"input_ids": inp["input_ids"][1:, :4]}, method)
    assert torch.allclose(both[1:, ..., :4, :4] if both.shape[1] > 1 else both[1:, ..., :4], alone, atol=1e-5)
    assert both[1, ..., 4:].abs().sum() == 0


def test_errors():
    model, inp = tiny("pre"), tiny_inputs()
    with pytest.raises(NotImplementedError, match="post-LN"):
        contributions(model, inp, "residual_norm")
    assert contributions(model, inp, "alti").shape == (2, 3, 7, 7)  # ALTI has a pre-LN form
    with pytest.raises(ValueError, match="unknown contribution method"):
        contributions(model, inp, "rollout:loo")
    with pytest.raises(ValueError, match="layers"):
        contributions(model, inp, "attention", layers=[3])
    model.train()
    with pytest.raises(RuntimeError, match="eval"):
        contributions(model, inp, "attention")
