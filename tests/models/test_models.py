"""The from-scratch encoder reproduces transformers' BertModel, loads checkpoints loudly, and its variants
compute what their definitions say."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from bertscope.models import CheckpointError, EncoderConfig
from helpers import BUNDLED, assert_close_across_kernels, assert_float32_close, save_tiny_bert
from safetensors.torch import load_file, save_file

from bertscope import models

SENTENCES = [
    "The cat sat on the mat.",
    "Interpretability researchers probe attention heads, layer by layer, with linear classifiers.",
    "A dog!",
    "Tokenization splits unbelievably uncommon words into several wordpieces.",
]
PAIR = ("Where is the station?", "It is two blocks north of the old cathedral.")


def padded_batch(tokenizer) -> dict[str, torch.Tensor]:
    """Varied lengths (so padding), plus one two-segment pair."""
    enc = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    pair = tokenizer(*PAIR, return_tensors="pt")
    n = max(enc["input_ids"].shape[1], pair["input_ids"].shape[1])

    def pad(t: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.pad(t, (0, n - t.shape[1]))

    out = {k: torch.cat([pad(enc[k]), pad(pair[k])]) for k in ("input_ids", "attention_mask", "token_type_ids")}
    assert out["token_type_ids"].max() == 1 and (out["attention_mask"] == 0).any()
    return out


def assert_parity(ours: models.Encoder, ref, batch: dict[str, torch.Tensor]):
    """Hidden states and attention probabilities over real tokens equal transformers' up to float32 summation
    order: the policy of tests/helpers.py (summation length d_model, depth in layers, probabilities at scale 1)."""
    names = ["embed.hook_out", "blocks.*.hook_resid_post", "blocks.*.attn.hook_pattern"]
    with torch.no_grad():
        last, cache = ours.run_with_cache(**batch, names_filter=names)
        expected = ref(**batch, output_attentions=True, output_hidden_states=True)
    real = batch["attention_mask"].bool()
    d, n_layers = ours.config.d_model, ours.config.n_layers
    assert len(expected.hidden_states) == n_layers + 1
    assert_float32_close(cache["embed.hook_out"][real], expected.hidden_states[0][real], terms=d)
    for layer in range(n_layers):
        got = cache[f"blocks.{layer}.hook_resid_post"][real]
        assert_float32_close(got, expected.hidden_states[layer + 1][real], terms=d, depth=layer + 2,
                             msg=f"hidden state after block {layer}")
        pattern, ref_pattern = cache[f"blocks.{layer}.attn.hook_pattern"], expected.attentions[layer]
        rows = real[:, None, :, None] & real[:, None, None, :]  # real queries x real keys
        rows = rows.expand_as(pattern)
        assert_float32_close(pattern[rows], ref_pattern[rows], terms=d, depth=layer + 1, scale=1.0,
                             msg=f"attention probabilities, layer {layer}")
    assert_float32_close(last[real], expected.last_hidden_state[real], terms=d, depth=n_layers + 1)
    # The plain forward (fused attention kernel, nothing hooked) agrees too.
    with torch.no_grad():
        plain = ours(**batch)
    assert_float32_close(plain[real], expected.last_hidden_state[real], terms=d, depth=n_layers + 1)


# ====================================================================== parity
def test_bundled_parity(bundled, hf_bundled, tokenizer):
    assert_parity(bundled, hf_bundled, padded_batch(tokenizer))


def test_bundled_pooler_parity(bundled, hf_bundled, tokenizer):
    batch = padded_batch(tokenizer)
    with torch.no_grad():
        ours = bundled.pool(bundled(**batch))
        ref = hf_bundled(**batch).pooler_output
    assert_float32_close(ours, ref, terms=bundled.config.d_model, depth=bundled.config.n_layers + 2)


def test_random_bert_base_parity(tokenizer):
    torch.manual_seed(0)
    cfg = transformers.BertConfig()  # bert-base shape: 12 layers, 12 heads, 768
    ref = transformers.BertModel._from_config(cfg, attn_implementation="eager").eval()
    ours = models.from_hf_model(ref)
    assert (ours.config.n_layers, ours.config.n_heads, ours.config.d_model) == (12, 12, 768)
    assert_parity(ours, ref, padded_batch(tokenizer))


def save_tiny(tmp_path: Path, cls=transformers.BertModel, seed=0, **kw) -> tuple[Path, torch.nn.Module]:
    folder = tmp_path / cls.__name__
    shape = dict(hidden_size=48, num_hidden_layers=3, num_attention_heads=6, intermediate_size=96,
                 max_position_embeddings=64)
    return folder, save_tiny_bert(folder, cls, seed, **{**shape, **kw})


@pytest.mark.parametrize(
    "cls", [transformers.BertModel, transformers.BertForMaskedLM, transformers.BertForPreTraining,
            transformers.BertForSequenceClassification],
)
def test_tiny_checkpoints_load_and_match(tmp_path, tokenizer, cls):
    folder, ref = save_tiny(tmp_path, cls)
    ours = models.load(folder)
    assert ours.tokenizer is not None and not ours.training
    bert = ref.bert if hasattr(ref, "bert") else ref
    assert_parity(ours, bert, padded_batch(tokenizer))
    if cls in (transformers.BertForMaskedLM, transformers.BertForPreTraining):
        batch = padded_batch(tokenizer)
        with torch.no_grad():
            logits = ours.mlm_logits(ours(**batch))
            ref_out = ref(**batch)
        ref_logits = ref_out.logits if cls is transformers.BertForMaskedLM else ref_out.prediction_logits
        real = batch["attention_mask"].bool()
        assert_float32_close(logits[real], ref_logits[real], terms=48, depth=ours.config.n_layers + 2)
    else:
        with pytest.raises(RuntimeError, match="masked-LM head"):
            ours.mlm_logits(torch.zeros(1, 2, 48))


def test_gelu_tanh_variant_parity(tmp_path, tokenizer):
    folder, ref = save_tiny(tmp_path, hidden_act="gelu_new")
    assert_parity(models.load(folder), ref, padded_batch(tokenizer))


def test_sentence_transformers_layout(tmp_path, tokenizer):
    inner, ref = save_tiny(tmp_path)
    outer = tmp_path / "st-model"
    shutil.copytree(inner, outer / "0_Transformer")
    (outer / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "0_Transformer", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]))
    assert_parity(models.load(outer), ref, padded_batch(tokenizer))


def test_bundled_is_default_and_described(bundled):
    cfg = bundled.config
    assert (cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.d_mlp, cfg.vocab_size) == (6, 12, 384, 1536, 30522)
    assert bundled.source.startswith("bundled:") and not bundled.training
    assert len(bundled.weights_sha256) == 64
    state = load_file(str(BUNDLED / "model.safetensors"))
    n_expected = sum(t.numel() for k, t in state.items() if "position_ids" not in k)
    assert bundled.n_params() == n_expected


def test_random_encoder_is_deterministic(tiny_config):
    a, b = models.random_encoder(tiny_config, seed=3), models.random_encoder(tiny_config, seed=3)
    c = models.random_encoder(tiny_config, seed=4)
    ids = torch.randint(0, 30522, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(a(ids), b(ids)) and not torch.equal(a(ids), c(ids))


# ====================================================================== dropout
def test_dropout_matches_bert_in_train_mode_and_is_off_in_eval(tmp_path, tokenizer):
    folder, ref = save_tiny(tmp_path, hidden_dropout_prob=0.3, attention_probs_dropout_prob=0.2)
    ours = models.load(folder)
    batch = padded_batch(tokenizer)
    ref.train()
    ours.train()
    torch.manual_seed(123)
    expected = ref(**batch).last_hidden_state
    torch.manual_seed(123)
    got = ours(**batch)
    real = batch["attention_mask"].bool()
    assert_float32_close(got[real], expected[real], terms=48, depth=4)  # same masks, same places
    torch.manual_seed(7)
    assert not torch.allclose(ours(**batch)[real], got[real])  # dropout really is active in train mode
    ours.eval()
    with torch.no_grad():
        assert torch.equal(ours(**batch), ours(**batch))


# ====================================================================== errors
@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(input_ids=torch.zeros(3, dtype=torch.long)), ValueError, "2-D"),
        (dict(input_ids=torch.zeros(1, 3)), TypeError, "integer"),
        (dict(input_ids=torch.zeros(1, 513, dtype=torch.long)), ValueError, "exceeds the position table"),
        (dict(input_ids=torch.full((1, 3), 30522)), ValueError, "token ids must be in"),
        (dict(input_ids=torch.full((1, 3), -1)), ValueError, "token ids must be in"),
        (dict(input_ids=torch.zeros(2, 3, dtype=torch.long), attention_mask=torch.ones(2, 4)), ValueError, "shape"),
        (dict(input_ids=torch.zeros(1, 3, dtype=torch.long), attention_mask=torch.full((1, 3), 2)), ValueError, "0"),
        (dict(input_ids=torch.zeros(1, 3, dtype=torch.long), token_type_ids=torch.full((1, 3), 2)), ValueError,
         "token_type_ids"),
        (dict(input_ids=torch.zeros(1, 3, dtype=torch.long), token_type_ids=torch.zeros(1, 2, dtype=torch.long)),
         ValueError, "shape"),
    ],
)
def test_bad_inputs_raise_clear_errors(bundled, kwargs, error, match):
    with pytest.raises(error, match=match):
        bundled(**kwargs)


def test_stop_at_layer_range(bundled):
    with pytest.raises(ValueError, match="stop_at_layer"):
        bundled(torch.zeros(1, 3, dtype=torch.long), stop_at_layer=6)


def _copy_checkpoint(tmp_path: Path, edit) -> Path:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        shutil.copy(BUNDLED / name, folder / name)
    state = load_file(str(BUNDLED / "model.safetensors"))
    edit(state)
    save_file(state, str(folder / "model.safetensors"))
    return folder


def test_missing_tensor_is_named(tmp_path):
    folder = _copy_checkpoint(tmp_path, lambda s: s.pop("encoder.layer.2.output.dense.weight"))
    with pytest.raises(CheckpointError, match=r"missing.*blocks\.2\.mlp\.fc_out\.weight"):
        models.load(folder)


def test_missing_qkv_part_is_named(tmp_path):
    folder = _copy_checkpoint(tmp_path, lambda s: s.pop("encoder.layer.1.attention.self.key.bias"))
    with pytest.raises(CheckpointError, match=r"encoder\.layer\.1\.attention\.self\.key\.bias"):
        models.load(folder)


def test_unexpected_tensor_is_named(tmp_path):
    folder = _copy_checkpoint(tmp_path, lambda s: s.__setitem__("encoder.layer.0.adapter.weight", torch.zeros(2)))
    with pytest.raises(CheckpointError, match=r"encoder\.layer\.0\.adapter\.weight"):
        models.load(folder)


def test_misshaped_tensor_is_named(tmp_path):
    folder = _copy_checkpoint(
        tmp_path, lambda s: s.__setitem__("embeddings.LayerNorm.weight", torch.ones(100))
    )
    with pytest.raises(CheckpointError, match=r"wrong shapes.*embed\.ln\.weight"):
        models.load(folder)


def test_missing_folder_and_uncached_hub_id(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="no such model folder"):
        models.load(tmp_path / "nope" / "model")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    with pytest.raises(FileNotFoundError, match="never downloads"):
        models.load("some-org/not-a-cached-model")


def test_hub_id_loads_from_local_cache(tmp_path, monkeypatch):
    """A hub id resolves to a snapshot already in the local cache, without any network access."""
    hub = tmp_path / "hub"
    snapshot = hub / "models--local--tiny-bert" / "snapshots" / ("0" * 40)
    folder, ref = save_tiny(tmp_path)
    shutil.copytree(folder, snapshot)
    (hub / "models--local--tiny-bert" / "refs").mkdir()
    (hub / "models--local--tiny-bert" / "refs" / "main").write_text("0" * 40)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub))
    ours = models.load("local/tiny-bert")
    ids = torch.tensor([[101, 2023, 2003, 102]])
    with torch.no_grad():
        assert_float32_close(ours(ids), ref(ids).last_hidden_state, terms=48, depth=4)


def test_folder_without_weights(tmp_path):
    shutil.copy(BUNDLED / "config.json", tmp_path / "config.json")
    with pytest.raises(FileNotFoundError, match="no weights"):
        models.load(tmp_path)


def test_non_bert_config_is_refused():
    with pytest.raises(ValueError, match="model_type"):
        EncoderConfig.from_hf({"model_type": "gpt2"})


# ====================================================================== dtypes and kernels
def test_half_precision_runs(bundled, tokenizer):
    batch = padded_batch(tokenizer)
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        ref = bundled(**batch)[real]
        for dtype in (torch.bfloat16, torch.float16):
            half = models.load(dtype=dtype)
            assert half.dtype == dtype
            out = half(**batch)[real].float()
            assert torch.isfinite(out).all()
            cos = torch.nn.functional.cosine_similarity(out, ref, dim=-1)
            assert cos.min() > 0.98, (dtype, cos.min())


def test_fused_and_explicit_attention_agree(bundled, tokenizer):
    batch = padded_batch(tokenizer)
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        fused = bundled(**batch)
        bundled.set_attention_impl("explicit")
        try:
            explicit = bundled(**batch)
        finally:
            bundled.set_attention_impl("auto")
    assert_close_across_kernels(fused[real], explicit[real])


# ====================================================================== variants
def test_sinusoidal_table_is_the_closed_form():
    table = models.sinusoidal_table(50, 16)
    for p in range(50):
        for i in range(8):
            angle = p / 10000 ** (2 * i / 16)
            assert table[p, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[p, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)
    model = models.random_encoder(EncoderConfig(d_model=16, n_layers=1, n_heads=2, d_mlp=32, max_positions=50,
                                                position_encoding="sinusoidal"))
    assert torch.equal(model.W_pos, table)
    assert not any("pos" in name for name, _ in model.named_parameters())  # fixed, not learned


def test_pre_ln_block_computes_its_definition():
    cfg = EncoderConfig(d_model=32, n_layers=2, n_heads=4, d_mlp=64, norm_placement="pre")
    model = models.random_encoder(cfg, seed=1)
    block = model.blocks[0]
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        mid = x + block.attn(block.ln1(x), None)
        expected = mid + block.mlp(block.ln2(mid))
        torch.testing.assert_close(block(x, None), expected, atol=0, rtol=0)
        # and the whole model ends with the final LayerNorm
        ids = torch.randint(0, cfg.vocab_size, (2, 5))
        _, cache = model.run_with_cache(ids, names_filter="blocks.1.hook_resid_post")
        torch.testing.assert_close(model(ids), model.ln_final(cache["blocks.1.hook_resid_post"]))


def test_post_ln_block_computes_its_definition(bundled):
    block = bundled.blocks[3]
    x = torch.randn(2, 5, 384, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        mid = block.ln1(x + block.attn(x, None))
        torch.testing.assert_close(block(x, None), block.ln2(mid + block.mlp(mid)), atol=0, rtol=0)


def test_raw_attention_is_softmax_xxt_x_with_masks():
    d = 24
    x = torch.randn(3, 6, d, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] * 2 + [0] * 4])
    keep = mask.bool()[:, None, None, :]
    for n_heads in (1, 3):
        cfg = EncoderConfig(d_model=d, n_layers=1, n_heads=n_heads, d_mlp=8, attention_projections=False)
        attn = models.random_encoder(cfg).double().blocks[0].attn
        assert not list(attn.parameters())
        heads = x.reshape(3, 6, n_heads, d // n_heads).transpose(1, 2)  # each head reads its slice
        scores = heads @ heads.transpose(-1, -2) / math.sqrt(d // n_heads)
        expected = scores.masked_fill(~keep, float("-inf")).softmax(-1) @ heads
        expected = expected.transpose(1, 2).reshape(3, 6, d)
        for impl in ("auto", "explicit"):
            attn.impl = impl
            torch.testing.assert_close(attn(x, keep), expected, atol=1e-12, rtol=0)


def test_config_round_trip_and_validation():
    cfg = EncoderConfig.from_hf(BUNDLED)
    assert EncoderConfig.from_hf(cfg.to_hf()) == cfg
    with pytest.raises(ValueError, match="divisible"):
        EncoderConfig(d_model=10, n_heads=3)
    with pytest.raises(ValueError, match="norm_placement"):
        EncoderConfig(norm_placement="middle")
    assert cfg.replace(norm_placement="pre").norm_placement == "pre"
