"""Pseudo-log-likelihood (``bertscope.probes.lens.pll``): a known answer on a model whose head is a lookup table, the
batched computation equal to the brute-force loop to 1e-6 at any batch size, both methods, refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from bertscope.models import load
from bertscope.probes.lens import NoMLMHeadError, pll_loop, pseudo_log_likelihood, token_pll
from family_fixtures import save_tiny_family
from helpers import save_tiny_bert
from mlm_fixtures import M, TableMLM

SENTENCES = [
    "The cat sat on the mat.",
    "Tokenization splits unbelievably uncommon words into several pieces.",
    "A dog!",
    "Where is the station? It is two blocks north of the old cathedral.",
]
def _expected(model: TableMLM, sentence: str, method: str, bias: bool = True) -> float:
    """The answer from the table: every piece but [CLS]/[SEP] scored at its position with 1 mask (``original``) or
    1 + the number of ``##`` pieces after it in its word (``within_word_l2r``)."""
    pieces = model.tokenizer.tokenize(sentence)
    ids = model.tokenizer.convert_tokens_to_ids(pieces)
    with torch.no_grad():
        logp = torch.log_softmax((model.table + (model.mlm_head if bias else 0)).double(), dim=-1)
    total = 0.0
    for i in range(len(pieces)):
        later = 0
        while method == "within_word_l2r" and i + 1 + later < len(pieces) and pieces[i + 1 + later].startswith("##"):
            later += 1
        total += float(logp[(i + 1) * M + 1 + later, ids[i]])  # position i + 1: after [CLS]
    return total


@pytest.mark.parametrize("method", ["original", "within_word_l2r"])
@pytest.mark.parametrize("bias", [True, False])
def test_lookup_table_known_answer(method, bias):
    model = TableMLM()
    assert len(model.tokenizer.tokenize(SENTENCES[1])) > len(SENTENCES[1].split()) + 1  # words in several pieces
    got = pseudo_log_likelihood(model, SENTENCES, method, batch_size=5, bias=bias)
    expected = [_expected(model, s, method, bias) for s in SENTENCES]
    np.testing.assert_allclose(got["pll"].to_numpy(), expected, rtol=0, atol=1e-9)
    assert got["n_tokens"].tolist() == [len(model.tokenizer.tokenize(s)) for s in SENTENCES]


def test_methods_differ_only_on_words_in_pieces():
    model = TableMLM()
    a = token_pll(model, SENTENCES, "original")
    b = token_pll(model, SENTENCES, "within_word_l2r")
    differs = (a["logprob"] != b["logprob"]).to_numpy()
    assert np.array_equal(differs, (b["n_masked"] > 1).to_numpy())
    assert differs.any() and (b.loc[~differs, "n_masked"] == 1).all()


@pytest.fixture(scope="module", params=["bert", "roberta"])
def tiny_mlm(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    if request.param == "bert":
        save_tiny_bert(folder, transformers.BertForMaskedLM)
    else:
        save_tiny_family(request.param, folder, head="mlm")
    model = load(folder)
    with torch.no_grad():  # random head bias, so that bias on/off differ
        model.mlm_head.bias.copy_(torch.randn(model.mlm_head.bias.shape, generator=torch.Generator().manual_seed(2)))
    return model


@pytest.mark.parametrize("method", ["original", "within_word_l2r"])
def test_batched_equals_brute_force(tiny_mlm, method):
    reference = pll_loop(tiny_mlm, SENTENCES, method)
    for batch_size in (1, 3, 7, 1000):
        got = token_pll(tiny_mlm, SENTENCES, method, batch_size=batch_size)
        assert got[["sentence", "position", "token_id"]].equals(reference[["sentence", "position", "token_id"]])
        np.testing.assert_allclose(got["logprob"], reference["logprob"], rtol=0, atol=1e-6)
    sentences = pseudo_log_likelihood(tiny_mlm, SENTENCES, method, batch_size=3)
    np.testing.assert_allclose(sentences["pll"], reference.groupby("sentence")["logprob"].sum(), rtol=0, atol=1e-6)


def test_streams_end_with_the_model_and_bias_matters(tiny_mlm):
    plain = token_pll(tiny_mlm, SENTENCES[:2], batch_size=4)
    streams = token_pll(tiny_mlm, SENTENCES[:2], batch_size=4, streams=True)
    n = tiny_mlm.config.n_layers
    assert sorted(streams["stream"].unique()) == list(range(n + 1))
    np.testing.assert_allclose(streams.loc[streams["stream"] == n, "logprob"], plain["logprob"], rtol=0, atol=1e-6)
    unbiased = token_pll(tiny_mlm, SENTENCES[:2], batch_size=4, bias=False)
    assert not np.allclose(unbiased["logprob"], plain["logprob"])


def test_refusals(tmp_path):
    with pytest.raises(NoMLMHeadError, match="has no masked-LM head"):
        pseudo_log_likelihood(load(), SENTENCES)
    model = TableMLM()
    with pytest.raises(ValueError, match="unknown PLL method"):
        token_pll(model, SENTENCES, "left_to_right")
    with pytest.raises(ValueError, match="batch_size"):
        token_pll(model, SENTENCES, batch_size=0)
    with pytest.raises(TypeError, match="list of strings"):
        token_pll(model, "one sentence")
