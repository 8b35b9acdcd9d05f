"""Issue 41's fast path: the per-token Jacobian projections (``jacobians.projections``, forward mode, one primal
pass per point shared by a vmapped batch of tangents) equal the same projections computed the slow, independent
way, reverse mode, one backward pass per embedding dimension (xsbert's computation), on every family, for the three
methods built on them (integrated Jacobians with both scores and at two layers, BiLRP with its LRP hooks, pairwise
gradient x input)."""

from __future__ import annotations

import pytest
import torch
from bertscope.hooks.similarity import jacobians, pairs
from bertscope.hooks.similarity.methods import lrp_hooks
from bertscope.hooks.similarity.pairs import embedding_from
from einops import einsum
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


@pytest.fixture(scope="module", params=list(MAKERS))
def family(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    MAKERS[request.param](folder)
    return request.param, models.load(folder).eval().double()  # float64: the two modes agree to rounding


def reverse_projection(model, text, *, layer, points, weights, kind, zero_reference=False, lrp=False):
    """``P`` ``[e, p]`` of one text by reverse mode: for each embedding dimension d, the gradient of
    ``sum_n w_n phi_d(x(alpha_n))`` with respect to the path, dotted with each token's ``x_i - r_i``."""
    s = pairs.side(model, [text])
    x = pairs.representation(model, s.ids, s, layer)[0]
    r = torch.zeros_like(x) if zero_reference else pairs.representation(
        model, pairs.reference_ids(model, s), s, layer)[0]
    path = (r + points[:, None, None] * (x - r)).requires_grad_()
    mask = s.mask.expand(len(points), -1)
    with torch.enable_grad(), model.hooks(lrp_hooks(model) if lrp else []):
        e = embedding_from(model, path, mask, layer, "mean", kind, detach_norm=lrp)
        jac = torch.stack([torch.autograd.grad((e[:, d] * weights).sum(), path, retain_graph=True)[0]
                           for d in range(e.shape[1])])  # fmt: skip
    return einsum(jac, x - r, "e s n m, n m -> e n")


def reverse_matrix(model, **kw):
    pa, pb = (reverse_projection(model, text, **kw) for text in (A, B))
    return (pa.T @ pb).double()


@pytest.mark.slow
def test_fast_projections_equal_reverse_mode_on_every_family(family):
    name, model = family
    one = torch.ones(1, dtype=torch.float64)
    simpson, xsbert = (dict(zip(("points", "weights"), jacobians.quadrature(n, rule, dtype=torch.float64),
                                strict=True)) for n, rule in ((4, "simpson"), (3, "xsbert")))  # fmt: skip
    cases = [
        ("integrated-jacobians", {"score": "cosine", "steps": 4, "layer": 0},
         {"kind": "cosine", "layer": 0, **simpson}),
        ("integrated-jacobians", {"score": "dot", "steps": 3, "layer": 1, "rule": "xsbert"},
         {"kind": "dot", "layer": 1, **xsbert}),
        ("grad-x-input", {"score": "cosine"},
         {"kind": "cosine", "layer": 0, "points": one, "weights": one, "zero_reference": True}),
        ("bilrp", {"score": "cosine"},
         {"kind": "cosine", "layer": 0, "points": one, "weights": one, "zero_reference": True, "lrp": True}),
    ]  # fmt: skip
    for method, options, reference in cases:
        got = similarity.attribute(model, A, B, method=method, pooling="mean", **options).matrix
        want = reverse_matrix(model, **reference)
        assert want.abs().max() > 1e-8, (name, method)  # gradient x input is near zero at a post-LN block input
        torch.testing.assert_close(got, want, atol=1e-9, rtol=1e-7,
                                   msg=lambda m, name=name, method=method: f"{name} {method}: {m}")


def test_chunks_do_not_change_the_result(tmp_path):
    """Splitting the points and the tangents into chunks (``chunk``: token positions per pass) is bookkeeping."""
    save_tiny_bert(tmp_path)
    model = models.load(tmp_path).eval()
    whole = similarity.attribute(model, A, B, steps=6, chunk=1 << 20)
    for chunk in (30, 120):  # one point and two tangents per pass; one point and every tangent
        part = similarity.attribute(model, A, B, steps=6, chunk=chunk)
        torch.testing.assert_close(part.matrix, whole.matrix, atol=1e-6, rtol=1e-5)


def test_tokens_whose_path_does_not_move_get_zero(tmp_path):
    """At block 0 the reference keeps the special tokens, so their ``x_i - r_i`` is zero and so is their column
    (skipped, not computed); at block 1 context has mixed into them and they move."""
    save_tiny_bert(tmp_path)
    model = models.load(tmp_path).eval()
    at0 = similarity.attribute(model, A, B, steps=3, layer=0)
    assert at0.tokens_a[0] == "[CLS]" and at0.tokens_a[-1] == "[SEP]"
    assert at0.matrix[0].abs().max() == 0 and at0.matrix[-1].abs().max() == 0
    assert at0.matrix[:, 0].abs().max() == 0 and at0.matrix[:, -1].abs().max() == 0
    at1 = similarity.attribute(model, A, B, steps=3, layer=1)
    assert at1.matrix[0].abs().max() > 0 and at1.matrix[:, -1].abs().max() > 0


@pytest.mark.parametrize("placement", ["post", "pre"])
def test_first_block_path_equals_the_generic_columns(placement, monkeypatch):
    """The row-sparse first block (Q/K/V of each token's row projected once, the tangent entering through block
    hooks) computes the generic pass's columns, for post-LN and pre-LN blocks (the pre-LN attention reads the
    LayerNorm's derivative at each point), at the first block and after it."""
    torch.manual_seed(0)
    cfg = models.EncoderConfig(vocab_size=40, d_model=16, n_layers=3, n_heads=4, d_mlp=32, max_positions=16,
                               norm_placement=placement, hidden_dropout=0.0, attention_dropout=0.0)
    model = models.Encoder(cfg).eval().double()
    x, r = torch.randn(2, 6, 16, dtype=torch.float64), torch.randn(2, 6, 16, dtype=torch.float64)
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2])
    points, weights = jacobians.quadrature(5, "simpson", dtype=torch.float64)
    for layer in (0, 2):
        assert jacobians._FirstBlock.applies(model, layer)
        kw = {"layer": layer, "pooling": "mean", "kind": "cosine", "points": points, "weights": weights}
        fast = jacobians.projections(model, x, r, mask, chunk=40, **kw)  # several point and tangent chunks
        monkeypatch.setattr(jacobians._FirstBlock, "applies", staticmethod(lambda model, layer: False))
        generic = jacobians.projections(model, x, r, mask, **kw)
        monkeypatch.undo()
        assert generic.abs().max() > 1e-3
        torch.testing.assert_close(fast, generic, atol=1e-12, rtol=1e-10)


def test_first_block_path_only_where_the_hooks_mean_what_it_needs(family):
    """The plain block with projections takes the row-sparse path; DeBERTa's and ModernBERT's blocks (their own
    attention) take the generic one (so do BiLRP's hooked runs: ``projections`` checks for extra hooks)."""
    name, model = family
    assert jacobians._FirstBlock.applies(model, 0) == (name not in ("deberta", "modernbert")), name
