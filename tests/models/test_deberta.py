"""DeBERTa-v2/v3: exact parity with transformers' DebertaV2 classes (eager, float32, CPU) on tiny random
checkpoints, the disentangled-attention hooks, and clear refusals."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import transformers
from bertscope.models.deberta import DebertaEncoder, log_bucket
from fixtures_deberta_modernbert import PAIRS, TEXTS, assert_parity, save_tiny_deberta
from helpers import assert_close_across_kernels

from bertscope import models

DOCS = Path(__file__).resolve().parents[2] / "docs" / "hooks.md"


def _batch(model, pairs: bool = True) -> dict[str, torch.Tensor]:
    enc = model.tokenizer(TEXTS[:2], PAIRS if pairs else None, padding=True, return_tensors="pt")
    assert (enc["attention_mask"] == 0).any()
    return {k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in enc}


@pytest.fixture(scope="module")
def mlm_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("deberta_mlm")
    hf = save_tiny_deberta(folder, transformers.DebertaV2ForMaskedLM, type_vocab_size=2)
    return folder, hf


def test_log_buckets_known_values():
    # mid = 4, max_position = 64: exact within +-4, then 4 + ceil(log(|r|/4) / log(63/4) * 3) with the sign
    rel = torch.tensor([0, 3, -3, 4, 5, 17, -17, 63, 100])
    assert log_bucket(rel, 8, 64).tolist() == [0, 3, -3, 4, 5, 6, -6, 7, 8]


def test_model_parity_padded_two_segments(tmp_path):
    hf = save_tiny_deberta(tmp_path, transformers.DebertaV2Model, type_vocab_size=2)
    ours = models.load(tmp_path)
    assert isinstance(ours, DebertaEncoder) and ours.mlm_head is None
    batch = _batch(ours)
    assert batch["token_type_ids"].max() == 1 and batch["input_ids"].shape[1] > 2 * 4  # beyond the exact buckets
    assert_parity(ours, hf, batch)


def test_mlm_parity_legacy_head(mlm_dir):
    folder, hf = mlm_dir
    ours = models.load(folder)
    batch = _batch(ours)
    assert_parity(ours, hf, batch, hf_base=hf.deberta)
    with torch.no_grad():
        want = hf(**batch).logits
        got = ours.mlm_logits(ours(**batch))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_mlm_parity_new_head(tmp_path):
    hf = save_tiny_deberta(tmp_path, transformers.DebertaV2ForMaskedLM, legacy=False)
    ours = models.load(tmp_path)
    batch = _batch(ours, pairs=False)
    with torch.no_grad():
        torch.testing.assert_close(ours.mlm_logits(ours(**batch)), hf(**batch).logits, atol=1e-5, rtol=0)


def test_sequence_classification_checkpoint_loads_and_encoder_matches(tmp_path):
    hf = save_tiny_deberta(tmp_path, transformers.DebertaV2ForSequenceClassification, num_labels=3)
    ours = models.load(tmp_path)
    assert ours.mlm_head is None and ours.config.type_vocab_size == 0
    batch = _batch(ours)  # v3 has no token types: the tokenizer's segment ids are ignored, as transformers does
    assert batch["token_type_ids"].max() == 1
    assert_parity(ours, hf, batch, hf_base=hf.deberta)


def test_random_encoder_builds_the_family():
    config = models.EncoderConfig.from_hf(dict(model_type="deberta-v2", hidden_size=16, num_hidden_layers=1,
                                               num_attention_heads=2, intermediate_size=32, vocab_size=50,
                                               relative_attention=True, pos_att_type="p2c|c2p"))
    model = models.random_encoder(config, seed=1)
    assert isinstance(model, DebertaEncoder) and config.pos_att_type == ("p2c", "c2p")
    assert model(torch.tensor([[1, 2, 3]])).shape == (1, 3, 16)


@pytest.mark.parametrize(
    "variant",
    [
        dict(share_att_key=False, pos_att_type=["c2p"], norm_rel_ebd="none", position_biased_input=True),
        dict(share_att_key=False, pos_att_type=["p2c", "c2p"], position_buckets=-1, max_relative_positions=5),
        dict(relative_attention=False, position_biased_input=True, pos_att_type=None),
        dict(max_relative_positions=-1),  # DeBERTa-v3's config.json: log buckets up to max_position_embeddings
    ],
    ids=["c2p-own-keys-abs-pos", "unbucketed-clamped", "no-relative", "buckets-max-relative-unset"],
)
def test_variants_match(tmp_path, variant):
    hf = save_tiny_deberta(tmp_path, transformers.DebertaV2Model, **variant)
    ours = models.load(tmp_path)
    assert _batch(ours, pairs=False)["input_ids"].shape[1] > 4 + 1  # offsets beyond the exact buckets (mid 4)
    assert_parity(ours, hf, _batch(ours, pairs=False))
    with torch.no_grad():
        ref = hf(**_batch(ours, pairs=False)).last_hidden_state
    ours.set_attention_impl("auto")
    real = _batch(ours, pairs=False)["attention_mask"].bool()
    with torch.no_grad():
        torch.testing.assert_close(ours(**_batch(ours, pairs=False))[real], ref[real], atol=1e-5, rtol=0)


def test_fused_path_matches_explicit_and_is_used_when_nothing_is_hooked(mlm_dir):
    folder, _ = mlm_dir
    ours = models.load(folder)
    batch = _batch(ours)
    real = batch["attention_mask"].bool()
    calls = []
    original = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    torch.nn.functional.scaled_dot_product_attention = spy
    try:
        with torch.no_grad():
            fused = ours(**batch)
            assert len(calls) == ours.config.n_layers
            ours.set_attention_impl("explicit")
            explicit = ours(**batch)
            assert len(calls) == ours.config.n_layers
    finally:
        torch.nn.functional.scaled_dot_product_attention = original
    assert_close_across_kernels(fused[real], explicit[real])


def test_score_terms_add_up_and_every_hook_fires(mlm_dir):
    folder, _ = mlm_dir
    ours = models.load(folder)
    batch = _batch(ours)
    with torch.no_grad():
        _, cache = ours.run_with_cache(**batch)
    assert list(cache) == [n for n in ours.hook_names() if not n.startswith("mlm_head.")]  # head: mlm_logits
    keep = batch["attention_mask"].bool()
    both = keep[:, None, :, None] & keep[:, None, None, :]
    b, p = batch["input_ids"].shape
    for layer in range(ours.config.n_layers):
        terms = sum(cache[f"blocks.{layer}.attn.hook_{t}"] for t in ("c2c", "c2p", "p2c"))
        torch.testing.assert_close(terms[both.expand_as(terms)],
                                   cache[f"blocks.{layer}.attn.hook_scores"][both.expand_as(terms)], atol=1e-6, rtol=0)
        assert cache[f"blocks.{layer}.attn.hook_pos_k"].shape == (16, 4, 8)
        result = cache[f"blocks.{layer}.attn.hook_result"]
        torch.testing.assert_close(result.sum(2) + ours.blocks[layer].attn.b_O,
                                   cache[f"blocks.{layer}.hook_attn_out"], atol=1e-5, rtol=0)
    assert cache["rel_embed.hook_out"].shape == (16, 32)
    assert cache["embed.hook_out"].shape == (b, p, 32)
    assert (cache["embed.hook_out"][~keep] == 0).all()  # DeBERTa zeroes padding rows of the embeddings


def test_zeroing_the_position_terms_leaves_content_attention(mlm_dir):
    """Known answer: with c2p and p2c replaced by zeros, layer 0's scores are exactly the hooked c2c term."""
    folder, _ = mlm_dir
    ours = models.load(folder)
    batch = _batch(ours, pairs=False)
    zero = [(f"blocks.0.attn.hook_{t}", lambda x, hook: torch.zeros_like(x)) for t in ("c2p", "p2c")]
    with torch.no_grad():
        _, cache = ours.run_with_cache(**batch, fwd_hooks=zero, names_filter=["blocks.0.attn.hook_c2c",
                                                                              "blocks.0.attn.hook_scores"])
    real = batch["attention_mask"].bool()[:, None, :, None] & batch["attention_mask"].bool()[:, None, None, :]
    real = real.expand_as(cache["blocks.0.attn.hook_c2c"])
    assert torch.equal(cache["blocks.0.attn.hook_scores"][real], cache["blocks.0.attn.hook_c2c"][real])


def test_refusals(tmp_path):
    hf = save_tiny_deberta(tmp_path, transformers.DebertaV2Model)
    del hf
    cfg = json.loads((tmp_path / "config.json").read_text())
    for change, message in [({"conv_kernel_size": 3}, "conv layer"), ({"embedding_size": 16}, "embedding_size")]:
        (tmp_path / "config.json").write_text(json.dumps({**cfg, **change}))
        with pytest.raises(ValueError, match=message):
            models.load(tmp_path)


def test_docs_list_every_deberta_hook(mlm_dir):
    folder, _ = mlm_dir
    ours = models.load(folder)
    section = DOCS.read_text().split("\n### DeBERTa-v2/v3")[1].split("\n## ")[0].split("\n### ")[0]
    documented = set(re.findall(r"`((?:embed|rel_embed|blocks\.L|mlm_head)\.[a-z_0-9.]+)`", section))
    generic = {re.sub(r"^blocks\.\d+\.", "blocks.L.", n) for n in ours.hook_names()}
    assert generic <= documented, generic - documented


def test_relative_rows_reached_by_the_sequence(mlm_dir):
    """Known answer: 8 buckets (span 8, mid 4), max_relative_positions 64: a length-n sequence reaches offsets
    bucket(+-(n-1)), so rows span - bucket(n-1) .. span + bucket(n-1) of the 16; the unhooked forward projects only
    those, and observing hook_pos_k/hook_pos_q (which see all 16 rows) changes nothing."""
    folder, _ = mlm_dir
    ours = models.load(folder)
    x = torch.zeros(1, 3, ours.config.d_model)
    assert ours.context(x, None).rows == slice(6, 11)  # offsets -2..2
    x = torch.zeros(1, 18, ours.config.d_model)  # bucket(17) = 6 (test_log_buckets_known_values)
    ctx = ours.context(x, None)
    assert ctx.rows == slice(2, 15) and int(ctx.c2p_index.min()) == 0 and int(ctx.c2p_index.max()) == 12
    batch = _batch(ours)
    seen = []
    with torch.no_grad():
        plain = ours(**batch)
        with ours.hooks([("blocks.*.attn.hook_pos_[kq]", lambda t, hook: seen.append(t.shape))]):
            observed = ours(**batch)
    assert seen == [(16, 4, 8)] * 2 * ours.config.n_layers
    torch.testing.assert_close(observed, plain, atol=1e-6, rtol=0)
