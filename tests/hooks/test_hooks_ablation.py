"""hooks.ablation: head gates agree with ablate_heads (the one-configuration form) and with mean_z."""

from __future__ import annotations

import pytest
import torch
from bertscope.hooks import ablate_heads, mean_z
from bertscope.hooks.ablation import head_gates, mean_z_over

from bertscope import models


@pytest.fixture(scope="module")
def tiny(tiny_config):
    return models.random_encoder(tiny_config, seed=0).eval()


@pytest.fixture(scope="module")
def batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 2000, (3, 7), generator=g)
    mask = torch.ones_like(ids)
    mask[2, 5:] = 0
    return ids, mask


@pytest.mark.parametrize("method", ["zero", "mean", "uniform"])
def test_a_closed_gate_is_ablate_heads(tiny, batch, method):
    ids, mask = batch
    types = torch.zeros_like(ids)
    reference = mean_z(tiny, ids, mask)
    keep = torch.ones(1, tiny.config.n_layers, tiny.config.n_heads)
    keep[0, 1, 2] = 0
    stacked = torch.stack([reference[layer] for layer in range(tiny.config.n_layers)])
    with torch.no_grad(), tiny.hooks(head_gates(keep, n_batch=3, method=method, mean_z=stacked, attention_mask=mask)):
        gated = tiny(ids, mask, types)
    with torch.no_grad(), tiny.hooks(ablate_heads(tiny, {1: [2]}, method, reference=reference, attention_mask=mask)):
        ablated = tiny(ids, mask, types)
    with torch.no_grad():
        clean = tiny(ids, mask, types)
    real = mask.bool()
    torch.testing.assert_close(gated[real], ablated[real], atol=1e-5, rtol=1e-4)
    assert (gated[real] - clean[real]).abs().max() > 1e-6  # the gate did something (random init: nearly uniform)


def test_mean_z_over_batches_is_the_token_weighted_mean(tiny, batch):
    ids, mask = batch

    class Batch:
        def __init__(self, rows: slice) -> None:
            self.input_ids, self.attention_mask = ids[rows], mask[rows]
            self.token_type_ids = torch.zeros_like(self.input_ids)

    over = mean_z_over(tiny, [Batch(slice(0, 1)), Batch(slice(1, 3))])  # [layer, head, d_head]
    whole = mean_z(tiny, ids, mask)
    for layer in range(tiny.config.n_layers):
        torch.testing.assert_close(over[layer], whole[layer], atol=1e-6, rtol=1e-5)
