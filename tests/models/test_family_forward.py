"""Every architecture runs its blocks through `Encoder.forward_from`, so what that loop provides (the run's
attention mask for hooks, which uniform ablation reads) holds for DeBERTa and ModernBERT too."""

from __future__ import annotations

import pytest
import torch
from bertscope.hooks import ablate_heads
from fixtures_deberta_modernbert import TEXTS, save_tiny_deberta, save_tiny_modernbert

from bertscope import models


@pytest.mark.parametrize("save", [save_tiny_deberta, save_tiny_modernbert], ids=["deberta-v2", "modernbert"])
def test_hooks_see_the_runs_mask_and_uniform_ablation_skips_padding(save, tmp_path):
    save(tmp_path)
    model = models.load(tmp_path)
    batch = model.tokenize(TEXTS[:3])
    mask = batch["attention_mask"]
    assert not bool(mask.all()), "the test needs a padded batch"
    seen = []

    def record(pattern, hook):
        seen.append(model.current_attention_mask)

    with torch.no_grad():
        model.run_with_hooks(**batch, fwd_hooks=[("blocks.0.attn.hook_pattern", record)])
    assert len(seen) == 1 and torch.equal(seen[0], mask)
    assert model.current_attention_mask is None  # cleared after the run

    _, cache = model.run_with_cache(**batch, names_filter="blocks.0.attn.hook_pattern")
    with torch.no_grad(), model.hooks(ablate_heads(model, {0: [0]}, method="uniform")):
        _, ablated = model.run_with_cache(**batch, names_filter="blocks.0.attn.hook_pattern")
    pattern = ablated["blocks.0.attn.hook_pattern"][:, 0]  # [batch, query, key]
    n_real = mask.sum(1)
    for b in range(mask.shape[0]):
        keys = pattern[b, : int(n_real[b])]
        assert torch.allclose(keys[:, mask[b].bool()], torch.full_like(keys[:, mask[b].bool()], 1 / int(n_real[b])))
        assert torch.all(keys[:, ~mask[b].bool()] == 0)
