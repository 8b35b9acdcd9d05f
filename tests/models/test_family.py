"""RoBERTa, XLM-RoBERTa, DistilBERT, ALBERT and ELECTRA: the from-scratch encoder reproduces transformers' own
classes (eager attention, float32, CPU) on tiny random checkpoints, each with its own kind of tokenizer."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from bertscope.models import CheckpointError, EncoderConfig
from family_fixtures import FAMILIES, TRAINING_TEXT, base_model, save_tiny_family

from bertscope import models

HIDDEN_TOL, ATTN_TOL = 1e-5, 1e-6
PAIR = ("Where is the station?", "It is two blocks north of the old cathedral.")


def family_batch(family: str, tokenizer, padding_side: str = "right") -> dict[str, torch.Tensor]:
    """Four sentences of different lengths (so padding) plus one two-segment pair, in the family's own format;
    token types only for families that have them."""
    tokenizer.padding_side = padding_side
    segments = FAMILIES[family].segments
    enc = tokenizer(TRAINING_TEXT[:4], padding=True, return_tensors="pt")
    pair = tokenizer(*PAIR, return_tensors="pt", return_token_type_ids=True)
    n = max(enc["input_ids"].shape[1], pair["input_ids"].shape[1])

    def pad(t: torch.Tensor, value: int) -> torch.Tensor:
        width = (0, n - t.shape[1]) if padding_side == "right" else (n - t.shape[1], 0)
        return torch.nn.functional.pad(t, width, value=value)

    out = {
        "input_ids": torch.cat([pad(enc["input_ids"], tokenizer.pad_token_id),
                                pad(pair["input_ids"], tokenizer.pad_token_id)]),
        "attention_mask": torch.cat([pad(enc["attention_mask"], 0), pad(pair["attention_mask"], 0)]),
    }
    if segments:
        types = torch.zeros_like(enc["input_ids"])
        out["token_type_ids"] = torch.cat([pad(types, 0), pad(pair["token_type_ids"], 0)])
        assert out["token_type_ids"].max() == 1
    assert (out["attention_mask"] == 0).any()
    return out


def assert_family_parity(ours: models.Encoder, ref: torch.nn.Module, batch: dict[str, torch.Tensor]) -> None:
    """Every layer's hidden state within HIDDEN_TOL, every attention probability (real queries and keys) within
    ATTN_TOL, and the plain (fused, unhooked) forward too."""
    names = ["embed.hook_out", "blocks.*.hook_resid_post", "blocks.*.attn.hook_pattern"]
    with torch.no_grad():
        last, cache = ours.run_with_cache(**batch, names_filter=names)
        expected = ref(**batch, output_attentions=True, output_hidden_states=True)
        plain = ours(**batch)
    real = batch["attention_mask"].bool()
    n_layers = ours.config.n_layers
    assert len(expected.hidden_states) == n_layers + 1 and len(expected.attentions) == n_layers
    torch.testing.assert_close(cache["embed.hook_out"][real], expected.hidden_states[0][real], atol=HIDDEN_TOL,
                               rtol=0)
    rows = (real[:, None, :, None] & real[:, None, None, :]).expand_as(expected.attentions[0])
    for layer in range(n_layers):
        torch.testing.assert_close(cache[f"blocks.{layer}.hook_resid_post"][real],
                                   expected.hidden_states[layer + 1][real], atol=HIDDEN_TOL, rtol=0)
        torch.testing.assert_close(cache[f"blocks.{layer}.attn.hook_pattern"][rows], expected.attentions[layer][rows],
                                   atol=ATTN_TOL, rtol=0)
    torch.testing.assert_close(last[real], expected.last_hidden_state[real], atol=HIDDEN_TOL, rtol=0)
    torch.testing.assert_close(plain[real], expected.last_hidden_state[real], atol=HIDDEN_TOL, rtol=0)


def _load(family: str, tmp_path, head: str = "base", **overrides):
    folder = tmp_path / f"{family}-{head}"
    ref = save_tiny_family(family, folder, head, **overrides)
    ours = models.load(folder)
    return ours, ref, folder


# ====================================================================== parity per family and head class
@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("head", ["base", "mlm", "seqcls"])
def test_family_parity(tmp_path, family, head):
    ours, ref, _ = _load(family, tmp_path, head)
    assert ours.config.model_type == family
    batch = family_batch(family, ours.tokenizer)
    assert_family_parity(ours, base_model(family, ref), batch)
    if head == "mlm":
        with torch.no_grad():
            logits = ours.mlm_logits(ours(**batch))
            ref_logits = ref(**batch).logits
        real = batch["attention_mask"].bool()
        torch.testing.assert_close(logits[real], ref_logits[real], atol=HIDDEN_TOL, rtol=0)
    else:
        assert ours.mlm_head is None
        with pytest.raises(RuntimeError, match="masked-LM head"):
            ours.mlm_logits(torch.zeros(1, 2, ours.config.d_model))


_MLM_HEAD_PARTS = {  # (dense, LayerNorm) of each family's masked-LM head in transformers
    "roberta": ("lm_head.dense", "lm_head.layer_norm"),
    "xlm-roberta": ("lm_head.dense", "lm_head.layer_norm"),
    "distilbert": ("vocab_transform", "vocab_layer_norm"),
    "albert": ("predictions.dense", "predictions.LayerNorm"),
    "electra": ("generator_predictions.dense", "generator_predictions.LayerNorm"),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_mlm_head_activation_is_the_familys(tmp_path, family):
    """With the tanh GELU in the layers, RoBERTa's/XLM-R's/ELECTRA's heads still use the exact GELU while DistilBERT's
    and ALBERT's follow the layers' activation. Large head weights make the two GELUs distinguishable: the
    head's normalised activations must agree within HIDDEN_TOL (the two GELUs differ by ~1e-4 here)."""
    act = {"activation": "gelu_new"} if family == "distilbert" else {"hidden_act": "gelu_new"}
    ours, ref, _ = _load(family, tmp_path, "mlm", **act)
    dense_name, ln_name = _MLM_HEAD_PARTS[family]
    big = torch.randn(ours.mlm_head.dense.weight.shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours.mlm_head.dense.weight.copy_(big)
        ref.get_submodule(dense_name).weight.copy_(big)
    captured = {}

    def grab(module, inputs, output):
        x = inputs[0]
        captured["ref"] = (x - x.mean(-1, keepdim=True)) / (x.var(-1, unbiased=False, keepdim=True) + module.eps).sqrt()

    batch = family_batch(family, ours.tokenizer)
    real = batch["attention_mask"].bool()
    handle = ref.get_submodule(ln_name).register_forward_hook(grab)
    try:
        with torch.no_grad(), ours.hooks([("mlm_head.ln.hook_normalized", lambda t, h: captured.update(ours=t))]):
            ours.mlm_logits(ours(**batch))
            ref(**batch)
    finally:
        handle.remove()
    torch.testing.assert_close(captured["ours"][real], captured["ref"][real], atol=HIDDEN_TOL, rtol=0)


@pytest.mark.parametrize("family", ["albert", "electra"])
def test_pretraining_checkpoints_load(tmp_path, family):
    """ALBERT's *ForPreTraining (MLM + sentence order) and ELECTRA's discriminator (*ForPreTraining)."""
    ours, ref, _ = _load(family, tmp_path, "pretraining")
    batch = family_batch(family, ours.tokenizer)
    assert_family_parity(ours, base_model(family, ref), batch)
    if family == "albert":
        with torch.no_grad():
            logits, ref_logits = ours.mlm_logits(ours(**batch)), ref(**batch).prediction_logits
        real = batch["attention_mask"].bool()
        torch.testing.assert_close(logits[real], ref_logits[real], atol=HIDDEN_TOL, rtol=0)
    else:
        assert ours.mlm_head is None  # the discriminator has no MLM head


@pytest.mark.parametrize("family", ["roberta", "xlm-roberta"])
def test_roberta_positions_are_padding_aware(tmp_path, family):
    """Left padding: real tokens still count from pad_token_id + 1 (transformers' create_position_ids...)."""
    ours, ref, _ = _load(family, tmp_path)
    batch = family_batch(family, ours.tokenizer, padding_side="left")
    assert batch["attention_mask"][:, 0].eq(0).any()
    assert_family_parity(ours, ref, batch)
    pad = ours.config.pad_token_id
    ids = torch.tensor([[0, 7, 8, 2, pad, pad]])
    with torch.no_grad():
        _, cache = ours.run_with_cache(ids, names_filter="embed.hook_pos")
    expected = ours.W_pos[torch.tensor([pad + 1, pad + 2, pad + 3, pad + 4, pad, pad])]
    torch.testing.assert_close(cache["embed.hook_pos"][0], expected, atol=0, rtol=0)
    assert ours.config.max_length == ours.config.max_positions - pad - 1
    with pytest.raises(ValueError, match="exceeds the position table"):
        ours(torch.full((1, ours.config.max_length + 1), 5))


def test_sentence_transformers_folder_of_another_family(tmp_path):
    inner = tmp_path / "st" / "0_Transformer"
    ref = save_tiny_family("roberta", inner)
    (tmp_path / "st" / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "0_Transformer", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]))
    ours = models.load(tmp_path / "st")
    assert_family_parity(ours, ref, family_batch("roberta", ours.tokenizer))


def test_from_hf_model_in_memory(tmp_path):
    ref = save_tiny_family("electra", tmp_path / "e")
    ours = models.from_hf_model(ref)
    assert_family_parity(ours, ref, family_batch("electra", models.load(tmp_path / "e").tokenizer))


# ====================================================================== architecture specifics
def test_electra_without_projection_when_sizes_match(tmp_path):
    ours, ref, _ = _load("electra", tmp_path, "mlm", embedding_size=32)
    assert ours.config.d_embed is None and ours.embed.proj is None
    assert "embed.hook_proj_in" not in ours.hook_names()
    batch = family_batch("electra", ours.tokenizer)
    assert_family_parity(ours, ref.electra, batch)
    with torch.no_grad():
        torch.testing.assert_close(ours.mlm_logits(ours(**batch)), ref(**batch).logits, atol=HIDDEN_TOL, rtol=0)


@pytest.mark.parametrize("family", ["albert", "electra"])
def test_embedding_projection_hook(tmp_path, family):
    """``embed.hook_proj_in`` is the normalised d_embed-wide embedding; ``embed.hook_out`` its projection."""
    ours, _, _ = _load(family, tmp_path)
    assert ours.config.d_embed == 16
    batch = family_batch(family, ours.tokenizer)
    with torch.no_grad():
        _, cache = ours.run_with_cache(**batch, names_filter=["embed.hook_proj_in", "embed.hook_out"])
    assert cache["embed.hook_proj_in"].shape[-1] == 16 and cache["embed.hook_out"].shape[-1] == 32
    torch.testing.assert_close(ours.embed.proj(cache["embed.hook_proj_in"]), cache["embed.hook_out"])
    # replacing it changes what block 0 sees
    with torch.no_grad():
        zeroed = ours.run_with_hooks(**batch, fwd_hooks=[("embed.hook_proj_in", lambda t, h: torch.zeros_like(t))])
        _, c2 = ours.run_with_cache(**batch, names_filter="embed.hook_out",
                                    fwd_hooks=[("embed.hook_proj_in", lambda t, h: torch.zeros_like(t))])
    assert not torch.allclose(zeroed, ours(**batch))
    torch.testing.assert_close(c2["embed.hook_out"], ours.embed.proj.bias.expand_as(c2["embed.hook_out"]))


def test_albert_shares_weights_but_hooks_are_per_layer(tmp_path):
    ours, ref, _ = _load("albert", tmp_path)
    assert ours.config.layer_groups == 1
    blocks = ours.blocks
    assert all(b.attn.qkv.weight is blocks[0].attn.qkv.weight for b in blocks)
    assert all(b.ln2.weight is blocks[0].ln2.weight for b in blocks)
    assert ours.n_params() == sum(p.numel() for p in ref.parameters())
    for layer in range(ours.config.n_layers):
        assert f"blocks.{layer}.attn.hook_pattern" in ours.hook_names()
    # a hook on layer 1 fires once and changes layers 1.. only
    batch = family_batch("albert", ours.tokenizer)
    calls = []

    def zero_heads(t, hook):
        calls.append(hook.name)
        return torch.zeros_like(t)

    with torch.no_grad():
        _, clean = ours.run_with_cache(**batch, names_filter="blocks.*.hook_resid_post")
        _, dirty = ours.run_with_cache(**batch, names_filter="blocks.*.hook_resid_post",
                                       fwd_hooks=[("blocks.1.attn.hook_z", zero_heads)])
    assert calls == ["blocks.1.attn.hook_z"]
    torch.testing.assert_close(dirty["blocks.0.hook_resid_post"], clean["blocks.0.hook_resid_post"], atol=0, rtol=0)
    assert not torch.allclose(dirty["blocks.1.hook_resid_post"], clean["blocks.1.hook_resid_post"])


def test_albert_layer_groups(tmp_path):
    """num_hidden_groups=2 over 4 layers: layers 0-1 use group 0, layers 2-3 group 1 (transformers' rule)."""
    ours, ref, _ = _load("albert", tmp_path, num_hidden_layers=4, num_hidden_groups=2)
    b = ours.blocks
    assert b[1].attn.qkv.weight is b[0].attn.qkv.weight and b[3].mlp.fc_in.weight is b[2].mlp.fc_in.weight
    assert b[2].attn.qkv.weight is not b[0].attn.qkv.weight
    assert_family_parity(ours, ref, family_batch("albert", ours.tokenizer))


def test_albert_inner_groups_are_refused():
    with pytest.raises(ValueError, match="inner_group_num"):
        EncoderConfig.from_hf({**FAMILIES["albert"].config_cls(inner_group_num=2).to_dict()})


def test_distilbert_has_no_token_types(tmp_path):
    ours, ref, _ = _load("distilbert", tmp_path)
    assert ours.W_type is None and "embed.hook_type" not in ours.hook_names()
    assert "token_type_ids" not in ours.tokenize(*PAIR)
    batch = family_batch("distilbert", ours.tokenizer)
    with torch.no_grad():  # segment ids (from a BERT-style tokenizer) are not an input of DistilBERT
        torch.testing.assert_close(ours(**batch, token_type_ids=torch.ones_like(batch["input_ids"])), ours(**batch))


def test_hook_names_are_shared_across_families(tmp_path):
    """Every family has the BERT hook names per block; only the embedding hooks differ (type, projection)."""
    names = {}
    for family in FAMILIES:
        ours, _, _ = _load(family, tmp_path)
        names[family] = set(ours.hook_names())
    block = {n for n in names["roberta"] if n.startswith("blocks.")}
    assert {"blocks.0.attn.hook_pattern", "blocks.2.attn.hook_z", "blocks.1.attn.hook_result",
            "blocks.0.hook_resid_pre", "blocks.0.hook_resid_mid", "blocks.0.hook_resid_post",
            "blocks.0.ln1.hook_scale", "blocks.0.ln2.hook_normalized"} <= block
    for family, got in names.items():
        assert {n for n in got if n.startswith("blocks.")} == block, family
    assert "embed.hook_proj_in" in names["albert"] and "embed.hook_proj_in" not in names["roberta"]
    assert "embed.hook_type" in names["electra"] and "embed.hook_type" not in names["distilbert"]


def test_special_token_ids_come_from_the_tokenizer(tmp_path):
    roberta, _, _ = _load("roberta", tmp_path)
    assert roberta.special_token_ids["cls"] == roberta.tokenizer.convert_tokens_to_ids("<s>")
    assert roberta.special_token_ids["sep"] == roberta.tokenizer.convert_tokens_to_ids("</s>")
    assert roberta.special_token_ids["pad"] == roberta.config.pad_token_id == 1
    albert, _, _ = _load("albert", tmp_path)
    assert albert.special_token_ids["cls"] == albert.tokenizer.convert_tokens_to_ids("[CLS]")
    assert albert.special_token_ids["pad"] == albert.config.pad_token_id == 0


# ====================================================================== errors
def test_unsupported_model_type_lists_the_supported_ones():
    with pytest.raises(ValueError, match=r"model_type='gpt2'.*albert.*bert.*distilbert.*electra.*roberta"):
        EncoderConfig.from_hf({"model_type": "gpt2"})


def test_wrong_family_tensor_is_named(tmp_path):
    """A RoBERTa checkpoint whose config claims DistilBERT: the keys are named, not silently dropped."""
    folder = tmp_path / "r"
    save_tiny_family("roberta", folder)
    cfg = FAMILIES["distilbert"].config_cls(vocab_size=400, dim=32, n_layers=3, n_heads=4, hidden_dim=64,
                                            max_position_embeddings=66)
    shutil.copy(folder / "config.json", folder / "roberta.json")
    (folder / "config.json").write_text(cfg.to_json_string())
    with pytest.raises(CheckpointError, match=r"encoder\.layer\.0\.attention\.self\.query\.weight"):
        models.load(folder)


def test_missing_distilbert_projection_is_named(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "d"
    save_tiny_family("distilbert", folder)
    state = load_file(str(folder / "model.safetensors"))
    state.pop("transformer.layer.1.attention.k_lin.bias")
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"transformer\.layer\.1\.attention\.k_lin\.bias"):
        models.load(folder)
