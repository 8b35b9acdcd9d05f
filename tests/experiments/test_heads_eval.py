"""`bertscope run heads --eval-corpus`: every selection (best head and direction per relation, the baseline offset,
each head's direction for the syntactic role, which relations are listed) is made on --corpus and every reported
syntax number comes from the evaluation corpus. Known answers on planted arc hits, and two runs that differ only
in the evaluation corpus make identical selections."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from bertscope.experiments import corpus as corpus_mod
from bertscope.experiments import heads
from bertscope.experiments.heads import experiment as heads_experiment
from bertscope.experiments.heads import syntax as syn
from bertscope.experiments.options import Inputs, RunOptions, corpus_summary, model_summary
from bertscope.experiments.runner import run_experiment

from bertscope import models

SMALL = heads_experiment.Settings(importance_sentences=4, importance_batch=4, gradient_batch=4, workers=1,
                                  methods=("zero",), n_boot=20, pruning_points=2, pruning_random_orders=2,
                                  distance_sentences=4, syntax_min_arcs=2)  # fmt: skip


def planted(n_sentences: int, good: tuple[int, int], rate: float, seed: int, relation: str = "nsubj",
            extra: str | None = None) -> syn.ArcHits:
    """Two arcs per sentence on a 2-layer x 3-head model: head ``good`` (dep->head) hits every arc, every other
    candidate hits with probability ``rate``; offset +1 hits half the arcs. ``extra`` adds one arc of that
    relation to each sentence."""
    rng = np.random.default_rng(seed)
    n = 2 * n_sentences
    hits = rng.random((n, 2, 3, 2)) < rate
    hits[:, good[0], good[1], 0] = True
    offsets = np.zeros((n, len(syn.BASELINE_OFFSETS)), dtype=bool)
    offsets[::2, syn.BASELINE_OFFSETS.index(1)] = True
    relations = np.full(n, relation, dtype=object)
    sentences = np.repeat(np.arange(n_sentences), 2)
    if extra is not None:
        hits = np.concatenate([hits, np.ones((n_sentences, 2, 3, 2), dtype=bool)])
        offsets = np.concatenate([offsets, np.zeros((n_sentences, len(syn.BASELINE_OFFSETS)), dtype=bool)])
        relations = np.concatenate([relations, np.full(n_sentences, extra, dtype=object)])
        sentences = np.concatenate([sentences, np.arange(n_sentences)])
    return syn.ArcHits(hits, offsets, relations, sentences)


def test_syntax_table_eval_chooses_on_the_selection_corpus_and_scores_on_the_other() -> None:
    select = planted(30, good=(0, 1), rate=0.2, seed=0)
    # evaluation corpus: another head is the perfect one; (0, 1) is right on exactly half the arcs
    evaluate = planted(20, good=(1, 2), rate=0.0, seed=1, extra="obj")
    evaluate.head_hits[::2, 0, 1, 0] = True
    table = syn.syntax_table_eval(select, evaluate, min_arcs=2, n_boot=50, select_name="train", eval_name="dev")
    nsubj = table.set_index("relation").loc["nsubj"]
    assert (nsubj["layer"], nsubj["head"], nsubj["direction"]) == (0, 1, "dep->head")  # chosen on train
    assert nsubj["accuracy"] == 1.0 and nsubj["n_select"] == 60  # in-sample, on train
    assert nsubj["heldout_accuracy"] == pytest.approx(0.5) and nsubj["n"] == 40  # scored on dev only
    assert nsubj["heldout_baseline_accuracy"] == pytest.approx(0.5)  # offset +1, chosen on train
    assert nsubj["heldout_accuracy_low"] <= 0.5 <= nsubj["heldout_accuracy_high"]
    assert "obj" not in set(table["relation"])  # listed relations are decided on train alone
    assert (table["selection"] == "chosen on train, scored on dev").all()
    # another evaluation corpus: the same choices and in-sample columns, other reported numbers
    other = planted(20, good=(1, 2), rate=0.0, seed=2)
    again = syn.syntax_table_eval(select, other, min_arcs=2, n_boot=50, select_name="train", eval_name="dev")
    chosen = ["relation", "layer", "head", "direction", "accuracy", "baseline_offset", "baseline_accuracy", "gain"]
    pd.testing.assert_frame_equal(table[chosen], again[chosen])
    assert again.set_index("relation").loc["nsubj", "heldout_accuracy"] == 0.0


def test_head_gains_eval_choose_each_direction_on_the_selection_corpus() -> None:
    select = planted(30, good=(0, 1), rate=0.0, seed=0)
    evaluate = planted(20, good=(0, 1), rate=0.0, seed=1)
    evaluate.head_hits[:, 0, 1, 0] = False  # dep->head (chosen on train) now misses every arc ...
    evaluate.head_hits[:, 0, 1, 1] = True  # ... and head->dep (never chosen) hits every one
    gains = syn.heldout_head_gains_eval(select, evaluate, min_arcs=2, n_boot=50, select_name="a", eval_name="b")
    row = gains.query("layer == 0 and head == 1").iloc[0]
    assert row["heldout_accuracy"] == 0.0 and row["n"] == 40 and row["n_sentences"] == 20
    assert row["heldout_gain"] == pytest.approx(-0.5)
    assert (gains["selection"] == "chosen on a, scored on b").all()


@pytest.fixture(scope="module")
def tiny(tiny_config: models.EncoderConfig, tokenizer) -> models.Encoder:
    return models.random_encoder(tiny_config, seed=0, tokenizer=tokenizer)


def run_eval(model, out: Path, monkeypatch, train, evaluate) -> Path:
    monkeypatch.setattr(heads, "Settings", lambda: SMALL)
    monkeypatch.setattr(heads, "plot", lambda out_dir: [])  # figures: tests/experiments/test_heads_run.py
    inputs = Inputs(model, train, torch.device("cpu"), torch.float32, model_summary(model), corpus_summary(train))
    inputs.eval_corpus, inputs.eval_corpus_info = evaluate, corpus_summary(evaluate)
    result = run_experiment(heads, RunOptions(out=out, quiet=True), inputs)
    assert result.status == "complete", result.error
    return out / heads.DIRNAME


def test_two_runs_differing_only_in_the_eval_corpus_make_the_same_selections(tiny, tmp_path, monkeypatch) -> None:
    corpus = corpus_mod.load_corpus("builtin", max_sentences=36)
    train = corpus_mod.load_corpus(corpus_mod.write_conllu(corpus[:16], tmp_path / "train.conllu"))
    eval_a = corpus_mod.load_corpus(corpus_mod.write_conllu(corpus[16:26], tmp_path / "dev_a.conllu"))
    eval_b = corpus_mod.load_corpus(corpus_mod.write_conllu(corpus[26:36], tmp_path / "dev_b.conllu"))
    out_a = run_eval(tiny, tmp_path / "a", monkeypatch, train, eval_a)
    out_b = run_eval(tiny, tmp_path / "b", monkeypatch, train, eval_b)
    sa, sb = (pd.read_csv(o / "syntax.csv") for o in (out_a, out_b))
    chosen = ["relation", "layer", "head", "direction", "accuracy", "baseline_offset", "baseline_accuracy", "gain",
              "n_select"]  # fmt: skip
    pd.testing.assert_frame_equal(sa[chosen], sb[chosen])
    assert not np.allclose(sa["heldout_accuracy"], sb["heldout_accuracy"], equal_nan=True)
    assert (sa["selection"] == "chosen on train, scored on dev_a").all() and (sa["eval_corpus"] == "dev_a").all()
    # the selection alone, on the training corpus: what the eval run chose, with no evaluation sentence
    ra = pd.read_parquet(out_a / "results.parquet")
    stats = ra[ra["metric"].isin(["mass_cls", "entropy"]) | ra["metric"].str.startswith("syntax:")]
    assert set(stats["corpus"]) == {"dev_a"}  # reported numbers: the evaluation corpus
    assert set(ra.loc[ra["metric"].str.startswith("ablation:"), "corpus"]) == {"train"}
    nsubj_a = stats[stats["metric"] == "syntax:nsubj:dep->head"]
    assert int(nsubj_a["n"].iloc[0]) == sum(r == "nsubj" for s in eval_a for r in s.deprels)
    top_a, top_b = (pd.read_csv(o / "top_heads.csv") for o in (out_a, out_b))
    pd.testing.assert_frame_equal(top_a, top_b)  # the importance pass stays on --corpus
    assert (top_a["corpus"] == "train").all()
    special = next(f for f in heads.findings(out_a) if f.claim == "specialisation")
    assert "chosen on train beats the best fixed-offset baseline (offset also chosen there) on dev_a" in special.text


def test_an_eval_corpus_without_trees_is_refused(tiny, tmp_path) -> None:
    from bertscope.experiments.registry import CannotRun

    text = tmp_path / "plain.txt"
    text.write_text("The cat sat on the mat.\nDogs bark, cats sleep.\n")
    train = corpus_mod.load_corpus("builtin", max_sentences=8)
    inputs = Inputs(tiny, train, torch.device("cpu"), torch.float32, model_summary(tiny), corpus_summary(train))
    inputs.eval_corpus = corpus_mod.load_corpus(str(text))
    with pytest.raises(CannotRun, match="no gold dependency trees"):
        heads_experiment.check(inputs, SMALL)
