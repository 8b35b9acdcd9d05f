"""Tokenisation with word alignment, batching, truncation, two-segment input, and word-level maps."""

from __future__ import annotations

import warnings

import pytest
import torch
from bertscope.experiments.corpus import (
    Corpus,
    CorpusError,
    Sentence,
    encode,
    generate_builtin,
    load_corpus,
    word_attention,
    word_pool,
)

# every word but "the" and "." splits into several pieces with the bundled uncased vocabulary
SPLIT = Sentence("split", ("The", "hedgehog", "'s", "wheelbarrow", "crunchy", "."),
                 "The hedgehog's wheelbarrow crunchy.")


def _corpus(*sentences: Sentence) -> Corpus:
    return Corpus("test", "test", list(sentences))


def _sentence(i: int, words: str) -> Sentence:
    return Sentence(f"s{i}", tuple(words.split()), words)


@pytest.fixture(scope="module")
def builtin() -> Corpus:
    return generate_builtin(200, seed=3)


# ---------------------------------------------------------------------------------------------- alignment


def test_pieces_of_each_word_spell_the_word(builtin, tokenizer):
    """Known answer: a word's pieces, '##' removed and joined, give back the (lower-cased) word."""
    encoded = encode(builtin, tokenizer, max_length=128, batch_size=16)
    seen_multi = 0
    for batch in encoded:
        for r, si in enumerate(batch.sentence_index):
            words = builtin[si].words
            tokens = tokenizer.convert_ids_to_tokens(batch.input_ids[r].tolist())
            wids = batch.word_ids[r].tolist()
            assert batch.n_words[r] == len(words) and max(wids) == len(words) - 1
            for w, word in enumerate(words):
                pieces = [tokens[p] for p in range(len(wids)) if wids[p] == w]
                assert "".join(p.removeprefix("##") for p in pieces) == word.lower()
                seen_multi += len(pieces) > 1
            positions = [p for p in range(len(wids)) if wids[p] >= 0]
            assert [wids[p] for p in positions] == sorted(wids[p] for p in positions)  # pieces in word order
    assert seen_multi > 50


def test_special_tokens_padding_and_masks(tokenizer):
    short, long = _sentence(0, "a dog"), SPLIT
    (batch,) = encode(_corpus(short, long), tokenizer, batch_size=8).batches
    assert batch.sentence_index == [1, 0]  # longest first
    n_long = 2 + len(tokenizer(list(SPLIT.words), is_split_into_words=True, add_special_tokens=False)["input_ids"])
    assert batch.input_ids.shape == (2, n_long)
    assert batch.lengths.tolist() == [n_long, 4]
    row = batch.input_ids[1].tolist()
    assert row == [tokenizer.cls_token_id, *tokenizer.convert_tokens_to_ids(["a", "dog"]), tokenizer.sep_token_id] + [
        tokenizer.pad_token_id] * (n_long - 4)
    assert batch.word_ids[1].tolist() == [-1, 0, 1, -1] + [-1] * (n_long - 4)
    assert batch.special_mask[1].tolist() == [True, False, False, True] + [False] * (n_long - 4)
    assert batch.attention_mask[1].tolist() == [1] * 4 + [0] * (n_long - 4)
    assert batch.token_type_ids.eq(0).all()
    for t in (batch.input_ids, batch.attention_mask, batch.token_type_ids, batch.word_ids):
        assert t.dtype == torch.long
    assert batch.special_mask.dtype == torch.bool


def test_batching_by_length_keeps_every_sentence_once(builtin, tokenizer):
    encoded = encode(builtin, tokenizer, batch_size=7)
    order = [i for batch in encoded for i in batch.sentence_index]
    assert sorted(order) == list(range(len(builtin)))
    lengths = [int(n) for batch in encoded for n in batch.lengths]
    assert lengths == sorted(lengths, reverse=True)
    assert all(len(batch) == 7 for batch in encoded.batches[:-1]) and len(encoded) == -(-len(builtin) // 7)
    assert all(batch.input_ids.shape[1] == int(batch.lengths.max()) for batch in encoded)  # padded to the batch
    unsorted = encode(builtin, tokenizer, batch_size=7, sort_by_length=False)
    assert [i for batch in unsorted for i in batch.sentence_index] == list(range(len(builtin)))


def test_words_giving_no_pieces_are_an_error(tokenizer):
    # a word of only invisible characters is refused where the sentence is made, before any tokenizer sees it
    with pytest.raises(ValueError, match=r"word 2 \(U\+200B\) has only invisible characters"):
        Sentence("zw", ("a", "\u200b", "b"), "a b")


# ---------------------------------------------------------------------------------------------- truncation


def test_truncation_is_counted_warned_and_at_word_boundaries(builtin, tokenizer):
    max_length = 12
    n_pieces = [len(tokenizer(list(s.words), is_split_into_words=True, add_special_tokens=False)["input_ids"])
                for s in builtin]
    expected = sum(n + 2 > max_length for n in n_pieces)
    assert 0 < expected < len(builtin)
    with pytest.warns(UserWarning, match=f"{expected} of {len(builtin)} sequences were longer than max_length=12"):
        encoded = encode(builtin, tokenizer, max_length=max_length)
    assert encoded.n_truncated == expected == len(encoded.truncated_ids)
    dropped = 0
    for batch in encoded:
        assert batch.input_ids.shape[1] <= max_length
        for r, si in enumerate(batch.sentence_index):
            words = builtin[si].words
            kept = batch.n_words[r]
            assert batch.truncated[r] == (kept < len(words)) == (n_pieces[si] + 2 > max_length)
            n_kept_pieces = int((batch.word_ids[r] >= 0).sum())
            full = tokenizer(list(words[:kept]), is_split_into_words=True, add_special_tokens=False)["input_ids"]
            assert n_kept_pieces == len(full)  # whole words only: no word lost some of its pieces
            assert batch.input_ids[r, n_kept_pieces + 1] == tokenizer.sep_token_id
            if batch.truncated[r]:  # and as many whole words as fit
                with_next = tokenizer(list(words[: kept + 1]), is_split_into_words=True, add_special_tokens=False)
                assert len(with_next["input_ids"]) + 2 > max_length
            dropped += len(words) - kept
    assert encoded.n_words_dropped == dropped


def test_no_truncation_no_warning_and_long_inputs_kept_whole(tokenizer):
    words = ("hedgehog " * 150).split()  # 300 pieces: more than the tokenizer file's own 128-piece cut
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        encoded = encode(_corpus(Sentence("long", tuple(words), " ".join(words))), tokenizer, max_length=512)
    assert encoded.n_truncated == 0 and encoded.batches[0].input_ids.shape == (1, 302)


def test_bad_arguments_are_clear_errors(tokenizer):
    corpus = _corpus(SPLIT)
    with pytest.raises(CorpusError, match="leaves no room for even its first word"):
        encode(_corpus(Sentence("w", ("wheelbarrow",), "wheelbarrow")), tokenizer, max_length=4)
    with pytest.raises(ValueError, match="exceeds the tokenizer's model_max_length=512"):
        encode(corpus, tokenizer, max_length=1000)
    with pytest.raises(ValueError, match="max_length must be an integer >= 3"):
        encode(corpus, tokenizer, max_length=2)
    with pytest.raises(ValueError, match="batch_size"):
        encode(corpus, tokenizer, batch_size=0)
    with pytest.raises(CorpusError, match="fast"):
        encode(corpus, None)
    with pytest.raises(CorpusError, match="pair=True needs 2"):
        encode(corpus, tokenizer, pair=True)


# ---------------------------------------------------------------------------------------------- pairs


def test_pair_encoding_matches_the_tokenizer_and_numbers_words_across_segments(tokenizer):
    sentences = [SPLIT, _sentence(1, "dogs bark"), _sentence(2, "the old walrus sleeps"), _sentence(3, "yes"),
                 _sentence(4, "odd one out")]
    with pytest.warns(UserWarning, match="'s4'.* no partner"):
        encoded = encode(_corpus(*sentences), tokenizer, pair=True, batch_size=4)
    (batch,) = encoded.batches
    assert encoded.n_sequences == 2 and batch.sentence_index == [0, 2] and batch.pair_index == [1, 3]
    for r, (a, b) in enumerate([(0, 1), (2, 3)]):
        reference = tokenizer(list(sentences[a].words), list(sentences[b].words), is_split_into_words=True)
        n = len(reference["input_ids"])
        assert batch.input_ids[r, :n].tolist() == reference["input_ids"]
        assert batch.token_type_ids[r, :n].tolist() == reference["token_type_ids"]
        assert batch.token_type_ids[r, n:].eq(0).all() and batch.attention_mask[r, n:].eq(0).all()
        n_a = len(sentences[a].words)
        assert batch.n_words_a[r] == n_a and batch.n_words[r] == n_a + len(sentences[b].words)
        wids, types = batch.word_ids[r, :n], batch.token_type_ids[r, :n]
        assert (wids[(types == 0) & (wids >= 0)] < n_a).all() and (wids[types == 1] != -1).sum() > 0
        assert (wids[(types == 1) & (wids >= 0)] >= n_a).all()
        assert batch.special_mask[r, :n].sum() == 3


def test_pair_truncation_cuts_the_longer_segment_first(tokenizer):
    long, short = _sentence(0, " ".join(["dog"] * 20)), _sentence(1, "a cat sat")
    with pytest.warns(UserWarning, match="1 of 1 sequences"):
        encoded = encode(_corpus(long, short), tokenizer, pair=True, max_length=13)
    (batch,) = encoded.batches
    assert batch.n_words_a == [7] and batch.n_words == [10] and encoded.n_words_dropped == 13
    assert batch.input_ids.shape == (1, 13)


# ---------------------------------------------------------------------------------------------- word maps


def _explicit_word_map(pattern: torch.Tensor, wids: list[int]) -> torch.Tensor:
    """The definition, with loops: to a word = sum over its pieces; from a word = mean over its pieces."""
    n = max(wids) + 1
    out = torch.zeros(n, n, dtype=torch.float64)
    for v in range(n):
        queries = [q for q in range(len(wids)) if wids[q] == v]
        for w in range(n):
            keys = [k for k in range(len(wids)) if wids[k] == w]
            out[v, w] = sum(float(pattern[q, k]) for q in queries for k in keys) / len(queries)
    return out


WIDS = [-1, 0, 0, 1, 2, 2, 2, -1, -1]  # [CLS] w0 w0 w1 w2 w2 w2 [SEP] [PAD]


def test_word_attention_known_answers():
    torch.manual_seed(0)
    scores = torch.randn(3, len(WIDS), len(WIDS), dtype=torch.float64)
    scores[..., -1] = float("-inf")  # padding key
    pattern = scores.softmax(-1)  # [head, query, key]
    maps = word_attention(pattern, WIDS)
    assert maps.shape == (3, 3, 3)
    for h in range(3):
        torch.testing.assert_close(maps[h], _explicit_word_map(pattern[h], WIDS))
    on_words = torch.tensor([w >= 0 for w in WIDS])
    mass_on_words = torch.stack([pattern[:, [q for q in range(9) if WIDS[q] == v]][..., on_words].sum(-1).mean(-1)
                                 for v in range(3)], dim=-1)
    torch.testing.assert_close(maps.sum(-1), mass_on_words)  # honest: what the word put on real words
    assert (maps.sum(-1) < 1 - 1e-3).all()

    with_special = word_attention(pattern, WIDS, include_special=True)
    assert with_special.shape == (3, 3, 4)
    torch.testing.assert_close(with_special[..., :3], maps)
    torch.testing.assert_close(with_special.sum(-1), torch.ones(3, 3, dtype=torch.float64))

    renormalized = word_attention(pattern, WIDS, renormalize=True)
    torch.testing.assert_close(renormalized.sum(-1), torch.ones(3, 3, dtype=torch.float64))
    torch.testing.assert_close(renormalized, maps / maps.sum(-1, keepdim=True))


def test_word_attention_planted_pattern():
    """Every piece of word 0 sends all its attention to the second piece of word 2; word 2 to [CLS]."""
    pattern = torch.zeros(len(WIDS), len(WIDS))
    pattern[1:3, 5] = 1.0
    pattern[3, 1], pattern[3, 2] = 0.25, 0.75  # word 1 splits its attention over word 0's two pieces
    pattern[4:7, 0] = 1.0
    maps = word_attention(pattern, torch.tensor(WIDS))
    expected = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(maps, expected)
    special = word_attention(pattern, WIDS, include_special=True)
    torch.testing.assert_close(special[:, -1], torch.tensor([0.0, 0.0, 1.0]))
    renormalized = word_attention(pattern, WIDS, renormalize=True)
    torch.testing.assert_close(renormalized, expected)  # a row with no mass on words stays zero, not NaN


def test_word_attention_on_the_bundled_model(bundled, tokenizer):
    """Real patterns over words split into several pieces, padding included: rows sum to 1 when the special
    column is kept or rows are renormalised; without, they sum to the mass on words."""
    corpus = _corpus(SPLIT, _sentence(1, "the grumpy giraffe read the book to the giraffe"))
    (batch,) = encode(corpus, tokenizer).batches
    _, cache = bundled.run_with_cache(batch.input_ids, batch.attention_mask, batch.token_type_ids,
                                      names_filter="blocks.*.attn.hook_pattern")
    patterns = cache.stack("attn.hook_pattern")  # [layer, batch, head, query, key]
    for r in range(len(batch)):
        pattern, wids = patterns[:, r], batch.word_ids[r]
        n = batch.n_words[r]
        special = word_attention(pattern, wids, include_special=True)
        assert special.shape == (*pattern.shape[:2], n, n + 1)
        torch.testing.assert_close(special.sum(-1), torch.ones(special.shape[:-1]))
        plain = word_attention(pattern, wids)
        torch.testing.assert_close(plain.sum(-1), 1 - special[..., -1])
        renormalized = word_attention(pattern, wids, renormalize=True)
        torch.testing.assert_close(renormalized.sum(-1), torch.ones(renormalized.shape[:-1]))


def test_word_attention_and_pool_reject_bad_word_ids():
    pattern = torch.full((4, 4), 0.25)
    with pytest.raises(ValueError, match="pos=4"):
        word_attention(pattern, [0, 1, 2])
    with pytest.raises(ValueError, match="skip word 1"):
        word_attention(pattern, [-1, 0, 2, -1])
    with pytest.raises(ValueError, match="no words"):
        word_attention(pattern, [-1] * 4)
    with pytest.raises(ValueError, match="query, key"):
        word_attention(torch.ones(4, 3), [0, 0, 1, 1][:3])
    with pytest.raises(ValueError, match="reduce"):
        word_pool(torch.ones(4, 2), [0, 0, 1, 1], reduce="max")


def test_word_pool_known_answers():
    x = torch.arange(len(WIDS) * 2, dtype=torch.float32).reshape(len(WIDS), 2)  # [pos, d]: row p = (2p, 2p+1)
    mean = word_pool(x, WIDS)
    torch.testing.assert_close(mean, torch.tensor([[3.0, 4.0], [6.0, 7.0], [10.0, 11.0]]))
    torch.testing.assert_close(word_pool(x, WIDS, reduce="sum"), torch.tensor([[6.0, 8.0], [6.0, 7.0],
                                                                               [30.0, 33.0]]))
    torch.testing.assert_close(word_pool(x, WIDS, reduce="first"), x[[1, 3, 4]])
    batched = word_pool(torch.stack([x, 2 * x]), WIDS)  # [..., pos, d] -> [..., n_words, d]
    torch.testing.assert_close(batched, torch.stack([mean, 2 * mean]))


def test_repeated_random_copies_sit_at_offset_m_in_tokens(tokenizer):
    corpus = load_corpus("repeated-random:m=9", tokenizer=tokenizer, max_sentences=12)
    for batch in encode(corpus, tokenizer):
        assert batch.input_ids.shape[1] == 2 * 9 + 2
        first, second = batch.input_ids[:, 1:10], batch.input_ids[:, 10:19]
        assert torch.equal(first, second)
        assert torch.equal(batch.word_ids[:, 1:19], torch.arange(18).expand(len(batch), 18))
        for row in first:  # no other copy: each token occurs once per half
            assert len(set(row.tolist())) == 9
