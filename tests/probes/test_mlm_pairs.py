"""Minimal pairs (``bertscope.probes.lens.pairs``): reading BLiMP's TSV and JSONL, refusals, known answers on the
lookup-table MLM (raw vs length-normalised), accuracy with intervals, per-stream scores."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from bertscope.models import load
from bertscope.probes.lens.pairs import first_preferring_stream, pair_accuracy, read_pairs, score_pairs
from helpers import save_tiny_bert
from mlm_fixtures import TableMLM

BLIMP = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "blimp" / "blimp.tsv.gz"


def _cat_model() -> TableMLM:
    """Every cell of the table predicts "cat" (logit 10) and nothing else (logit 0): PLL ~ -0.5 per "cat" and
    ~ -10.3 per other piece."""
    model = TableMLM()
    with torch.no_grad():
        model.table.zero_()
        model.table[:, model.tokenizer.convert_tokens_to_ids("cat")] = 10.0
        model.mlm_head.zero_()
    return model


def test_known_answers_raw_and_normalised():
    pairs = [("the cat sat .", "the dog sat ."), ("a cat", "a dog"), ("the dog sat .", "the cat sat ."),
             ("the cat sat .", "the sat .")]  # fmt: skip
    table = read_pairs_from(pairs)
    scores = score_pairs(_cat_model(), table, batch_size=3)
    assert scores["win"].tolist() == [True, True, False, False]  # the last: the bad sentence is one piece shorter
    assert scores["win_normalised"].tolist() == [True, True, False, True]
    assert scores[["n_good", "n_bad"]].to_numpy().tolist() == [[4, 4], [2, 2], [4, 4], [4, 3]]
    acc = pair_accuracy(scores, by=(), n_boot=200).set_index("score")
    assert acc.loc["raw", "accuracy"] == 0.5 and acc.loc["normalised", "accuracy"] == 0.75
    assert (acc["low"] <= acc["accuracy"]).all() and (acc["accuracy"] <= acc["high"]).all()


def read_pairs_from(pairs):
    """``read_pairs`` of a JSONL file in BLiMP's own format holding ``pairs`` (good, bad)."""
    import tempfile

    path = Path(tempfile.mkdtemp()) / "pairs.jsonl"
    path.write_text("".join(json.dumps({"sentence_good": g, "sentence_bad": b, "UID": "p"}) + "\n" for g, b in pairs))
    return read_pairs(path)


def test_read_pairs_formats_and_refusals(tmp_path):
    tsv = tmp_path / "p.tsv.gz"
    with gzip.open(tsv, "wt") as f:
        f.write("good\tbad\tparadigm\nA cat sat.\tA cat sit.\tagreement\n")
    got = read_pairs(tsv)
    assert got[["good", "bad", "paradigm", "field"]].values.tolist() == [["A cat sat.", "A cat sit.", "agreement", ""]]
    bad = tmp_path / "bad.tsv"
    bad.write_text("first\tsecond\nx\ty\n")
    with pytest.raises(ValueError, match="no good or bad sentence column"):
        read_pairs(bad)
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"good": "x", "bad": " "}) + "\n")
    with pytest.raises(ValueError, match="empty sentence"):
        read_pairs(empty)
    with pytest.raises(ValueError, match=".tsv or .jsonl"):
        read_pairs(_touch(tmp_path / "p.csv"))
    with pytest.raises(ValueError, match="no pairs file"):
        read_pairs(tmp_path / "absent.tsv")


def _touch(path: Path) -> Path:
    path.write_text("good,bad\n")
    return path


@pytest.mark.skipif(not BLIMP.exists(), reason=f"BLiMP is not at {BLIMP} (the shared data folder is absent)")
def test_reads_blimp():
    pairs = read_pairs(BLIMP)
    assert len(pairs) == 67_000 and pairs["paradigm"].nunique() == 67
    assert set(pairs["field"]) >= {"syntax", "morphology", "semantics"}


def test_streams_end_with_the_model(tmp_path):
    """Per-stream scores: the last stream's are the model's own; the first preferring stream is read from them."""
    save_tiny_bert(tmp_path, transformers.BertForMaskedLM)
    model = load(tmp_path)
    pairs = read_pairs_from([("The cat sat on the mat.", "The cat sit on the mat."), ("A dog!", "A dogs!")])
    plain = score_pairs(model, pairs)
    streams = score_pairs(model, pairs, streams=True, batch_size=5)
    last = streams[streams["stream"] == model.config.n_layers].reset_index(drop=True)
    np.testing.assert_allclose(last["pll_good"], plain["pll_good"], rtol=0, atol=1e-6)
    acc = pair_accuracy(streams, n_boot=50)
    assert sorted(acc["stream"].unique()) == list(range(model.config.n_layers + 1))
    first = first_preferring_stream(acc)["first_stream"]
    assert len(first) == 1 and -1 <= first.iloc[0] <= model.config.n_layers
