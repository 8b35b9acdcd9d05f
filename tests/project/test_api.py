"""Text in wherever token ids are accepted; to_tokens / to_str_tokens map positions back to text."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_close_across_kernels

TEXTS = ["The cat sat on the mat.", "Tokenization is unaffable"]


def test_text_equals_token_ids(bundled, tokenizer):
    enc = tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        from_ids = bundled(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
        from_text = bundled(TEXTS)
        from_dict = bundled(bundled.to_tokens(TEXTS))
        single = bundled(TEXTS[0])
    torch.testing.assert_close(from_text, from_ids, rtol=0, atol=0)
    torch.testing.assert_close(from_dict, from_ids, rtol=0, atol=0)
    assert single.shape == (1, int(enc["attention_mask"][0].sum()), bundled.config.d_model)
    assert_close_across_kernels(single[0], from_ids[0, : single.shape[1]])  # another shape: other blocking


def test_text_in_run_with_cache_and_hooks(bundled):
    seen = {}

    def grab(t, hook):
        seen[hook.name] = t.shape

    with torch.no_grad():
        out, cache = bundled.run_with_cache(TEXTS, names_filter="blocks.0.attn.hook_pattern")
        hooked = bundled.run_with_hooks(TEXTS, fwd_hooks=[("blocks.1.hook_resid_post", grab)])
    # caching a pattern takes the explicit attention path, the plain hook keeps the fused one
    assert_close_across_kernels(hooked, out)
    mask = bundled.to_tokens(TEXTS)["attention_mask"]
    # padded keys of the shorter text get exactly zero attention: the mask came from the text
    pattern = cache["pattern", 0]
    assert pattern.shape[-1] == mask.shape[1]
    short = int(mask.sum(1).argmin())
    assert float(pattern[short][..., mask[short] == 0].abs().max()) == 0.0
    assert seen["blocks.1.hook_resid_post"] == out.shape


def test_text_with_mask_is_an_error(bundled):
    mask = torch.ones(1, 8, dtype=torch.long)
    with pytest.raises(ValueError, match="carry their own attention_mask"):
        bundled("The cat.", mask)
    with pytest.raises(ValueError, match="input_ids"):
        bundled({"ids": torch.zeros(1, 3, dtype=torch.long)})


def test_to_tokens_shapes(bundled):
    batch = bundled.to_tokens(TEXTS)
    assert set(batch) == {"input_ids", "attention_mask", "token_type_ids"}
    assert batch["input_ids"].shape == batch["attention_mask"].shape
    assert batch["input_ids"].dtype == torch.long


def test_to_str_tokens_keeps_word_pieces_and_positions(bundled):
    toks = bundled.to_str_tokens("Tokenization is unaffable")
    assert toks[0] == "[CLS]" and toks[-1] == "[SEP]"
    assert any(t.startswith("##") for t in toks), toks
    batch = bundled.to_tokens(TEXTS)
    per_text = bundled.to_str_tokens(TEXTS)
    per_row = bundled.to_str_tokens(batch["input_ids"])
    for text_tokens, row_tokens, mask in zip(per_text, per_row, batch["attention_mask"], strict=True):
        n = int(mask.sum())
        assert text_tokens == row_tokens[:n]  # position i of a text is position i of its padded row
        assert all(t == "[PAD]" for t in row_tokens[n:])
    # ids of one text round-trip to the same strings
    assert bundled.to_str_tokens(batch["input_ids"][1]) == per_row[1]
    assert bundled.to_str_tokens(batch) == per_row
    # the word pieces are the tokenizer's own
    assert toks == bundled.tokenizer.convert_ids_to_tokens(bundled.tokenizer("Tokenization is unaffable")["input_ids"])


def test_to_str_tokens_without_tokenizer(tiny_config):
    from bertscope.models import random_encoder

    model = random_encoder(tiny_config)
    with pytest.raises(RuntimeError, match="no tokenizer"):
        model.to_str_tokens("text")
    with pytest.raises(RuntimeError, match="no tokenizer"):
        model("text")
