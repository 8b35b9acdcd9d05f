"""The activations stage (`experiments.activations`): the same rows, order and numbers from a forward and from a
capture folder; row metadata with known answers; word pooling; one-line refusals of a capture that cannot
serve a request."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch
from bertscope.experiments import activations as stage
from bertscope.experiments.capture import CaptureError, capture, load_capture
from bertscope.experiments.corpus import Corpus, encode, load_corpus, word_pool

from bertscope import models

SITES = "embed.hook_word,embed.hook_out,blocks.*.hook_resid_post,blocks.1.attn.hook_pattern"
N = 12
BATCH = 3


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path) -> models.Encoder:
    return models.load(tiny_model_dir)


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return load_corpus("builtin", max_sentences=N)


@pytest.fixture(scope="module")
def captured(tiny: models.Encoder, corpus: Corpus, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("acts") / "capture"
    capture(tiny, corpus, SITES, out, max_length=64, batch_size=BATCH, shard_size=20_000, quiet=True,
            info={"model": {"weights_sha256": tiny.weights_sha256, "source": str(tiny.source)},
                  "corpus": {"name": corpus.name}})  # fmt: skip
    return out


def _collect(batches: list[stage.ActivationBatch]) -> tuple[pd.DataFrame, dict[str, torch.Tensor]]:
    rows = pd.concat([b.rows() for b in batches], ignore_index=True)
    flat = {s: torch.cat([b.flat(s) for b in batches]) for s in batches[0].sites if not stage.is_attention(s)}
    return rows, flat


def test_capture_and_forward_give_the_same_rows_order_and_numbers(tiny, corpus, captured) -> None:
    kw = {"batch_size": BATCH, "max_length": 64}
    forward = list(stage.iter_activations(tiny, corpus, SITES, **kw))
    read = list(stage.iter_activations(tiny, corpus, SITES, capture=captured, **kw))
    assert len(forward) == len(read) == -(-N // BATCH)
    for a, b in zip(forward, read, strict=True):
        assert a.batch.sentence_index == b.batch.sentence_index
        assert a.sites == b.sites == tiny.select_hooks(SITES.split(","))
        for site in a.sites:  # padded batch tensors, bit for bit (padding zero in both)
            assert a[site].shape == b[site].shape
            assert torch.equal(a[site], b[site]), site
        pd.testing.assert_frame_equal(a.rows(), b.rows())
    rows, flat = _collect(read)
    # ... and the same rows as load_capture's, in the stage's (batch) order
    tensors, stored = load_capture(captured, order="shard")
    pd.testing.assert_frame_equal(rows[["sentence_index", "position", "word_index", "token_id", "token_type"]],
                                  stored[["sentence_index", "position", "word_index", "token_id", "token_type"]])
    for site in ("embed.hook_out", "blocks.0.hook_resid_post", "blocks.1.hook_resid_post"):
        assert torch.equal(flat[site], tensors[site])
    pattern = tensors["blocks.1.attn.hook_pattern"]  # [rows, head, key_width]
    offset = 0
    for b in read:  # the stage's keys are the batch's positions; the capture pads keys to the longest sentence
        n = len(b.rows())
        got = b.flat("blocks.1.attn.hook_pattern")
        assert torch.equal(got, pattern[offset : offset + n, :, : got.shape[-1]])
        assert (pattern[offset : offset + n, :, got.shape[-1] :] == 0).all()
        offset += n
    assert offset == len(pattern)


def test_row_metadata_known_answers(tiny, corpus) -> None:
    """token_id and word_index against the tokenizer; token classes [CLS] / word pieces / [SEP] / padding;
    the word embedding row is W_E[token_id] (ties the metadata to the numbers)."""
    tok = tiny.tokenizer
    batches = list(stage.iter_activations(tiny, corpus, "embed.hook_word", batch_size=5, max_length=64))
    rows, flat = _collect(batches)
    assert sorted(rows["sentence_index"].unique()) == list(range(N))
    for i, sentence in enumerate(corpus):
        enc = tok(list(sentence.words), is_split_into_words=True)
        mine = rows[rows["sentence_index"] == i]
        assert mine["position"].tolist() == list(range(len(enc["input_ids"])))
        assert mine["token_id"].tolist() == enc["input_ids"]
        assert mine["word_index"].tolist() == [-1 if w is None else w for w in enc.word_ids()]
        assert mine["token_class"].tolist() == ["cls"] + ["real"] * (len(enc["input_ids"]) - 2) + ["sep"]
    assert torch.equal(flat["embed.hook_word"], tiny.W_E[torch.as_tensor(rows["token_id"].to_numpy().copy())].detach())
    first = batches[0]
    padded = first.batch.attention_mask == 0
    assert padded.any()  # longest first: the first batch pads its shorter sentences
    assert (first.token_class[padded] == stage.PADDING).all()
    assert (first["embed.hook_word"][padded] == 0).all()
    # include_special=False drops exactly the [CLS]/[SEP] rows
    no_special = list(stage.iter_activations(tiny, corpus, "embed.hook_word", batch_size=5, max_length=64,
                                             include_special=False))  # fmt: skip
    rows2, flat2 = _collect(no_special)
    assert (rows2["token_class"] == "real").all() and (rows2["word_index"] >= 0).all()
    assert len(rows2) == (rows["token_class"] == "real").sum()
    words = torch.from_numpy((rows["word_index"] >= 0).to_numpy().copy())
    assert torch.equal(flat2["embed.hook_word"], flat["embed.hook_word"][words])


def test_pair_template_classes(tiny) -> None:
    """[CLS] a [SEP]: one CLS, one SEP; a special token after a word is SEP-like, before any word CLS-like."""
    batch = next(iter(stage.iter_activations(tiny, ["a b c", "d"], "embed.hook_out", max_length=16))).batch
    classes = stage.token_classes(batch)
    assert classes[0].tolist() == [stage.CLS, stage.REAL, stage.REAL, stage.REAL, stage.SEP]
    assert classes[1].tolist() == [stage.CLS, stage.REAL, stage.SEP, stage.PADDING, stage.PADDING]


def test_word_pooling_means_each_words_pieces(tiny, corpus, captured) -> None:
    kw = {"batch_size": BATCH, "max_length": 64}
    tokens = list(stage.iter_activations(tiny, corpus, SITES, **kw))  # the capture's sites: the same forward path
    words = list(stage.iter_activations(tiny, corpus, SITES, pool="word", **kw))
    from_capture = list(stage.iter_activations(tiny, corpus, SITES, pool="word", capture=captured, **kw))
    for t, w, c in zip(tokens, words, from_capture, strict=True):
        for site in w.sites:
            assert torch.equal(w[site], c[site]), site
        x = t["blocks.1.hook_resid_post"]
        for j, n in enumerate(t.batch.n_words):
            expected = word_pool(x[j], t.batch.word_ids[j])
            assert torch.equal(w["blocks.1.hook_resid_post"][j, :n], expected)
            assert (w["blocks.1.hook_resid_post"][j, n:] == 0).all()
            # a word's vector is the plain mean of its pieces' rows
            wid = t.batch.word_ids[j]
            for k in range(n):
                torch.testing.assert_close(expected[k], x[j][wid == k].mean(0))
        rows = w.rows()
        assert len(rows) == sum(t.batch.n_words) == len(w.flat("blocks.1.hook_resid_post"))
        assert (rows["token_class"] == "real").all()
        piece = t.rows().set_index(["sentence_index", "position"])
        assert (piece.loc[list(zip(rows["sentence_index"], rows["position"], strict=True)), "word_index"].to_numpy()
                == rows["word_index"].to_numpy()).all()  # a word's first piece carries its index


def test_word_pooled_attention_shape(tiny, corpus) -> None:
    acts = next(iter(stage.iter_activations(tiny, corpus, "blocks.0.attn.hook_pattern", pool="word", max_length=64)))
    p = acts["blocks.0.attn.hook_pattern"]  # [batch, head, word, word]
    n = max(acts.batch.n_words)
    assert p.shape == (len(acts.batch), tiny.config.n_heads, n, n)
    j = acts.batch.n_words.index(n)
    assert torch.all(p[j].sum(-1) <= 1 + 1e-5)  # mass on real words only: at most 1 per row


def test_capture_serves_a_subset_of_its_sentences(tiny, corpus, captured) -> None:
    """Sentences are found by id and text: a capture of a corpus serves any of its sentences, in the batches
    the subset encodes to (numbers equal up to padding rounding)."""
    subset = corpus[3:9]
    kw = {"batch_size": 4, "max_length": 64}
    a = _collect(list(stage.iter_activations(tiny, subset, "blocks.*.hook_resid_post", **kw)))
    b = _collect(list(stage.iter_activations(tiny, subset, "blocks.*.hook_resid_post", capture=captured, **kw)))
    pd.testing.assert_frame_equal(a[0], b[0])
    for site in a[1]:
        torch.testing.assert_close(a[1][site], b[1][site], atol=1e-5, rtol=1e-4)


def test_device_and_dtype(tiny, corpus) -> None:
    acts = next(iter(stage.iter_activations(tiny, corpus, "blocks.0.hook_resid_post", device="cpu",
                                            dtype=torch.float64, max_length=64)))  # fmt: skip
    assert acts["blocks.0.hook_resid_post"].dtype == torch.float64


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"sites": "blocks.0.attn.hook_z"}, "lacks a site"),
        ({"max_length": 32}, "--max-length 64"),
        ({"corpus": "other"}, "does not hold sentence"),
    ],
)
def test_refusals_are_one_line(tiny, corpus, captured, change, message) -> None:
    sites = change.get("sites", "blocks.*.hook_resid_post")
    texts = ["words no capture holds"] if change.get("corpus") else corpus
    with pytest.raises(CaptureError, match=message) as e:
        length = change.get("max_length", 64)
        next(iter(stage.iter_activations(tiny, texts, sites, capture=captured, max_length=length)))
    assert "\n" not in str(e.value)


def test_refuses_another_model_and_dtype(tiny, corpus, captured, tiny_model_dir) -> None:
    other = models.random_encoder(tiny.config, seed=1, tokenizer=tiny.tokenizer)
    with pytest.raises(CaptureError, match="another model"):
        next(iter(stage.iter_activations(other, corpus, "embed.hook_out", capture=captured, max_length=64)))
    double = models.load(tiny_model_dir, dtype=torch.float64)
    with pytest.raises(CaptureError, match="float32 activations"):
        next(iter(stage.iter_activations(double, corpus, "embed.hook_out", capture=captured, max_length=64)))


def test_missing_folder_and_unknown_site(tiny, corpus, tmp_path) -> None:
    with pytest.raises(CaptureError, match="not a folder"):
        next(iter(stage.iter_activations(tiny, corpus, "embed.hook_out", capture=tmp_path / "nope")))
    with pytest.raises(CaptureError, match="no hook point matches"):
        next(iter(stage.iter_activations(tiny, corpus, "blocks.*.hook_nothing")))
    with pytest.raises(ValueError, match="pool"):
        next(iter(stage.iter_activations(tiny, corpus, "embed.hook_out", pool="sentence")))


def test_a_capture_is_read_by_row_slices(tiny, corpus, captured, monkeypatch) -> None:
    """Memory bounded by a batch: activations are read as row slices of the shards, never a whole tensor
    (only the small ``rows.sentence_index`` metadata is read whole, once)."""
    import safetensors

    real = safetensors.safe_open
    whole, sliced = [], []

    class Watched:
        def __init__(self, *args, **kwargs) -> None:
            self.f = real(*args, **kwargs)

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            pass

        def get_tensor(self, name):
            whole.append(name)
            return self.f.get_tensor(name)

        def get_slice(self, name):
            sliced.append(name)
            return self.f.get_slice(name)

    monkeypatch.setattr(safetensors, "safe_open", Watched)
    batches = list(stage.iter_activations(tiny, corpus, "blocks.1.hook_resid_post", capture=captured,
                                          batch_size=BATCH, max_length=64))  # fmt: skip
    assert len(batches) == -(-N // BATCH)
    assert set(whole) == {"rows.sentence_index"}
    assert set(sliced) == {"rows.token_id", "blocks.1.hook_resid_post"}
    assert sliced.count("blocks.1.hook_resid_post") == N  # one slice per sentence


def test_structure_word_vectors_come_from_the_stage_bit_for_bit(tiny, corpus) -> None:
    """``structure``'s word vectors are the stage's ``pool="word"`` (issue 38.4): equal, bit for bit, to the
    pooling it did by hand before (the sites stacked ``[site, pos, d]`` in float32, one ``word_pool`` per
    sentence), so its tables do not move; every token site of a batch is pooled that way."""
    from bertscope.experiments.structure.data import collect

    sites = ["embed.hook_out", "blocks.0.hook_resid_post", "blocks.1.hook_resid_mid", "blocks.1.hook_resid_post"]
    encoded = encode(corpus, tiny.tokenizer, batch_size=BATCH, max_length=64)
    n_words = [len(s) for s in corpus.sentences]
    vectors, truncated = collect(tiny, encoded, sites, n_words)
    assert truncated == []
    by_hand = {}
    for batch in encoded:
        cache = stage.batch_activations(tiny, batch, sites, stop_early=False)
        stacked = torch.stack([cache[s] for s in sites], dim=1).float()  # [batch, site, pos, d]
        for r, si in enumerate(batch.sentence_index):
            by_hand[si] = word_pool(stacked[r], batch.word_ids[r]).numpy()
    words, lengths = vectors.take(list(range(len(n_words))))
    assert lengths.tolist() == n_words
    expected = torch.cat([torch.from_numpy(by_hand[i]) for i in range(len(n_words))], dim=1)
    assert torch.equal(torch.from_numpy(words), expected)
