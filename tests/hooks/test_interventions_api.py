"""One argument order for every intervention; uniform ablation takes the padding from the run."""

from __future__ import annotations

import pytest
import torch
from bertscope.hooks import ablate_heads, mean_z, patch_activation, patch_heads

TEXTS = ["The cat sat on the mat while the dog slept.", "Dogs bark."]


@pytest.fixture(scope="module")
def batch(bundled):
    b = bundled.to_tokens(TEXTS)
    assert (b["attention_mask"] == 0).any()
    return b


def _pattern_under(model, hooks, inputs, **kwargs):
    seen = {}

    def grab(t, h):
        seen["p"] = t.clone()

    with torch.no_grad():
        model.run_with_hooks(inputs, fwd_hooks=hooks + [("blocks.1.attn.hook_pattern", grab)], **kwargs)
    return seen["p"]


def test_uniform_ablation_reads_the_runs_mask(bundled, batch):
    ids, mask = batch["input_ids"], batch["attention_mask"]
    hooks = ablate_heads(bundled, {1: [3]}, method="uniform")  # no mask given
    pattern = _pattern_under(bundled, hooks, ids, attention_mask=mask, token_type_ids=batch["token_type_ids"])
    n_real = mask.sum(1)
    for i in range(len(TEXTS)):
        row = pattern[i, 3, 0]
        k = int(n_real[i])
        torch.testing.assert_close(row[:k], torch.full((k,), 1.0 / k), rtol=0, atol=1e-7)
        assert float(row[k:].abs().sum()) == 0.0  # never averages over padding
    # text in: the mask comes from the tokenizer and is used the same way
    torch.testing.assert_close(_pattern_under(bundled, hooks, TEXTS)[:, 3], pattern[:, 3], rtol=0, atol=0)
    # an explicit mask equal to the run's is accepted and gives the same
    same = ablate_heads(bundled, {1: [3]}, method="uniform", attention_mask=mask)
    torch.testing.assert_close(_pattern_under(bundled, same, TEXTS)[:, 3], pattern[:, 3], rtol=0, atol=0)


def test_uniform_ablation_mask_mismatch_is_an_error(bundled, batch):
    wrong = torch.ones_like(batch["attention_mask"])
    hooks = ablate_heads(bundled, {1: [3]}, method="uniform", attention_mask=wrong)
    with pytest.raises(ValueError, match="differs from the one the model ran with"):
        _pattern_under(bundled, hooks, TEXTS)
    # a run without a mask attends to every key: a mask with padding given to the ablation contradicts it
    hooks = ablate_heads(bundled, {1: [3]}, method="uniform", attention_mask=batch["attention_mask"])
    with pytest.raises(ValueError, match="differs"):
        _pattern_under(bundled, hooks, batch["input_ids"])
    # the recorded mask is cleared after the run
    assert bundled.current_attention_mask is None


def test_model_first_everywhere(bundled, batch):
    with torch.no_grad():
        _, clean = bundled.run_with_cache(TEXTS, names_filter=["blocks.2.attn.hook_z", "blocks.3.hook_resid_pre"])
    new = patch_heads(bundled, {2: [1, 4]}, clean)
    act = patch_activation(bundled, "blocks.3.hook_resid_pre", clean, positions=[1])
    assert [n for n, _ in new] == ["blocks.2.attn.hook_z"] and act[0][0] == "blocks.3.hook_resid_pre"
    assert isinstance(mean_z(bundled, TEXTS)[0], torch.Tensor)
    torch.testing.assert_close(mean_z(bundled, TEXTS)[3], mean_z(bundled, **batch)[3], rtol=0, atol=0)
    # the model checks heads and names when the hooks are built
    with pytest.raises(ValueError, match="head 12 out of range"):
        patch_heads(bundled, {2: [12]}, clean)
    with pytest.raises(KeyError, match="no hook point matches"):
        patch_activation(bundled, "blocks.3.hook_resid_typo", clean)
    with pytest.raises(KeyError, match="patch source has no"):
        patch_activation(bundled, "blocks.4.hook_resid_pre", clean)


def test_old_order_warns_and_does_the_same(bundled):
    with torch.no_grad():
        _, clean = bundled.run_with_cache(TEXTS, names_filter="blocks.2.attn.hook_z")
        with pytest.warns(FutureWarning, match="model first"):
            old = patch_heads({2: [1, 4]}, clean)
        new = patch_heads(bundled, {2: [1, 4]}, clean)
        corrupted = ["The dog sat on the mat while the cat slept.", "Cats bark."]
        out_old = bundled.run_with_hooks(corrupted, fwd_hooks=old)
        out_new = bundled.run_with_hooks(corrupted, fwd_hooks=new)
        torch.testing.assert_close(out_old, out_new, rtol=0, atol=0)
        with pytest.warns(FutureWarning, match="model first"):
            old_act = patch_activation("blocks.2.attn.hook_z", clean)
        assert old_act[0][0] == "blocks.2.attn.hook_z"
