"""The minimal-pairs experiment: known answers (a constructed MLM whose lens prefers the good sentence from layer
K on: the per-layer table flips at K; a lookup-table head whose PLL is computed by hand), the batched per-stream
scores against a brute-force loop, the builtin pairs, and a whole run through the runner."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
import transformers
from bertscope.experiments import minimal_pairs
from bertscope.experiments.corpus import load_corpus
from bertscope.experiments.corpus.pairs import pairs_from_rows
from bertscope.experiments.minimal_pairs import data, measures
from bertscope.experiments.options import Inputs, RunOptions, corpus_summary, model_summary
from bertscope.experiments.runner import run_experiment
from bertscope.probes.lens import hidden_states, logit_lens, pseudo_log_likelihood
from mlm_fixtures import ANSWER, N_LAYERS, K, TableMLM, V, constructed_mlm

METHODS = ("original", "within_word_l2r")
#: The constructed MLM's 16 pieces: token j's embedding is 3 e_j; "bird" is its ANSWER (id 11).
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "a", "cat", "dog", "sat", "ran", "bird", "sang", "on",
         "mat", "."]  # fmt: skip
PLANTED = [("the bird sang .", "the dog sang ."), ("a bird sat on", "a cat sat on"), ("bird ran .", "cat ran ."),
           ("the cat sat bird", "the cat sat dog"), ("a dog ran bird .", "a dog ran mat ."),
           ("bird sat on mat", "dog sat on mat")]  # fmt: skip


def planted_model() -> torch.nn.Module:
    """`constructed_mlm` with a WordPiece tokenizer over its 16 pieces: at a masked position streams 0..K-1 hold
    the mask token's direction alone (every target piece equally likely: good and bad tie), streams K.. also
    ``100 e_bird`` (written by block K-1's MLP), so a sentence with "bird" where its pair has another word wins."""
    assert WORDS[ANSWER] == "bird" and len(WORDS) == V
    model = constructed_mlm()
    model.tokenizer = transformers.BertTokenizerFast(vocab={w: i for i, w in enumerate(WORDS)}, do_lower_case=True)
    model.source = "a constructed MLM (answer from layer K)"
    return model


def _rows(pairs, paradigm="planted", field="syntax"):
    return [{"good": g, "bad": b, "paradigm": paradigm, "field": field} for g, b in pairs]


def test_lens_prefers_the_good_sentence_from_layer_k_on():
    model = planted_model()
    pairs = data.pairs_table(pairs_from_rows("planted", _rows(PLANTED), data.PAIRS))
    arrays = data.pair_pll(model, list(pairs.good), list(pairs.bad), METHODS, batch_size=5, streams=True)
    assert arrays["pll"].shape == (2, N_LAYERS + 1, 2 * len(PLANTED))
    rows = measures.pair_rows(pairs, arrays["pll"], arrays["n_tokens"], METHODS)
    layers = measures.accuracy_table(rows, n_boot=100, seed=0)
    overall = layers[(layers.level == "overall") & (layers.score == "raw")].set_index(["method", "stream"])
    for method in METHODS:
        got = [overall.loc[(method, s), "accuracy"] for s in range(N_LAYERS + 1)]
        assert got == [0.0] * K + [1.0] * (N_LAYERS + 1 - K), (method, got)  # ties below K are not wins
    first = measures.first_layer(layers)
    assert (first["first_stream"] == K).all(), first
    results = measures.results_table(rows)
    assert results["win"].all() and results["win_normalised"].all() and len(results) == 2 * len(PLANTED)


def test_stream_scores_equal_a_brute_force_loop(tiny_mlm):
    """Every stream's PLL (stream 0 read once per distinct row) against one forward per masked copy and the lens
    read at the masked position; the last stream against the library's PLL."""
    sentences = ["The cat sleeps on the mat.", "Nobody has ever seen a ghost.", "The keys are lost."]
    arrays = data.pair_pll(tiny_mlm, sentences[:2], sentences[1:], ["original"], batch_size=4, streams=True)
    texts = [*sentences[:2], *sentences[1:]]
    tok = tiny_mlm.tokenizer
    for t, text in enumerate(texts):
        ids = tok(text, return_tensors="pt")["input_ids"]
        want = np.zeros(tiny_mlm.config.n_layers + 1)
        for p in range(1, ids.shape[1] - 1):
            masked = ids.clone()
            masked[0, p] = tok.mask_token_id
            hidden = hidden_states(tiny_mlm, masked, torch.ones_like(masked))[:, 0, p]  # [stream, d_model]
            with torch.no_grad():
                want += torch.log_softmax(logit_lens(tiny_mlm, hidden).double(), -1)[:, ids[0, p]].numpy()
        np.testing.assert_allclose(arrays["pll"][0, :, t], want, rtol=0, atol=1e-6)
    lib = pseudo_log_likelihood(tiny_mlm, texts, "original")
    np.testing.assert_allclose(arrays["pll"][0, -1], lib["pll"], rtol=0, atol=1e-6)
    assert arrays["n_tokens"][0].tolist() == lib["n_tokens"].tolist()


def _by_hand(model: TableMLM, text: str, method: str) -> float:
    """The lookup-table head's PLL: piece at position p of a copy with m masks scores row (p, m) of the table."""
    from mlm_fixtures import M

    enc = model.tokenizer(text)
    ids, words = enc["input_ids"], enc.word_ids()
    logp = torch.log_softmax((model.table + model.mlm_head).detach().double(), -1)
    total = 0.0
    for p in range(1, len(ids) - 1):
        masks = 1 + (sum(1 for j in range(p + 1, len(ids) - 1) if words[j] == words[p])
                     if method == "within_word_l2r" else 0)
        total += float(logp[p * M + masks, ids[p]])
    return total


def test_lookup_table_head_known_pll_and_wins():
    model = TableMLM()
    good = ["The cat sleeps.", "Unbelievably, nobody came."]
    bad = ["The cat sleep.", "Unbelievably, somebody came."]
    arrays = data.pair_pll(model, good, bad, METHODS, batch_size=3, streams=False)
    for i, method in enumerate(METHODS):
        want = [_by_hand(model, s, method) for s in [*good, *bad]]
        np.testing.assert_allclose(arrays["pll"][i, 0], want, rtol=0, atol=1e-9)
    assert not np.allclose(arrays["pll"][0, 0], arrays["pll"][1, 0])  # "Unbelievably" is split into pieces
    pairs = pd.DataFrame({"pair": [0, 1], "good": good, "bad": bad, "paradigm": "p", "field": "f", "phenomenon": "x"})
    results = measures.results_table(measures.pair_rows(pairs, arrays["pll"], arrays["n_tokens"], METHODS))
    assert results["win"].tolist() == (results["pll_good"] > results["pll_bad"]).tolist()
    norm = results["pll_good"] / results["n_good"] > results["pll_bad"] / results["n_bad"]
    assert results["win_normalised"].tolist() == norm.tolist()


def test_length_control_groups_by_the_sign_of_the_piece_difference():
    results = pd.DataFrame({"method": "original", "good": ["a b", "a b c", "a"], "bad": ["a b c", "a b", "b"],
                            "piece_difference": [1, -1, 0], "word_difference": [1, -1, 0],
                            "win": [True, False, True], "win_normalised": [False, True, True]})
    table = measures.length_control(results, n_boot=50, seed=0)
    pieces = table[table.unit == "pieces"].set_index(["difference", "score"])["accuracy"]
    assert pieces[("bad longer", "raw")] == 1.0 and pieces[("bad longer", "normalised")] == 0.0
    assert pieces[("bad shorter", "raw")] == 0.0 and pieces[("bad shorter", "normalised")] == 1.0
    assert pieces[("same length", "raw")] == 1.0


def test_builtin_pairs_are_minimal():
    pairs = data.pairs_table(data.builtin_pairs())
    assert len(pairs) == 30 and pairs["good"].is_unique
    assert set(pairs["field"]) == {"morphology", "semantics", "syntax"}
    for g, b in zip(pairs["good"], pairs["bad"], strict=True):  # one word differs
        gw, bw = g.split(), b.split()
        assert len(gw) == len(bw) and sum(x != y for x, y in zip(gw, bw, strict=True)) == 1, (g, b)


def test_settings_refuse_unknown_methods():
    with pytest.raises(ValueError, match="methods"):
        minimal_pairs.Settings(methods=("l2r",))
    with pytest.raises(ValueError, match="batch_rows"):
        minimal_pairs.Settings(batch_rows=0)


def test_run_writes_tables_that_hold_the_planted_answer(tmp_path):
    model = planted_model()
    corpus = load_corpus("builtin", max_sentences=10)
    pairs = pairs_from_rows("planted pairs", _rows(PLANTED[:3], "p1", "f1") + _rows(PLANTED[3:], "p2", "f2"),
                            data.PAIRS)
    inputs = Inputs(model, corpus, torch.device("cpu"), torch.float32, model_summary(model), corpus_summary(corpus),
                    pairs=pairs)
    result = run_experiment(minimal_pairs, RunOptions(out=tmp_path, quiet=True, max_length=8), inputs)
    assert result.status == "complete", result.error
    folder = tmp_path / minimal_pairs.DIRNAME
    results = pd.read_parquet(folder / "results.parquet")
    assert len(results) == 2 * len(PLANTED) and results["win"].all()
    assert set(results["corpus"]) == {"planted pairs"}
    first = pd.read_csv(folder / "first_layer.csv")
    assert (first["first_stream"] == K).all()
    for name in ("fig_paradigm_accuracy", "fig_layer_accuracy", "fig_raw_vs_normalised"):
        assert (folder / f"{name}.png").is_file(), name
    texts = [f.text for f in minimal_pairs.findings(folder)]
    assert any(f"from layer {K} on" in t for t in texts), texts
    assert any("1.00 [1.00, 1.00]" in t for t in texts)
    assert not math.isnan(pd.read_csv(folder / "summary.csv")["accuracy"].iloc[0])


@pytest.fixture(scope="module")
def tiny_mlm(tmp_path_factory):
    from bertscope.models import load
    from helpers import save_tiny_bert

    folder = tmp_path_factory.mktemp("tiny-mlm")
    save_tiny_bert(folder, transformers.BertForMaskedLM)
    return load(folder)


def test_win_shares_is_the_pair_bootstrap():
    """The outcome-count bootstrap of `pair_accuracy` against resampling the pairs themselves
    (`probes.bootstrap.ratio_of_sums`): same point value, bounds equal within Monte Carlo error."""
    from bertscope.probes.bootstrap import ratio_of_sums
    from bertscope.probes.lens.pairs import win_shares

    rng = np.random.default_rng(3)
    wins = np.stack([rng.random(300) < 0.7, rng.random(300) < 0.55], 1)
    value, low, high = win_shares(wins, n_boot=4000, seed=1)
    ref = ratio_of_sums(wins.astype(float), np.ones((300, 1)), n_boot=4000, seed=2)
    np.testing.assert_array_equal(value, ref.value)
    np.testing.assert_allclose(low, ref.low, atol=0.012)
    np.testing.assert_allclose(high, ref.high, atol=0.012)
    assert (high - low > 0.08).all()  # 95% of a share near 0.6 over 300 pairs is about +-0.055
    one = win_shares(np.ones((5, 2), dtype=bool), n_boot=50)
    assert one[0].tolist() == [1.0, 1.0] and one[1].tolist() == [1.0, 1.0]
