"""Issue 41: pairwise attribution of a similarity score, pooling and the embedding decomposition.

Known answers: a constructed model whose similarity comes from one planted token pair (every method ranks that
pair first; integrated Jacobians complete to 1e-3 of the score at default steps); the decomposition identity on
every family; xsbert's conventions pinned by a hand-written copy of its computation."""

from __future__ import annotations

import json

import pytest
import torch
from bertscope.hooks.similarity import jacobians, pairs
from bertscope.hooks.similarity.methods import xsbert_layer
from bertscope.hooks.similarity.pooling import default_pooling, pool
from family_fixtures import FAMILIES, save_tiny_family
from fixtures_deberta_modernbert import save_tiny_deberta, save_tiny_modernbert
from helpers import save_tiny_bert

from bertscope import models, similarity

MAKERS = {
    "bert": save_tiny_bert,
    **{name: (lambda folder, name=name: save_tiny_family(name, folder)) for name in FAMILIES},
    "deberta": save_tiny_deberta,
    "modernbert": save_tiny_modernbert,
}
A, B = "the cat sat on the mat.", "dogs bark at a cat"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-bert")
    save_tiny_bert(folder)
    return models.load(folder).eval()


@pytest.fixture(scope="module", params=list(MAKERS))
def family(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    MAKERS[request.param](folder)
    return request.param, models.load(folder).eval()


# ---------------------------------------------------------------------- pooling
def test_pooling_known_values():
    h = torch.tensor([[[1.0, 2.0], [3.0, -4.0], [100.0, 100.0]]])
    m = torch.tensor([[1, 1, 0]])
    assert pool(h, m, "mean").tolist() == [[2.0, -1.0]]
    assert pool(h, m, "cls").tolist() == [[1.0, 2.0]]
    assert pool(h, m, "max").tolist() == [[3.0, 2.0]]  # the padded row is never the max
    with pytest.raises(ValueError, match="pooling"):
        pool(h, m, "sum")


def test_default_pooling_reads_sentence_transformers_config(tmp_path):
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))

    class Fake:
        weight_files = [tmp_path / "model.safetensors"]

    assert default_pooling(Fake()) == "cls"
    Fake.weight_files = [tmp_path / "elsewhere" / "model.safetensors"]
    assert default_pooling(Fake()) == "mean"


def test_embed_matches_model_output(tiny):
    texts = ["a b c d e f", "the cat", "dogs bark loudly at night"]
    got = similarity.embed(tiny, texts, pooling=["mean", "cls"], batch_size=2)
    enc = tiny.tokenize(texts)
    hidden = tiny(**enc)
    for how in ("mean", "cls"):
        want = pool(hidden, enc["attention_mask"], how)
        torch.testing.assert_close(got[(similarity.final_site(tiny), how)], want, atol=1e-6, rtol=0)


def test_embed_runs_each_distinct_text_once_and_keeps_input_order(tiny):
    texts = ["dogs bark loudly at night", "the cat", "dogs bark loudly at night", "a b c", "the cat"]
    site = similarity.final_site(tiny)
    got = similarity.embed(tiny, texts, pooling="max", sites=["blocks.0.hook_resid_post", site], batch_size=2)
    calls = []
    tokenize = tiny.tokenize
    tiny.tokenize = lambda rows: calls.append(list(rows)) or tokenize(rows)
    try:
        similarity.embed(tiny, texts, pooling="max", batch_size=2)
    finally:
        del tiny.tokenize
    assert sorted(t for rows in calls for t in rows) == sorted(set(texts))  # each distinct text once
    for i, text in enumerate(texts):
        one = similarity.embed(tiny, [text], pooling="max", sites=["blocks.0.hook_resid_post", site])
        for key in one:
            torch.testing.assert_close(got[key][i], one[key][0], atol=1e-6, rtol=0)


# ---------------------------------------------------------------------- xsbert conventions
def test_xsbert_reference_and_points(tiny):
    s = pairs.side(tiny, ["the cat sat", "dogs"])
    ref = pairs.reference_ids(tiny, s)
    cls, sep, pad = (tiny.special_token_ids[k] for k in ("cls", "sep", "pad"))
    assert ref[0].tolist() == [cls, pad, pad, pad, sep]  # specials kept, content -> padding token
    assert ref[1, :3].tolist() == [cls, pad, sep] and ref[1, 3:].tolist() == s.ids[1, 3:].tolist()
    assert jacobians.alphas(4).tolist() == [1.0, 0.75, 0.5, 0.25]  # torch.arange(1, 0, -1/N): reference excluded
    points, weights = jacobians.quadrature(4, "xsbert")
    assert points.tolist() == [1.0, 0.75, 0.5, 0.25] and weights.tolist() == [0.25] * 4
    points, weights = jacobians.quadrature(4, "trapezoid")
    assert points.tolist() == [1.0, 0.75, 0.5, 0.25, 0.0] and weights.tolist() == [0.125, 0.25, 0.25, 0.25, 0.125]
    points, weights = jacobians.quadrature(4, "simpson")
    assert points.tolist() == [1.0, 0.75, 0.5, 0.25, 0.0]
    torch.testing.assert_close(weights, torch.tensor([1.0, 4.0, 2.0, 4.0, 1.0]) / 12)


@pytest.mark.parametrize("steps", [1, 2, 3, 4, 5, 6, 7, 50])
def test_quadrature_rules_integrate_what_their_order_promises(steps):
    """Every rule's weights sum to 1; Simpson (3/8 on the last three intervals for odd steps) integrates a cubic
    exactly and the trapezoid a line; xsbert's right sum misses a line's integral by 1/(2 steps)."""
    for rule in jacobians.RULES:
        points, weights = jacobians.quadrature(steps, rule, dtype=torch.float64)
        assert weights.sum().item() == pytest.approx(1.0, abs=1e-12)
        assert points.tolist() == sorted(points.tolist(), reverse=True)
    line = lambda x: 3 * x + 1  # noqa: E731  integral 2.5
    cubic = lambda x: 4 * x**3 - 3 * x**2 + 2 * x  # noqa: E731  integral 1 - 1 + 1 = 1
    p, w = jacobians.quadrature(steps, "trapezoid", dtype=torch.float64)
    assert (w * line(p)).sum().item() == pytest.approx(2.5, abs=1e-12)
    p, w = jacobians.quadrature(steps, "xsbert", dtype=torch.float64)
    assert (w * line(p)).sum().item() == pytest.approx(2.5 + 1.5 / steps, abs=1e-12)
    p, w = jacobians.quadrature(steps, "simpson", dtype=torch.float64)
    if steps > 1:
        assert (w * cubic(p)).sum().item() == pytest.approx(1.0, abs=1e-12)
    with pytest.raises(ValueError, match="rule must be one of"):
        jacobians.quadrature(steps, "midpoint")


def test_integrated_jacobians_default_layer_is_xsbert_depth(tiny):
    """xsbert's examples attribute to block 10 of 12; the default scales that depth (5 of the bundled 6)."""
    assert [xsbert_layer(n) for n in (1, 2, 4, 6, 8, 12, 24)] == [0, 1, 3, 5, 7, 10, 20]
    default = similarity.attribute(tiny, A, B, steps=4)
    explicit = similarity.attribute(tiny, A, B, steps=4, layer=xsbert_layer(tiny.config.n_layers))
    torch.testing.assert_close(default.matrix, explicit.matrix)
    assert f"block {xsbert_layer(tiny.config.n_layers)}'s input" in default.reference
    for bad in (-1, tiny.config.n_layers, 1.5):
        with pytest.raises(ValueError, match="layer must be a block index"):
            similarity.attribute(tiny, A, B, steps=2, layer=bad)


def _xsbert_matrix(model, text_a, text_b, layer, steps):
    """lucasmllr/xsbert's explain_similarity (dot), written out: the interpolation hook at block ``layer``'s
    input, one backward pass per embedding dimension, J summed over the N points / N, A = da * (J_a^T J_b) * db
    summed over the representation dimensions."""
    out = []
    for text in (text_a, text_b):
        s = pairs.side(model, [text])
        x = pairs.representation(model, s.ids, s, layer)[0]
        r = pairs.representation(model, pairs.reference_ids(model, s), s, layer)[0]
        a = torch.arange(1, 0, -1 / steps)[:, None, None]
        g = (r + a * (x - r)).requires_grad_()
        with torch.enable_grad():
            emb = pool(model.forward_from(layer, g, s.mask.expand(steps, -1)), s.mask.expand(steps, -1), "mean")
            jac = torch.stack([torch.autograd.grad(list(emb[:, d]), g, retain_graph=True)[0].sum(0)
                               for d in range(emb.shape[1])]) / steps  # fmt: skip
        out.append((jac, x - r))
    (ja, da), (jb, db) = out
    return torch.einsum("ik,dik,djl,jl->ij", da, ja, jb, db)


@pytest.mark.parametrize("layer", [0, 1])
def test_integrated_jacobians_pin_xsbert(tiny, layer):
    want = _xsbert_matrix(tiny, A, B, layer, steps=7)
    got = similarity.attribute(tiny, A, B, score="dot", steps=7, layer=layer, rule="xsbert")
    torch.testing.assert_close(got.matrix, want.double(), atol=1e-5, rtol=1e-4)


# ---------------------------------------------------------------------- planted pair
def planted_model(folder):
    """A tiny BERT whose similarity comes from one planted token pair: attention and MLP writes zeroed, so each
    token's output is its own normalised embedding; the last LayerNorm keeps dims 0..15 only. "cat" points along
    dim 0 (magnitude 4 after LayerNorm); the other words of text a have a small part in dims 1..7, of text b in
    dims 8..15, each with a small share of dim 0, the rest of their mass in the dropped dims; special tokens in
    dims 16..30, which the output drops; the padding token (the reference's words) like an ordinary word over
    dims 1..15."""
    save_tiny_bert(folder)
    model = models.load(folder).eval()
    g = torch.Generator().manual_seed(0)
    tok = model.tokenizer
    d = model.config.d_model

    def vec(dims, lean=0.0, scale=1.0):
        v = torch.zeros(d)
        v[dims] = scale * torch.randn(len(dims), generator=g)
        v[dims] -= v[dims].mean()
        if dims[0] < 16:  # most of an ordinary word's mass in the dropped dims
            v[16:31] = vec(list(range(16, 31)))[16:31]
        v[0] += lean
        v[31] -= lean
        return v

    with torch.no_grad():
        w = model.embed.word.weight
        w.copy_(torch.stack([vec(list(range(16, 31))) for _ in range(w.shape[0])]))
        w[tok.pad_token_id] = vec(list(range(1, 16)), 0.0, 0.3)  # the reference's words: a direction of their own
        w[tok.convert_tokens_to_ids("cat")] = 3 * (torch.eye(d)[0] - torch.eye(d)[31])
        for t in tok.tokenize(A):
            if t != "cat":
                w[tok.convert_tokens_to_ids(t)] = vec(list(range(1, 8)), 0.4, 0.3)
        for t in tok.tokenize(B):
            if t != "cat":
                w[tok.convert_tokens_to_ids(t)] = vec(list(range(8, 16)), 0.4, 0.3)
        model.embed.pos.weight.zero_()
        model.embed.token_type.weight.zero_()
        for block in model.blocks:
            block.attn.out.weight.zero_()
            block.attn.out.bias.zero_()
            block.mlp.fc_out.weight.zero_()
            block.mlp.fc_out.bias.zero_()
        model.blocks[-1].ln2.weight[16:] = 0
    return model


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    return planted_model(tmp_path_factory.mktemp("planted"))


PAIRWISE = [m for m in similarity.TABLE if not m.startswith("mixing:")]


@pytest.mark.parametrize("method", [m for m in PAIRWISE if m != "grad-x-input"])
def test_every_method_ranks_the_planted_pair_first(planted, method):
    r = similarity.attribute(planted, A, B, method=method)
    assert r.score > 0.5
    top = r.top(1)[0]
    assert (top[0], top[1]) == ("cat", "cat"), (method, r.top(3))


@pytest.mark.parametrize("method", ["mixing:rollout:alti", "mixing:flow:attention_norm"])
def test_lifted_mixing_is_uniform_without_mixing(planted, method):
    """The known answer for the lifted context-mixing methods: the planted model's blocks write nothing, so no
    token takes anything from another, every text's token weights are 1/n and the pair matrix is the score spread
    evenly. (They cannot find the planted pair: a text's token weights never look at the other text.)"""
    r = similarity.attribute(planted, A, B, method=method)
    n = r.matrix.numel()
    torch.testing.assert_close(r.matrix, torch.full_like(r.matrix, r.score / n), atol=1e-6, rtol=0)
    assert abs(r.error) < 1e-6


def test_lifted_mixing_sums_to_the_score(tiny):
    for method in ("mixing:rollout:attention", "mixing:loo"):
        r = similarity.attribute(tiny, A, B, method=method)
        assert abs(r.error) < 1e-5 and r.target == pytest.approx(r.score, abs=1e-9)


def test_grad_x_input_is_zero_at_a_layernorm_input(planted):
    """The known answer for gradient x input here: the planted model's blocks write nothing, so its output is
    LayerNorm(x), invariant to the scale of x, and J(x) x = d/dc phi(c x) = 0: the method sees nothing (the reason
    integrated Jacobians and BiLRP are the methods to use on post-LN encoders)."""
    r = similarity.attribute(planted, A, B, method="grad-x-input")
    assert r.matrix.abs().max().item() < 1e-6 * r.score


def test_integrated_jacobians_complete_at_default_steps(planted, tiny):
    for model in (planted, tiny):
        r = similarity.attribute(model, A, B)
        assert abs(r.error) <= 1e-3 * abs(r.score), (r.error, r.score)
        assert r.matrix.sum().item() == pytest.approx(r.target + r.error, abs=1e-9)


def test_word_level_sums_pieces(tiny):
    a, b = "unbelievably uncommon", "a cat"
    piece = similarity.attribute(tiny, a, b, method="occlusion")
    word = similarity.attribute(tiny, a, b, method="occlusion", level="word")
    assert word.tokens_a == ["[CLS]", "unbelievably", "uncommon", "[SEP]"]
    assert word.matrix.sum().item() == pytest.approx(piece.matrix.sum().item(), abs=1e-9)


def test_batched_equals_one_at_a_time(tiny):
    texts_a, texts_b = [A, "dogs bark", "a b c d e f g"], [B, "the cat sat on the mat", "x"]
    many = similarity.attribute(tiny, texts_a, texts_b, method="integrated-jacobians", steps=5, batch_size=3)
    for i, r in enumerate(many):
        one = similarity.attribute(tiny, texts_a[i], texts_b[i], method="integrated-jacobians", steps=5)
        torch.testing.assert_close(r.matrix, one.matrix, atol=1e-5, rtol=1e-4)
        assert r.target == pytest.approx(one.target, abs=1e-6)


def test_refusals(tiny):
    with pytest.raises(ValueError, match="unknown pairwise method"):
        similarity.attribute(tiny, A, B, method="nope")
    with pytest.raises(ValueError, match="takes no option"):
        similarity.attribute(tiny, A, B, method="occlusion", steps=3)
    with pytest.raises(ValueError, match="same length"):
        similarity.attribute(tiny, [A, A], [B])
    with pytest.raises(ValueError, match="linear pooling"):
        similarity.decompose(tiny, A, pooling="max")


# ---------------------------------------------------------------------- every family
@pytest.mark.slow
def test_every_family(family):
    name, model = family
    a, b = "the cat sat on the mat.", "dogs bark"
    dec = similarity.decompose(model, [a, b])
    assert dec.error < 1e-5, name
    sh = similarity.shares(model, a, b)
    cos = torch.nn.functional.cosine_similarity(dec.embedding[0], dec.embedding[1], dim=0)
    assert sh.share.sum() == pytest.approx(float(cos), abs=1e-5), name
    for method in PAIRWISE + ["mixing:rollout:alti"]:
        r = similarity.attribute(model, a, b, method=method, **({"steps": 8} if "steps" in
                                                                 similarity.TABLE[method].defaults else {}))
        assert r.matrix.shape == (len(r.tokens_a), len(r.tokens_b)), (name, method)
        assert torch.isfinite(r.matrix).all(), (name, method)
    r = similarity.attribute(model, a, b, steps=300)
    assert abs(r.error) <= 2e-3 * max(abs(r.score), abs(r.target)), (name, r.error, r.score)


@pytest.mark.slow
def test_integrated_jacobians_equal_captum_layer_integrated_gradients(tiny):
    """An independent implementation: Captum's LayerIntegratedGradients of each embedding dimension of phi at the
    embedding output, from the same reference, with its riemann_right points (xsbert's), gives the rows of P."""
    from bertscope.hooks.similarity.pooling import normalise
    from captum.attr import LayerIntegratedGradients

    steps, ps = 4, []
    for text in (A, B):
        s = pairs.side(tiny, [text])

        def forward(ids, mask=s.mask):
            m = mask.expand(ids.shape[0], -1)
            return normalise(pool(tiny(ids, m), m, "mean"), "cosine")

        lig = LayerIntegratedGradients(forward, tiny.embed)
        ref = pairs.reference_ids(tiny, s)
        ps.append(torch.stack([lig.attribute(s.ids, baselines=ref, target=d, n_steps=steps, method="riemann_right")[0]
                               .sum(-1) for d in range(tiny.config.d_model)]))  # fmt: skip
    got = similarity.attribute(tiny, A, B, steps=steps, rule="xsbert", layer=0)
    torch.testing.assert_close(got.matrix, (ps[0].T @ ps[1]).double(), atol=1e-6, rtol=1e-5)


@pytest.mark.slow
def test_integrated_gradients_equal_captum_and_complete_at_default_steps(tiny):
    """Each side's integrated gradients with xsbert's points are Captum's LayerIntegratedGradients (riemann_right)
    of ``phi(side) . e_other`` at the embedding output; the default Simpson weights meet the target within 1e-3
    of the score at 50 steps."""
    from bertscope.hooks.similarity.pooling import normalise
    from captum.attr import LayerIntegratedGradients

    steps, sides = 4, []
    for text, other in ((A, B), (B, A)):
        s, o = pairs.side(tiny, [text]), pairs.side(tiny, [other])
        e_other = normalise(pool(tiny(o.ids, o.mask), o.mask, "mean"), "cosine").detach()

        def forward(ids, mask=s.mask, e_other=e_other):
            m = mask.expand(ids.shape[0], -1)
            return (normalise(pool(tiny(ids, m), m, "mean"), "cosine") * e_other).sum(-1)

        lig = LayerIntegratedGradients(forward, tiny.embed)
        attr = lig.attribute(s.ids, baselines=pairs.reference_ids(tiny, s), n_steps=steps, method="riemann_right")
        sides.append(attr[0].sum(-1))
    ig_a, ig_b = sides
    want = (ig_a[:, None] / len(ig_b) + ig_b[None, :] / len(ig_a)) / 2
    got = similarity.attribute(tiny, A, B, method="integrated-gradients", steps=steps, rule="xsbert")
    torch.testing.assert_close(got.matrix, want.double(), atol=1e-6, rtol=1e-5)
    r = similarity.attribute(tiny, A, B, method="integrated-gradients")
    assert abs(r.error) <= 1e-3 * abs(r.score), (r.error, r.score)
