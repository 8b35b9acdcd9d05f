"""SPLADE vectors, the per-stream vocabulary lens and the query-document score split (``probes/lens/splade.py``) on
tiny random ``BertForMaskedLM`` checkpoints built here (no optional package needed).

Known answers come from a constructed context-free model: positional and token-type embeddings are zero and every
block writes nothing (attention and MLP output projections zero), so each position's hidden state depends on its own
token only; the head's output bias is -100 everywhere, and a few tied word embeddings are planted so that exactly one
source token gives one term a chosen logit ("cat" -> "animal" at 5, "car" -> "vehicle" at 3, "[SEP]" -> "end" at 2,
"[PAD]" -> "blank" at 4, "dog" -> "late" at 4). A SPLADE vector then has exactly the planted terms of its text's
tokens, with weight log(1 + logit), at the source token's position; padding must not count, [SEP] must. One neuron
of the last block's MLP fires for "dog" only and moves its stream: "late" appears at the last stream only, the other
planted terms at every stream (the vocabulary lens' known answer)."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
import transformers
from bertscope.models import load
from bertscope.probes.lens import NoMLMHeadError
from bertscope.probes.lens.splade import (
    lens_overlap,
    score_split,
    splade_lens,
    splade_pool,
    splade_scores,
    splade_streams,
    splade_vectors,
)
from helpers import save_tiny_bert

LATE_SOURCE = "dog"  # the last block's MLP rewrites this token's stream; its term "late" appears there only
PLANTS = {"cat": ("animal", 5.0), "car": ("vehicle", 3.0), "[SEP]": ("end", 2.0), "[PAD]": ("blank", 4.0),
          LATE_SOURCE: ("late", 4.0)}  # fmt: skip
TEXTS = ["the cat", "a car and a cat sat on the mat", "nothing planted here"]


def naver_splade(logits: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """naver/splade's ``Splade.encode`` with ``agg="max"``, written out: the reference formula."""
    values, _ = torch.max(torch.log(1 + torch.relu(logits)) * attention_mask.unsqueeze(-1), dim=1)
    return values


@pytest.fixture(scope="module")
def random_mlm(tmp_path_factory):
    """A tiny random BertForMaskedLM (3 layers) saved with the bundled tokenizer: (transformers model, folder)."""
    folder = tmp_path_factory.mktemp("random_mlm")
    return save_tiny_bert(folder, transformers.BertForMaskedLM, seed=3, num_hidden_layers=3), folder


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """The constructed context-free model with planted terms: (bertscope model, tokenizer)."""
    folder = tmp_path_factory.mktemp("planted_mlm")
    hf = save_tiny_bert(folder, transformers.BertForMaskedLM, seed=0)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    with torch.no_grad():
        hf.bert.embeddings.position_embeddings.weight.zero_()
        hf.bert.embeddings.token_type_embeddings.weight.zero_()
        for layer in hf.bert.encoder.layer:
            for dense in (layer.attention.output.dense, layer.output.dense):
                dense.weight.zero_()
                dense.bias.zero_()
        hf.cls.predictions.bias.fill_(-100.0)
        pad = hf.bert.embeddings.word_embeddings.weight[tok.pad_token_id]
        pad.copy_(torch.randn(pad.shape, generator=torch.Generator().manual_seed(0)))  # init zeroes it (padding_idx)
        # the last block's MLP: one neuron that fires for "dog" only (cosine to dog's stream > 0.8) and writes a
        # random direction, so that "dog" changes at the last stream only and "late" (planted below) appears there
        dog = torch.tensor([[tok.cls_token_id, tok.convert_tokens_to_ids(LATE_SOURCE), tok.sep_token_id]])
        h = hf.bert(input_ids=dog, output_hidden_states=True).hidden_states[-2][0, 1]
        mlp = hf.bert.encoder.layer[-1]
        mlp.intermediate.dense.weight[0] = 20 * h / h.norm()
        mlp.intermediate.dense.bias[0] = -20 * 0.8 * h.norm()
        mlp.output.dense.weight[:, 0] = torch.nn.functional.normalize(
            torch.randn(h.shape, generator=torch.Generator().manual_seed(1)), dim=0)
        for source, (term, logit) in PLANTS.items():
            ids = torch.tensor([[tok.cls_token_id, tok.convert_tokens_to_ids(source), tok.sep_token_id]])
            f = hf.cls.predictions.transform(hf.bert(input_ids=ids).last_hidden_state)[0, 1]
            hf.bert.embeddings.word_embeddings.weight[tok.convert_tokens_to_ids(term)] = (logit + 100) * f / f.dot(f)
        hf.cls.predictions.decoder.weight.copy_(hf.bert.embeddings.word_embeddings.weight)  # tied, as BERT's
    hf.save_pretrained(folder)
    return load(folder), tok


def test_pool_is_naver_max_pooling_with_padding_masked():
    """``splade_pool`` is naver's formula; a term that only padding produces is left out (its position -1)."""
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7) * 3
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    logits[1, 3:, 6] = 50.0  # only padding positions of row 1 give term 6
    logits[1, :3, 6] = -1.0
    weights, positions = splade_pool(logits, mask)
    assert torch.equal(weights, naver_splade(logits, mask))
    assert weights[1, 6] == 0 and positions[1, 6] == -1
    assert splade_pool(logits, torch.ones_like(mask))[0][1, 6] == pytest.approx(math.log1p(50.0))
    real = weights > 0
    chosen = torch.gather(torch.log(1 + torch.relu(logits)), 1, positions.clamp(min=0).unsqueeze(1)).squeeze(1)
    assert torch.equal(chosen[real], weights[real])  # each weight came from its reported position


def test_vectors_equal_transformers_splade(random_mlm):
    """SPLADE vectors equal transformers' BertForMaskedLM logits through naver's formula, to 1e-5, at any batch size
    (padding inside a batch changes nothing)."""
    hf, folder = random_mlm
    model = load(folder)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    enc = tok(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = naver_splade(hf(**enc).logits, enc["attention_mask"])
    for batch_size in (1, 2, 16):
        got = splade_vectors(model, TEXTS, batch_size=batch_size)
        assert got.shape == (len(TEXTS), 30522)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    assert (expected > 0).sum() > 100  # a random head activates many terms: the comparison is not of zeros


def test_planted_terms_weights_and_positions(planted):
    """Exactly the planted terms of each text's tokens, weight log(1 + logit), max at the source token; [SEP] counts
    (its term "end" is in every vector), padding does not (no "blank" although the short rows are padded)."""
    model, tok = planted
    result = splade_streams(model, TEXTS, batch_size=3)
    weights, positions = result.weights[-1], result.positions[-1]
    for row, text in enumerate(TEXTS):
        pieces = result.tokens[row]
        expected = {PLANTS[p][0]: (math.log1p(PLANTS[p][1]), pieces.index(p)) for p in pieces if p in PLANTS}
        active = torch.nonzero(weights[row]).flatten().tolist()
        assert sorted(tok.convert_ids_to_tokens(active)) == sorted(expected), text
        for term, (weight, position) in expected.items():
            t = tok.convert_tokens_to_ids(term)
            assert float(weights[row, t]) == pytest.approx(weight, abs=1e-4)
            assert int(positions[row, t]) == position
    assert "blank" not in tok.convert_ids_to_tokens(torch.nonzero(weights[0]).flatten().tolist())
    # planted logits are ~102 - 100: float32 rounding of the 102 shows at 1e-6 between batch shapes
    torch.testing.assert_close(splade_vectors(model, TEXTS, batch_size=1), weights, atol=1e-5, rtol=0)


def test_score_split_known_answer(planted):
    """Query "cat car" and a document with both words: the score is the sum of the three shared planted terms'
    products, split term by term (largest first), each with its source pieces; the split sums to the score
    exactly, and the score is the float32 dot product to float precision."""
    model, _ = planted
    split = score_split(model, "cat car", "the car and the cat")
    w = {name: math.log1p(logit) for name, logit in PLANTS.values()}
    assert list(split.terms["term"]) == ["animal", "vehicle", "end"]
    expected = [w["animal"] ** 2, w["vehicle"] ** 2, w["end"] ** 2]
    assert split.terms["contribution"].tolist() == pytest.approx(expected, abs=1e-3)
    assert split.score == pytest.approx(sum(expected), abs=1e-3)
    assert split.error == 0.0 and math.fsum(split.terms["contribution"]) == split.score
    assert split.terms["share"].sum() == pytest.approx(1.0, abs=1e-12)
    assert split.terms[["query_token", "document_token"]].values.tolist() == [
        ["cat", "cat"], ["car", "car"], ["[SEP]", "[SEP]"]]  # fmt: skip
    assert split.terms["query_position"].tolist() == [1, 2, 3]
    assert split.terms["document_position"].tolist() == [5, 2, 6]
    scores = splade_scores(model, ["cat car"], ["the car and the cat", "nothing"])
    assert float(scores[0, 0]) == pytest.approx(split.score, rel=1e-6)
    assert float(scores[0, 1]) == pytest.approx(w["end"] ** 2, abs=1e-4)  # only [SEP] in common


def test_score_split_sums_exactly_on_a_random_model(random_mlm):
    """On a random head (hundreds of shared terms) the split still sums to the score exactly."""
    _, folder = random_mlm
    model = load(folder)
    split = score_split(model, TEXTS[0], TEXTS[1])
    assert len(split.terms) > 50 and split.error == 0.0
    assert split.terms["contribution"].is_monotonic_decreasing
    q, d = splade_vectors(model, [TEXTS[0]]), splade_vectors(model, [TEXTS[1]])
    assert split.score == pytest.approx(float(q[0] @ d[0]), rel=1e-5)


def test_lens_last_stream_is_the_vector_bit_for_bit(random_mlm):
    """The lens' last stream is the SPLADE vector, bit for bit; its table lists the top terms of each stream."""
    _, folder = random_mlm
    model = load(folder)
    streams = splade_streams(model, TEXTS, batch_size=2)
    vectors = splade_vectors(model, TEXTS, batch_size=2)
    assert streams.streams == [0, 1, 2, 3] and torch.equal(streams.weights[-1], vectors)
    assert streams.positions.dtype == torch.int32 and splade_streams(model, TEXTS, positions=False).positions is None
    table = splade_lens(model, TEXTS, k=5, batch_size=2)
    assert list(table.columns) == ["text", "stream", "hook", "rank", "term", "token_id", "weight", "position",
                                   "source", "n_active"]  # fmt: skip
    last = table[table["stream"] == 3]
    for text in range(len(TEXTS)):
        top = torch.topk(vectors[text], 5)
        rows = last[last["text"] == text]
        assert rows["token_id"].tolist() == top.indices.tolist()
        assert rows["weight"].tolist() == top.values.tolist()  # the same float32 values, not recomputed
        assert rows["n_active"].iloc[0] == int((vectors[text] > 0).sum())
    assert set(table["hook"]) == {"blocks.0.hook_resid_pre", *(f"blocks.{i}.hook_resid_post" for i in range(3))}
    overlap = lens_overlap(table)
    assert (overlap.loc[overlap["stream"] == 3, "share"] == 1.0).all()


def test_lens_overlap_counts_final_terms():
    """``lens_overlap`` counts, per stream, the final stream's listed terms that the stream lists too."""
    rows = [(0, 0, "h0", 1, "a", 1, 2.0, 1, "x", 9), (0, 0, "h0", 2, "b", 2, 1.0, 1, "x", 9),
            (0, 1, "h1", 1, "b", 2, 3.0, 1, "x", 4), (0, 1, "h1", 2, "c", 3, 2.0, 2, "y", 4),
            (0, 2, "h2", 1, "c", 3, 5.0, 2, "y", 2), (0, 2, "h2", 2, "d", 4, 1.0, 1, "x", 2)]  # fmt: skip
    table = pd.DataFrame(rows, columns=["text", "stream", "hook", "rank", "term", "token_id", "weight", "position",
                                        "source", "n_active"])  # fmt: skip
    out = lens_overlap(table)
    assert out["overlap"].tolist() == [0, 1, 2] and out["share"].tolist() == [0.0, 0.5, 1.0]
    assert out["n_active"].tolist() == [9, 4, 2] and (out["k"] == 2).all()
    with pytest.raises(ValueError, match="splade_lens table"):
        lens_overlap(table.drop(columns="rank"))


def test_refusals(random_mlm, bundled):
    """Bad input is refused in one line: no texts, a bad batch size or k, a stream out of range, no MLM head."""
    _, folder = random_mlm
    model = load(folder)
    for call, match in [
        (lambda: splade_vectors(model, []), "non-empty list of strings"),
        (lambda: splade_vectors(model, ["a", 3]), "non-empty list of strings"),
        (lambda: splade_vectors(model, "a", batch_size=0), "batch_size"),
        (lambda: splade_lens(model, "a", k=0), "k must be"),
        (lambda: splade_streams(model, "a", streams=[4]), "stream must be in 0..3"),
        (lambda: splade_streams(model, "a", streams=[]), "at least one stream"),
        (lambda: score_split(model, ["a"], "b"), "one string"),
    ]:
        with pytest.raises(ValueError, match=match) as err:
            call()
        assert "\n" not in str(err.value)
    with pytest.raises(NoMLMHeadError, match="has no masked-LM head"):
        splade_vectors(bundled, "a")


def test_lens_finds_the_term_written_by_the_last_block(planted):
    """The vocabulary lens lists "animal" (cat) and "end" ([SEP]) at every stream with the same weight, and "late"
    only at the last stream, where the last block's MLP writes dog's new direction; the overlap with the final top
    terms is 2 of 3 before the last block."""
    model, _ = planted
    table = splade_lens(model, ["the cat", "a dog and a cat"], k=5)
    last = model.config.n_layers
    late = table[table["term"] == "late"]
    assert late["stream"].tolist() == [last] and late["text"].tolist() == [1]
    assert late["source"].tolist() == ["dog"] and late["weight"].iloc[0] == pytest.approx(math.log1p(4.0), abs=1e-4)
    for term, logit in (("animal", 5.0), ("end", 2.0)):
        rows = table[(table["term"] == term) & (table["text"] == 1)]
        assert rows["stream"].tolist() == list(range(last + 1))
        assert rows["weight"].tolist() == pytest.approx([math.log1p(logit)] * (last + 1), abs=1e-4)
    assert set(table["term"]) == {"animal", "end", "late"}
    overlap = lens_overlap(table)
    dog = overlap[overlap["text"] == 1]
    assert dog["overlap"].tolist() == [2] * last + [3]
    assert dog["share"].tolist() == pytest.approx([2 / 3] * last + [1.0])
    assert dog["n_active"].tolist() == [2] * last + [3]
