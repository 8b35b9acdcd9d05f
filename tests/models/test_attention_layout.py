"""The explicit attention path (taken when scores or patterns are hooked, i.e. in a full capture) lays q, k, v,
scores, patterns and z out heads first to skip copies: its numbers are still the textbook ones, a replacement
from a hook is still used, and a ``fork_batch`` anywhere inside attention still broadcasts."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from bertscope.hooks.hook_points import fork_batch
from bertscope.models.encoder import head_results, qkv_heads_first
from einops import rearrange, reduce
from helpers import assert_float32_close

SENTENCES = ["The cat sat on the mat.", "Dogs bark loudly at night."]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("b, p, h, d", [(2, 5, 4, 8), (3, 17, 12, 32)])
def test_qkv_heads_first_is_the_linear_layer(b, p, h, d, bias):
    """Each q/k/v number is the dot product nn.Linear computes, only laid out heads first: equal up to the order
    of the ``h * d`` products' sum (the policy of tests/helpers.py). Not bitwise: a batched matmul and a linear
    layer may take different kernels (equal under AVX2, a few ulps apart under AVX512 and ATen's portable ones)."""
    gen = torch.Generator().manual_seed(b * p + h)
    m = h * d
    x = torch.randn(b, p, m, generator=gen)
    weight = torch.randn(3 * m, m, generator=gen) / m**0.5
    b_qkv = torch.randn(3 * m, generator=gen) if bias else None
    q, k, v = qkv_heads_first(x, weight, b_qkv, h)
    expected = rearrange(F.linear(x, weight, b_qkv), "b p (three h d) -> three b p h d", three=3, h=h)
    for got, want in zip((q, k, v), expected, strict=True):
        assert got.shape == (b, p, h, d)
        assert_float32_close(got, want, terms=m)
    # heads first in memory: [(head batch), pos, d_head] is a view, what the batched matmuls read
    assert rearrange(q, "b p h d -> h b p d").is_contiguous()


def test_full_capture_attention_is_the_textbook_computation(bundled):
    """From one full capture (padded batch): scores = q k^T / sqrt(d_head) with padded keys at the float minimum,
    pattern = softmax(scores), z = pattern v, result_h = z_h W_O[h], attn_out = sum_h result_h + b_O."""
    enc = bundled.tokenize(SENTENCES)
    with torch.no_grad():
        _, cache = bundled.run_with_cache(**enc)
    keep = enc["attention_mask"].bool()[:, None, None, :]
    for layer in (0, bundled.config.n_layers - 1):
        attn = bundled.blocks[layer].attn
        q, k, v, z = (cache[name, layer] for name in ("q", "k", "v", "z"))
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * attn.d_head**-0.5
        scores = scores.masked_fill(~keep, torch.finfo(scores.dtype).min)
        real = keep.expand_as(scores)  # padded keys: the float minimum, exactly
        assert_float32_close(cache["scores", layer][real], scores[real], terms=attn.d_head)
        assert (cache["scores", layer][~real] == scores[~real]).all()
        assert torch.equal(cache["pattern", layer], cache["scores", layer].contiguous().softmax(dim=-1))
        assert_float32_close(z, torch.einsum("bhqk,bkhd->bqhd", cache["pattern", layer], v), terms=z.shape[1])
        result = cache["result", layer]
        assert torch.equal(result, head_results(z.contiguous(), attn.W_O.detach()))
        summed = reduce(result, "b p h m -> b p m", "sum") + attn.b_O.detach()
        assert_float32_close(cache["attn_out", layer], summed, terms=bundled.config.d_model)


@pytest.mark.parametrize("site", ["attn.hook_v", "attn.hook_scores", "attn.hook_pattern"])
def test_fork_batch_inside_explicit_attention(bundled, site):
    """A batch of one forked into copies at v, the scores or the pattern (scores hooked, so the explicit path):
    every copy is the unforked run."""
    ids = bundled.tokenize(SENTENCES[0])["input_ids"]
    watch = ("blocks.1.attn.hook_scores", lambda t, hook: None)
    with torch.no_grad():
        plain = bundled.run_with_hooks(ids, fwd_hooks=[watch])
        forked = bundled.run_with_hooks(ids, fwd_hooks=[watch, (f"blocks.1.{site}", fork_batch(3))])
    assert forked.shape == (3, *plain.shape[1:])
    for copy in forked:
        assert_float32_close(copy, plain[0], terms=bundled.config.d_model, depth=bundled.config.n_layers + 1)


def test_a_replaced_pattern_is_the_one_used(bundled):
    """A hook's replacement (contiguous, [batch, head, query, key] order) drives z exactly as written."""
    ids = bundled.tokenize(SENTENCES[1])["input_ids"]
    n = ids.shape[1]
    uniform = torch.full((1, bundled.config.n_heads, n, n), 1.0 / n)
    with torch.no_grad():
        _, cache = bundled.run_with_cache(
            ids, names_filter=["blocks.2.attn.hook_v", "blocks.2.attn.hook_z"],
            fwd_hooks=[("blocks.2.attn.hook_pattern", lambda t, hook: uniform)],
        )
    v = cache["v", 2]
    assert_float32_close(cache["z", 2], v.mean(dim=1, keepdim=True).expand_as(v), terms=n)
