"""Hook points fire with their documented shapes, mean what the docs say, and interventions are exact."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import torch
from bertscope.hooks import ablate_heads, mean_z, patch_activation, patch_heads
from helpers import assert_close_across_kernels, assert_float32_close

from bertscope import models

SENTENCES = ["The cat sat on the mat while the other cat slept.", "Dogs bark.", "A short one, with a comma."]
DOCS = Path(__file__).resolve().parents[2] / "docs" / "hooks.md"


@pytest.fixture(scope="module")
def batch(tokenizer) -> dict[str, torch.Tensor]:
    enc = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    assert (enc["attention_mask"] == 0).any()
    return {k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids")}


@pytest.fixture(scope="module")
def full_cache(bundled, batch):
    with torch.no_grad():
        return bundled.run_with_cache(**batch)


def expected_shape(name: str, cfg: models.EncoderConfig, b: int, p: int) -> tuple[int, ...]:
    if name.endswith(("hook_q", "hook_k", "hook_v", "hook_z")):
        return (b, p, cfg.n_heads, cfg.d_head)
    if name.endswith(("hook_scores", "hook_pattern")):
        return (b, cfg.n_heads, p, p)
    if name.endswith("hook_result"):
        return (b, p, cfg.n_heads, cfg.d_model)
    if name.endswith(("mlp.hook_pre", "mlp.hook_post")):
        return (b, p, cfg.d_mlp)
    if name.endswith("hook_scale"):
        return (b, p, 1)
    return (b, p, cfg.d_model)


def test_every_hook_fires_with_its_documented_shape(bundled, batch, full_cache):
    _, cache = full_cache
    b, p = batch["input_ids"].shape
    assert list(cache) == bundled.hook_names()  # every hook fired, in forward order
    assert len(bundled.hook_names()) == 6 + 6 * 18
    for name, tensor in cache.items():
        assert tuple(tensor.shape) == expected_shape(name, bundled.config, b, p), name
        assert not tensor.requires_grad


def test_docs_list_every_hook_name(bundled):
    text = DOCS.read_text()
    documented = set(re.findall(r"`((?:embed|blocks\.L|ln_final)\.[a-z_0-9.]+)`", text))
    generic = {re.sub(r"^blocks\.\d+\.", "blocks.L.", n) for n in bundled.hook_names()}
    pre = models.random_encoder(models.EncoderConfig(d_model=8, n_layers=1, n_heads=2, d_mlp=8, norm_placement="pre"))
    generic |= {re.sub(r"^blocks\.\d+\.", "blocks.L.", n) for n in pre.hook_names()}
    assert generic <= documented, generic - documented


def test_cache_matches_transformers(bundled, hf_bundled, batch, full_cache):
    _, cache = full_cache
    with torch.no_grad():
        ref = hf_bundled(**batch, output_attentions=True, output_hidden_states=True)
    real = batch["attention_mask"].bool()
    d = bundled.config.d_model  # the policy of tests/helpers.py: summation length d_model, depth in layers
    assert_float32_close(cache["embed.hook_out"][real], ref.hidden_states[0][real], terms=d)
    keys = real[:, None, None, :].expand(-1, 12, real.shape[1], -1)
    queries = real[:, None, :, None].expand_as(keys)
    for layer in range(6):
        got = cache[f"blocks.{layer}.hook_resid_post"]
        assert_float32_close(got[real], ref.hidden_states[layer + 1][real], terms=d, depth=layer + 2)
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"]  # probabilities: scale 1
        assert_float32_close(pattern[queries], ref.attentions[layer][queries], terms=d, depth=layer + 1, scale=1.0,
                             msg=f"attention probabilities, layer {layer}")


def test_result_sums_to_attn_out_and_patterns_are_distributions(bundled, batch, full_cache):
    _, cache = full_cache
    real = batch["attention_mask"].bool()
    for layer in range(6):
        result = cache[f"blocks.{layer}.attn.hook_result"]
        summed = result.sum(dim=2) + bundled.blocks[layer].attn.b_O
        assert_float32_close(summed, cache[f"blocks.{layer}.hook_attn_out"], terms=bundled.config.d_model)
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"]
        assert_float32_close(pattern.sum(-1), torch.ones_like(pattern.sum(-1)), terms=pattern.shape[-1])
        padded_keys = (~real)[:, None, None, :].expand_as(pattern)
        assert (pattern[padded_keys] == 0).all()


def test_residual_stream_identities(bundled, full_cache):
    _, cache = full_cache
    for layer in range(6):
        blk = bundled.blocks[layer]
        with torch.no_grad():
            mid = blk.ln1(cache[f"blocks.{layer}.hook_resid_pre"] + cache[f"blocks.{layer}.hook_attn_out"])
            assert_float32_close(mid, cache[f"blocks.{layer}.hook_resid_mid"], terms=bundled.config.d_model)
            post = blk.ln2(mid + cache[f"blocks.{layer}.hook_mlp_out"])
            assert_float32_close(post, cache[f"blocks.{layer}.hook_resid_post"], terms=bundled.config.d_model)
        if layer:
            assert torch.equal(cache[f"blocks.{layer}.hook_resid_pre"], cache[f"blocks.{layer - 1}.hook_resid_post"])


def test_names_filter_keeps_only_what_was_asked(bundled, batch):
    with torch.no_grad():
        _, by_glob = bundled.run_with_cache(**batch, names_filter="blocks.*.attn.hook_pattern")
        _, by_list = bundled.run_with_cache(**batch, names_filter=["embed.hook_out", "blocks.2.hook_mlp_out"])
        _, by_pred = bundled.run_with_cache(**batch, names_filter=lambda n: n.endswith("hook_z"))
    assert list(by_glob) == [f"blocks.{i}.attn.hook_pattern" for i in range(6)]
    assert list(by_list) == ["embed.hook_out", "blocks.2.hook_mlp_out"]
    assert list(by_pred) == [f"blocks.{i}.attn.hook_z" for i in range(6)]
    assert by_glob.stack("attn.hook_pattern").shape[0] == 6
    assert by_pred.heads("blocks.0.attn.hook_z", [1, 3]).shape[2] == 2
    with pytest.raises(KeyError, match="no hook point matches"):
        bundled.run_with_cache(**batch, names_filter="blocks.*.attn.hook_patern")


def test_stop_at_layer_and_cache_device(bundled, batch, full_cache):
    _, full = full_cache
    with torch.no_grad():
        last, cache = bundled.run_with_cache(**batch, names_filter="blocks.*.hook_resid_post", stop_at_layer=2,
                                             cache_device="cpu")
        _, unstopped = bundled.run_with_cache(**batch, names_filter="blocks.*.hook_resid_post")
    assert list(cache) == [f"blocks.{i}.hook_resid_post" for i in range(3)]
    assert torch.equal(last, unstopped["blocks.2.hook_resid_post"])  # same kernels: identical
    # the full cache includes hook_pattern, which takes the explicit attention path: other kernels, same math
    assert_close_across_kernels(last, full["blocks.2.hook_resid_post"])


def test_forward_from_finishes_a_forward_pass(bundled, batch):
    with torch.no_grad():
        out, cache = bundled.run_with_cache(**batch, names_filter="blocks.*.hook_resid_pre")
        for layer in range(6):
            resumed = bundled.forward_from(layer, cache[f"blocks.{layer}.hook_resid_pre"], batch["attention_mask"])
            assert torch.equal(resumed, out), layer
        part = bundled.forward_from(1, cache["blocks.1.hook_resid_pre"], batch["attention_mask"], stop_at_layer=2)
        assert torch.equal(part, cache["blocks.3.hook_resid_pre"])
    with pytest.raises(ValueError, match="layer must be in"):
        bundled.forward_from(6, cache["blocks.0.hook_resid_pre"])


def test_cache_is_detached_even_with_grad(bundled, batch):
    _, cache = bundled.run_with_cache(**batch, names_filter="blocks.0.hook_resid_post")
    assert not cache["blocks.0.hook_resid_post"].requires_grad


def test_hooks_are_removed_after_an_exception(bundled, batch):
    def boom(tensor, hook):
        raise RuntimeError("inside")

    with pytest.raises(RuntimeError, match="inside"):
        with bundled.hooks([("blocks.*.attn.hook_pattern", boom)]):
            bundled(**batch)
    assert not any(hp.is_hooked for hp in bundled.hook_dict.values())
    with pytest.raises(RuntimeError, match="inside"):
        bundled.run_with_hooks(**batch, fwd_hooks=[("embed.hook_out", boom)])
    assert not any(hp.is_hooked for hp in bundled.hook_dict.values())


def test_plain_register_forward_hook_works(bundled, batch):
    seen = []
    handle = bundled.hook_dict["blocks.1.hook_mlp_out"].register_forward_hook(lambda m, i, o: seen.append(o.shape))
    try:
        with torch.no_grad():
            bundled(**batch)
    finally:
        handle.remove()
    assert seen == [torch.Size([*batch["input_ids"].shape, 384])]


def test_replacement_of_wrong_shape_is_refused(bundled, batch):
    with pytest.raises(ValueError, match="returned shape"):
        bundled.run_with_hooks(**batch, fwd_hooks=[("embed.hook_out", lambda t, h: t[:, :1])])


def test_fused_and_explicit_paths_agree_and_switch_only_when_needed(bundled, batch):
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        fused = bundled(**batch)
        hooked = bundled.run_with_hooks(**batch, fwd_hooks=[("blocks.3.attn.hook_scores", lambda t, h: None)])
    assert_close_across_kernels(fused[real], hooked[real])
    calls = []
    original = torch.nn.functional.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    torch.nn.functional.scaled_dot_product_attention = counting
    try:
        with torch.no_grad():
            bundled(**batch)
            n_plain = len(calls)
            bundled.run_with_cache(**batch, names_filter="blocks.1.attn.hook_pattern")
            n_one_hooked = len(calls) - n_plain
    finally:
        torch.nn.functional.scaled_dot_product_attention = original
    assert (n_plain, n_one_hooked) == (6, 5)  # only the hooked layer left the fused kernel


# ====================================================================== interventions
@pytest.mark.parametrize("layer, head", [(0, 0), (3, 7), (5, 11)])
def test_zero_ablation_equals_zeroing_w_o(bundled, batch, layer, head):
    with torch.no_grad():
        ablated = bundled.run_with_hooks(**batch, fwd_hooks=ablate_heads(bundled, {layer: [head]}, method="zero"))
        edited = copy.deepcopy(bundled)
        d = edited.config.d_head
        edited.blocks[layer].attn.out.weight[:, head * d : (head + 1) * d] = 0
        by_hand = edited(**batch)
        clean = bundled(**batch)
    assert_close_across_kernels(ablated, by_hand)
    assert (ablated - clean).abs().max() > 1e-3


def test_mean_and_uniform_ablation(bundled, batch):
    reference = mean_z(bundled, **batch)
    assert reference[2].shape == (12, 32)
    seen = {}

    def grab(name):
        return (name, lambda t, h: seen.__setitem__(h.name, t.clone()))

    hooks = ablate_heads(bundled, {2: [4]}, method="mean", reference=reference)
    hooks += ablate_heads(bundled, {1: [0, 5]}, method="uniform", attention_mask=batch["attention_mask"])
    with torch.no_grad():
        bundled.run_with_hooks(**batch, fwd_hooks=hooks + [grab("blocks.2.attn.hook_z"),
                                                           grab("blocks.1.attn.hook_pattern")])
    z = seen["blocks.2.attn.hook_z"]
    assert torch.equal(z[:, :, 4], reference[2][4].expand_as(z[:, :, 4]))
    pattern = seen["blocks.1.attn.hook_pattern"]
    n_real = batch["attention_mask"].sum(1).float()
    for i in range(len(SENTENCES)):
        row = pattern[i, 0, 0]
        assert torch.allclose(row[: int(n_real[i])], 1 / n_real[i]) and (row[int(n_real[i]) :] == 0).all()
    with pytest.raises(ValueError, match="reference"):
        ablate_heads(bundled, {0: [0]}, method="mean")
    with pytest.raises(ValueError, match="head 12 out of range"):
        ablate_heads(bundled, {0: [12]})


def test_patching_clean_into_corrupted_restores_clean(bundled, batch):
    corrupted = dict(batch)
    ids = batch["input_ids"].clone()
    ids[:, 2] = 2000  # same shape and mask, different tokens
    corrupted["input_ids"] = ids
    with torch.no_grad():
        clean, clean_cache = bundled.run_with_cache(**batch)
        dirty = bundled(**corrupted)
        assert (dirty - clean).abs().max() > 1e-2
        patched = bundled.run_with_hooks(**corrupted, fwd_hooks=patch_activation(bundled, None, clean_cache))
        assert torch.equal(patched, clean)
        # The residual stream is a complete state: any one layer's input restores the output. (Same kernels
        # as the source run, so the comparison is exact.)
        clean_fused, resid_cache = bundled.run_with_cache(**batch, names_filter="blocks.*.hook_resid_pre")
        for layer in range(6):
            restored = bundled.run_with_hooks(
                **corrupted, fwd_hooks=patch_activation(bundled, f"blocks.{layer}.hook_resid_pre", resid_cache)
            )
            assert torch.equal(restored, clean_fused), layer
        # patching every head's z in every layer, plus the residual path, also restores it exactly
        all_heads = {layer: list(range(12)) for layer in range(6)}
        heads_only = bundled.run_with_hooks(
            **corrupted,
            fwd_hooks=patch_heads(bundled, all_heads, clean_cache)
            + patch_activation(bundled, "embed.hook_out", clean_cache),
        )
        assert_close_across_kernels(heads_only, clean)


def test_patch_heads_touches_only_those_heads(bundled, batch):
    corrupted = dict(batch, input_ids=batch["input_ids"].flip(0))
    corrupted["attention_mask"] = batch["attention_mask"].flip(0)
    corrupted["token_type_ids"] = batch["token_type_ids"].flip(0)
    with torch.no_grad():
        _, clean_cache = bundled.run_with_cache(**batch, names_filter="blocks.1.attn.hook_z")
        _, dirty_cache = bundled.run_with_cache(**corrupted, names_filter="blocks.1.attn.hook_z")
        _, patched = bundled.run_with_cache(
            **corrupted, names_filter="blocks.1.attn.hook_z", fwd_hooks=patch_heads(bundled, {1: [2, 9]}, clean_cache)
        )
    z, clean_z, dirty_z = (c["blocks.1.attn.hook_z"] for c in (patched, clean_cache, dirty_cache))
    assert torch.equal(z[:, :, [2, 9]], clean_z[:, :, [2, 9]])
    others = [h for h in range(12) if h not in (2, 9)]
    assert torch.equal(z[:, :, others], dirty_z[:, :, others])


def test_head_gate_gradients_flow(bundled, batch):
    gate = torch.ones(12, requires_grad=True)
    out = bundled.run_with_hooks(**batch, fwd_hooks=[("blocks.4.attn.hook_z", lambda z, h: z * gate[:, None])])
    out.pow(2).sum().backward()
    assert gate.grad is not None and gate.grad.abs().sum() > 0
