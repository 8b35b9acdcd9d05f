"""Known answers for the shared attention measures (experiments/attention.py) and the Kobayashi convention."""

from __future__ import annotations

import pytest
import torch
from bertscope.experiments import attention

from bertscope import models


def test_masses_on_planted_patterns():
    """Four planted heads on a 5-token sentence padded to 6: self, previous, next, uniform over real keys."""
    n, pos = 5, 6
    eye = torch.eye(pos)
    prev = torch.diag(torch.ones(pos - 1), -1)
    prev[0, 0] = 1.0
    nxt = torch.diag(torch.ones(pos - 1), 1)
    nxt[n - 1, n - 1] = 1.0
    uniform = torch.zeros(pos, pos)
    uniform[:, :n] = 1 / n
    pattern = torch.stack([eye, prev, nxt, uniform])[None]  # [1, 4, pos, pos]
    valid = torch.tensor([[True] * n + [False]])
    torch.testing.assert_close(attention.self_mass(pattern)[0, 0], torch.ones(pos))
    assert attention.previous_mass(pattern)[0, 1, 1:n].tolist() == [1.0] * (n - 1)
    assert attention.previous_mass(pattern)[0, 1, 0].item() == 0.0  # no previous token for the first query
    assert attention.next_mass(pattern)[0, 2, : n - 1].tolist() == [1.0] * (n - 1)
    assert attention.has_previous(valid).tolist() == [[False, True, True, True, True, False]]
    assert attention.has_next(valid).tolist() == [[True, True, True, True, False, False]]
    cls = torch.tensor([[True, False, False, False, False, False]])
    assert attention.key_mass(pattern, cls)[0, 3, :n].tolist() == pytest.approx([1 / n] * n)
    ids = torch.tensor([[101, 7, 8, 7, 102, 0]])
    duplicate, earlier = attention.copies(ids, valid & (ids != 101) & (ids != 102))
    assert duplicate[0].nonzero().tolist() == [[1, 3], [3, 1]]
    assert earlier[0].nonzero().tolist() == [[3, 1]]
    assert attention.key_mass(pattern, duplicate)[0, 3].tolist() == pytest.approx([0, 1 / n, 0, 1 / n, 0, 0])


def test_value_norms_are_norms_of_head_writes():
    v = torch.randn(2, 3, 4, 5)
    W_O = torch.randn(4, 5, 6)
    expected = torch.stack([torch.linalg.vector_norm(v[:, :, h] @ W_O[h], dim=-1) for h in range(4)], dim=1)
    torch.testing.assert_close(attention.value_norms(v, W_O), expected)
    # the Gram-matrix form same-token used before (sqrt(v W_O W_O^T v^T)) agrees
    gram = torch.einsum("hdm,hem->hde", W_O, W_O)
    torch.testing.assert_close(attention.value_norms(v, W_O), torch.einsum("bphd,hde,bphe->bhp", v, gram, v).sqrt())
    with pytest.raises(ValueError, match="W_O"):
        attention.value_norms(v, torch.randn(3, 5, 6))


def test_kobayashi_convention_f_includes_value_bias_and_excludes_output_bias(tiny_config):
    """f_h(x) = (x W_V[h] + b_V[h]) W_O[h] (Kobayashi et al. 2020): sum_j A[i, j] f_h(x_j) is the head's write
    ``hook_result`` (no b_O), and ``value_norms(hook_v, W_O)`` is ||f_h(x_j)||."""
    torch.manual_seed(0)
    model = models.Encoder(tiny_config).eval()
    model.init_weights(torch.Generator().manual_seed(0))
    for block in model.blocks:  # non-zero biases, so that the test can tell b_V and b_O apart
        for p in block.attn.parameters():
            if p.ndim == 1:
                torch.nn.init.normal_(p, std=0.5)
    ids = torch.randint(1000, 2000, (2, 7))
    _, cache = model.run_with_cache(ids, names_filter=lambda name: name.startswith("blocks.0."))
    attn = model.blocks[0].attn
    x = cache["blocks.0.hook_resid_pre"]
    f = torch.einsum("bpm,hmd->bphd", x, attn.W_V) + attn.b_V
    f = torch.einsum("bphd,hdn->bhpn", f, attn.W_O)  # [batch, head, key, d_model]
    pattern = cache["blocks.0.attn.hook_pattern"]
    write = torch.einsum("bhqk,bhkn->bqhn", pattern, f)
    torch.testing.assert_close(write, cache["blocks.0.attn.hook_result"], atol=1e-5, rtol=1e-4)
    norms = attention.value_norms(cache["blocks.0.attn.hook_v"], attn.W_O)
    torch.testing.assert_close(norms, torch.linalg.vector_norm(f, dim=-1), atol=1e-5, rtol=1e-4)
    # norm-weighted pattern: ||A[i, j] f(x_j)|| renormalised over keys
    contributions = torch.linalg.vector_norm(pattern[..., None] * f[:, :, None], dim=-1)  # [b, h, q, k]
    expected = contributions / contributions.sum(-1, keepdim=True)
    torch.testing.assert_close(attention.norm_weighted(pattern, norms), expected, atol=1e-5, rtol=1e-4)


def test_norm_weighted_rejects_mismatched_norms():
    with pytest.raises(ValueError, match="value_norms"):
        attention.norm_weighted(torch.ones(1, 2, 3, 3), torch.ones(1, 3, 3))
