"""Corpus encoding follows each tokenizer's special-token template and word boundaries: WordPiece (``##``),
byte-level BPE (``Ġ``, RoBERTa) and SentencePiece/Unigram (``▁``, XLM-R and ALBERT)."""

from __future__ import annotations

import pytest
import torch
from bertscope.experiments.corpus import Corpus, Sentence, encode
from family_fixtures import bpe_tokenizer, save_tiny_family, unigram_tokenizer

from bertscope import models

WORDS = [("The", "cat", "sat", "on", "the", "unbelievable", "mat", "."),
         ("Where", "is", "the", "station", "?"),
         ("A", "dog", "!"),
         ("Researchers", "probe", "attention", "heads", ".")]


def _corpus() -> Corpus:
    return Corpus("test", "test", [Sentence(f"s{i}", words, " ".join(words)) for i, words in enumerate(WORDS)])


def _pieces_per_word(batch, r: int) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for token, w in zip(batch.input_ids[r].tolist(), batch.word_ids[r].tolist(), strict=True):
        if w >= 0:
            out.setdefault(w, []).append(token)
    return out


def test_bpe_words_keep_their_space_marker_and_roberta_template():
    tok = bpe_tokenizer()
    (batch,) = encode(_corpus(), tok, max_length=64, sort_by_length=False).batches
    for r, words in enumerate(WORDS):
        pieces = _pieces_per_word(batch, r)
        assert len(pieces) == len(words)
        for j, word in enumerate(words):  # each word tokenised as in running text: with its leading space
            assert pieces[j] == tok(" " + word, add_special_tokens=False)["input_ids"]
            assert tok.convert_ids_to_tokens(pieces[j])[0].startswith("Ġ")
        n = int(batch.attention_mask[r].sum())
        assert batch.input_ids[r, 0] == tok.cls_token_id == tok.convert_tokens_to_ids("<s>")
        assert batch.input_ids[r, n - 1] == tok.sep_token_id == tok.convert_tokens_to_ids("</s>")
        assert batch.input_ids[r, n:].eq(tok.pad_token_id).all()
    assert batch.token_type_ids.eq(0).all()


def test_roberta_pair_template_and_truncation_budget():
    tok = bpe_tokenizer()
    encoded = encode(_corpus(), tok, max_length=64, pair=True, sort_by_length=False)
    (batch,) = encoded.batches
    ids = batch.input_ids[0][batch.attention_mask[0].bool()].tolist()
    tokens = tok.convert_ids_to_tokens(ids)
    n_a = sum(len(tok(" " + w, add_special_tokens=False)["input_ids"]) for w in WORDS[0])
    assert tokens[0] == "<s>" and tokens[n_a + 1 : n_a + 3] == ["</s>", "</s>"] and tokens[-1] == "</s>"
    assert batch.special_mask[0].sum() == 4 and batch.token_type_ids.eq(0).all()
    assert batch.word_ids[0, n_a + 3] == len(WORDS[0])  # segment b's first word is numbered after a's
    with pytest.warns(UserWarning, match="cut at a word boundary"):
        short = encode(_corpus(), tok, max_length=12, pair=True)
    assert short.n_truncated > 0
    assert all(b.attention_mask.sum(-1).max() <= 12 for b in short)


@pytest.mark.parametrize("kind", ["xlm-roberta", "albert"])
def test_sentencepiece_words_start_with_the_word_marker(kind):
    tok = unigram_tokenizer(kind)
    (batch,) = encode(_corpus(), tok, max_length=64, pair=True, sort_by_length=False).batches
    for r in range(len(batch)):
        for pieces in _pieces_per_word(batch, r).values():
            assert tok.convert_ids_to_tokens(pieces)[0].startswith("▁")
    specials = batch.input_ids[0][batch.special_mask[0]].tolist()
    if kind == "albert":  # [CLS] a [SEP] b [SEP], segment b has token type 1
        assert tok.convert_ids_to_tokens(specials) == ["[CLS]", "[SEP]", "[SEP]"]
        assert batch.token_type_ids[0].max() == 1
    else:
        assert tok.convert_ids_to_tokens(specials) == ["<s>", "</s>", "</s>", "</s>"]
        assert batch.token_type_ids.eq(0).all()


@pytest.mark.parametrize("family", ["roberta", "albert", "distilbert"])
def test_encoded_pairs_run_through_each_family(tmp_path, family):
    save_tiny_family(family, tmp_path / family)
    model = models.load(tmp_path / family)
    for batch in encode(_corpus(), model.tokenizer, max_length=48, pair=True):
        with torch.no_grad():
            out = model(batch.input_ids, batch.attention_mask, batch.token_type_ids)
        assert torch.isfinite(out).all()
