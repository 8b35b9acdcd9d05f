"""The explorer for bertviz users: transformers' ``output_attentions`` straight in, and sentence pairs (each token's
segment). The page's pair view (A->B / B->A filters, attention mass each way) is tested in a real Chromium in
test_explorer_browser.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from bertscope.experiments import explorer
from bertscope.experiments.explorer import data

import bertscope

TEXT, PAIR = "The cat sat on the mat.", "It was very tired."
STEP = 1 / 255  # the map code's step for probabilities (unit scale): decoded values are within half of it


def decoded(view, s: int, method: str = "attention") -> np.ndarray:
    sent = view.payload["sentences"][s]
    m = next(m for m in view.payload["methods"] if m["id"] == method)
    n = len(sent["tokens"])
    return data.decode_map(sent["maps"][method], (m["layers"], m["heads"], n, n))


@pytest.fixture(scope="module")
def hf_pair(hf_bundled, tokenizer):
    enc = tokenizer(TEXT, PAIR, return_tensors="pt")
    with torch.no_grad():
        out = hf_bundled(**enc, output_attentions=True)
    tokens = tokenizer.convert_ids_to_tokens(enc["input_ids"][0])
    return out.attentions, tokens, int(enc["token_type_ids"][0].argmax())


def test_pair_segments_follow_bert_token_types(bundled, tokenizer):
    view = bertscope.explore(bundled, TEXT, pairs=PAIR, qk=False)
    sent = view.payload["sentences"][0]
    assert sent["segments"] == tokenizer(TEXT, PAIR)["token_type_ids"]  # [CLS] A [SEP] -> 0, B [SEP] -> 1
    assert sent["tokens"][0] == "[CLS]" and sent["tokens"].count("[SEP]") == 2
    assert PAIR in sent["text"] and TEXT in sent["text"]
    single = bertscope.explore(bundled, [TEXT, PAIR], qk=False)
    assert [s["segments"] for s in single.payload["sentences"]] == [None, None]


def test_pair_segments_without_token_types():
    """RoBERTa-style tokenizers have no token types: segments come from the tokenizer's sequence ids, a separator
    joining the segment before it."""
    from tests.family_fixtures import bpe_tokenizer

    tok = bpe_tokenizer()
    positions = [np.arange(len(tok("a cat", "the dog")["input_ids"]))]
    (segs,) = data.pair_segments(tok, ["a cat"], ["the dog"], positions)
    seq = tok("a cat", "the dog").sequence_ids()
    first_b = seq.index(1)
    assert segs[:first_b] == [0] * first_b and set(segs[first_b:]) == {1} and segs[-1] == 1


def test_output_attentions_straight_in_match_bertscope(bundled, hf_pair):
    """bertviz's input (a tuple of [batch, head, query, key] per layer + tokens) gives the same page data as
    bertscope's own run on the same pair."""
    attentions, tokens, b_start = hf_pair
    view = bertscope.explore(attentions, tokens, sentence_b_start=b_start)
    sent = view.payload["sentences"][0]
    assert sent["tokens"] == tokens and sent["qk"] is None
    assert sent["segments"] == [0] * b_start + [1] * (len(tokens) - b_start)
    expected = torch.stack(attentions, dim=1)[0].numpy()
    np.testing.assert_allclose(decoded(view, 0), expected, atol=STEP / 2 + 1e-6)
    ours = bertscope.explore(bundled, TEXT, pairs=PAIR, qk=False)
    np.testing.assert_allclose(decoded(view, 0), decoded(ours, 0), atol=STEP + 1e-6)
    assert ours.payload["sentences"][0]["segments"] == sent["segments"]
    # a stacked [layer, batch, head, q, k] tensor and a batch with one token list per row work too
    stacked = explorer.explore(torch.stack(attentions), [tokens])
    np.testing.assert_allclose(decoded(stacked, 0), expected, atol=STEP / 2 + 1e-6)


def test_output_attentions_of_a_padded_batch(hf_bundled, tokenizer):
    texts = ["Dogs bark.", "The cat sat on the mat."]
    enc = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        att = hf_bundled(**enc, output_attentions=True).attentions
    rows = [tokenizer.convert_ids_to_tokens(ids[m.bool()]) for ids, m in zip(enc["input_ids"], enc["attention_mask"],
                                                                             strict=True)]
    view = bertscope.explore(att, rows)
    n0 = len(rows[0])
    assert n0 < enc["input_ids"].shape[1]
    np.testing.assert_allclose(decoded(view, 0)[2], att[2][0, :, :n0, :n0].numpy(), atol=STEP / 2 + 1e-6)


def test_output_attentions_bad_input_is_named(hf_pair):
    attentions, tokens, _ = hf_pair
    with pytest.raises(ValueError, match="tokens but the attention is over"):
        bertscope.explore(attentions, tokens[:-1])
    with pytest.raises(TypeError, match="output_attentions"):
        bertscope.explore((attentions[0], "x"), tokens)
    with pytest.raises(TypeError, match="list of token strings"):
        bertscope.explore(attentions, "the cat")
    with pytest.raises(ValueError, match="sentence_b_start must be in"):
        bertscope.explore(attentions, tokens, sentence_b_start=0)
    with pytest.raises(ValueError, match="need a bertscope model"):
        bertscope.explore(attentions, tokens, mixing="alti")


def test_pairs_bad_input_is_named(bundled):
    with pytest.raises(ValueError, match="one second segment"):
        bertscope.explore(bundled, [TEXT, TEXT], pairs=[PAIR])
    with pytest.raises(ValueError, match="give pairs="):
        bertscope.explore(bundled, TEXT, sentence_b_start=3)
