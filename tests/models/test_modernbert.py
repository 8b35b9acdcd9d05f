"""ModernBERT: exact parity with transformers' ModernBert classes (eager, float32, CPU) on tiny random checkpoints
with sequences longer than the local window, the rotary/GeGLU hooks, and clear refusals."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import transformers
from bertscope.models.modernbert import ModernBertEncoder, rotary_tables
from fixtures_deberta_modernbert import TEXTS, assert_parity, save_tiny_modernbert
from helpers import assert_close_across_kernels

from bertscope import models

DOCS = Path(__file__).resolve().parents[2] / "docs" / "hooks.md"
LONG = [TEXTS[0] + " " + TEXTS[3], TEXTS[1]]  # 22 tokens vs a local window of 8 (|i - j| <= 4)


def _batch(model) -> dict[str, torch.Tensor]:
    enc = model.tokenizer(LONG, padding=True, return_tensors="pt")
    assert (enc["attention_mask"] == 0).any()
    assert enc["input_ids"].shape[1] > model.config.local_attention + 1
    return {k: enc[k] for k in ("input_ids", "attention_mask")}


@pytest.fixture(scope="module")
def mlm_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("modernbert_mlm")
    return folder, save_tiny_modernbert(folder, transformers.ModernBertForMaskedLM)


def test_model_parity_with_local_and_global_layers(tmp_path):
    hf = save_tiny_modernbert(tmp_path, transformers.ModernBertModel)
    ours = models.load(tmp_path)
    assert isinstance(ours, ModernBertEncoder)
    assert ours.config.layer_types == ("full_attention", "sliding_attention", "sliding_attention", "full_attention")
    assert ours.blocks[0].ln1.__class__.__name__ == "Identity"
    assert all(p.ndim > 1 or n.endswith("weight") for n, p in ours.named_parameters())  # no biases anywhere
    assert_parity(ours, hf, _batch(ours), final_norm=True)


def test_mlm_parity(mlm_dir):
    folder, hf = mlm_dir
    ours = models.load(folder)
    batch = _batch(ours)
    assert_parity(ours, hf, batch, hf_base=hf.model, final_norm=True)
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        torch.testing.assert_close(ours.mlm_logits(ours(**batch))[real], hf(**batch).logits[real], atol=1e-5, rtol=0)


def test_sequence_classification_checkpoint_loads_and_encoder_matches(tmp_path):
    hf = save_tiny_modernbert(tmp_path, transformers.ModernBertForSequenceClassification, num_labels=3)
    ours = models.load(tmp_path)
    assert ours.mlm_head is None
    assert_parity(ours, hf, _batch(ours), hf_base=hf.model, final_norm=True)


def test_biases_old_config_keys_and_other_window(tmp_path):
    hf = save_tiny_modernbert(tmp_path, transformers.ModernBertModel, attention_bias=True, mlp_bias=True,
                              norm_bias=True, local_attention=6, global_attn_every_n_layers=2,
                              local_rope_theta=500.0)
    cfg = json.loads((tmp_path / "config.json").read_text())
    # the checkpoints on the hub carry the pre-5.x keys instead of layer_types/rope_parameters
    for key in ("layer_types", "rope_parameters"):
        cfg.pop(key)
    cfg.update(global_attn_every_n_layers=2, global_rope_theta=160000.0, local_rope_theta=500.0)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    ours = models.load(tmp_path)
    assert ours.config.layer_types == ("full_attention", "sliding_attention") * 2
    assert ours.config.local_rope_theta == 500.0 and ours.blocks[1].attn.qkv.bias is not None
    assert_parity(ours, hf, _batch(ours), final_norm=True)


def test_fused_path_matches_explicit(mlm_dir):
    folder, _ = mlm_dir
    ours = models.load(folder)
    batch = _batch(ours)
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        fused = ours(**batch)
        ours.set_attention_impl("explicit")
        explicit = ours(**batch)
    assert_close_across_kernels(fused[real], explicit[real])


def test_local_layers_never_attend_outside_the_window(mlm_dir):
    folder, _ = mlm_dir
    ours = models.load(folder)
    with torch.no_grad():
        _, cache = ours.run_with_cache(**_batch(ours), names_filter="blocks.*.attn.hook_pattern")
    p = cache["blocks.1.attn.hook_pattern"].shape[-1]
    idx = torch.arange(p)
    outside = (idx[:, None] - idx[None, :]).abs() > ours.config.local_attention // 2
    # the first text is unpadded (a padded query far from every real key would see only masked keys)
    assert (cache["blocks.1.attn.hook_pattern"][0][..., outside] == 0).all()
    assert (cache["blocks.2.attn.hook_pattern"][0][..., outside] == 0).all()
    assert (cache["blocks.0.attn.hook_pattern"][0][..., outside] > 0).all()  # global layer, unpadded row


def test_rotation_is_relative():
    """Known answer: rotary q.k depends on positions only through their difference."""
    cos, sin = rotary_tables(12, 8, 10000.0, torch.device("cpu"))
    from bertscope.models.modernbert import rotate

    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)
    qs, ks = q.expand(1, 12, 1, 8), k.expand(1, 12, 1, 8)
    qr, kr = rotate(qs, cos, sin)[0, :, 0], rotate(ks, cos, sin)[0, :, 0]
    torch.testing.assert_close(qr[7] @ kr[4], qr[5] @ kr[2], atol=1e-5, rtol=0)
    torch.testing.assert_close(qr[0] @ kr[0], (q @ k.transpose(-1, -2)).squeeze(), atol=1e-5, rtol=0)


def test_every_hook_fires_and_mlp_hooks_mean_what_they_say(mlm_dir):
    folder, _ = mlm_dir
    ours = models.load(folder)
    with torch.no_grad():
        _, cache = ours.run_with_cache(**_batch(ours))
    assert list(cache) == [n for n in ours.hook_names() if not n.startswith("mlm_head.")]
    assert "blocks.0.ln1.hook_scale" not in cache and "blocks.1.ln1.hook_scale" in cache
    act = ours.blocks[2].mlp.act
    torch.testing.assert_close(act(cache["blocks.2.mlp.hook_pre"]) * cache["blocks.2.mlp.hook_gate"],
                               cache["blocks.2.mlp.hook_post"], atol=0, rtol=0)
    result = cache["blocks.3.attn.hook_result"].sum(2)
    torch.testing.assert_close(result, cache["blocks.3.hook_attn_out"], atol=1e-5, rtol=0)
    assert not torch.equal(cache["blocks.1.attn.hook_q"], cache["blocks.1.attn.hook_q_rot"])
    torch.testing.assert_close(cache["blocks.1.attn.hook_q"][:, 0], cache["blocks.1.attn.hook_q_rot"][:, 0])


def test_refusals(tmp_path):
    save_tiny_modernbert(tmp_path, transformers.ModernBertModel)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["rope_parameters"]["full_attention"]["rope_type"] = "linear"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="RoPE scaling"):
        models.load(tmp_path)


def test_docs_list_every_modernbert_hook(mlm_dir):
    folder, _ = mlm_dir
    ours = models.load(folder)
    section = DOCS.read_text().split("\n### ModernBERT")[1].split("\n## ")[0].split("\n### ")[0]
    documented = set(re.findall(r"`((?:embed|ln_final|blocks\.L|mlm_head)\.[a-z_0-9.]+)`", section))
    generic = {re.sub(r"^blocks\.\d+\.", "blocks.L.", n) for n in ours.hook_names()}
    assert generic <= documented, generic - documented
