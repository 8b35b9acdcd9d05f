"""What an experiment used is what the manifest and the report say (issue 40 items 2 and 6): each experiment
records its counts (`Context.record_used`, ``notes["used"]``), the report's "sentences used" and its
under-100-sentences caveat read them, and a corpus much larger than what is used gets one line saying so and how
to use more."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bertscope.experiments.report_findings import SMALL_SAMPLE, sample_caveat, sample_size
from test_cli import bertscope

ERASURE_SMALL = ["--set", "erasure.n_train=12", "--set", "erasure.n_eval=6", "--set", "erasure.n_boot=10", "--set",
                 "erasure.structural_epochs=2", "--set", "erasure.methods=leace", "--set", "erasure.concepts=position",
                 "--set", "erasure.erase_layers=1", "--set", "erasure.sublayers=attn_out"]  # fmt: skip
STRUCTURE_SMALL = ["--set", "structure.n_train=20", "--set", "structure.n_dev=4", "--set", "structure.n_test=6",
                   "--set", "structure.n_boot=20", "--set", "structure.random_weights=false", "--set",
                   "structure.ranks=1", "--set", "structure.max_epochs=2", "--set", "structure.sublayers=false",
                   "--set", "structure.workers=1"]  # fmt: skip


def test_erasure_records_the_sentences_it_used_and_the_caveat_fires_from_them(
    capsys: pytest.CaptureFixture[str], tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Before: the report said erasure used the run corpus's size (3,000 on builtin) while it used 150 + 80, so
    the sample-size caveat never fired. Now: the counts it trained and evaluated on, and the caveat from them."""
    out = tmp_path / "out"
    code, _, err = bertscope(capsys, "run", "erasure", "--model", tiny_model_dir, "--max-sentences", "300", "--out",
                             out, "--device", "cpu", "--quiet", "--no-report", *ERASURE_SMALL)
    assert code == 0, err
    manifest = json.loads((out / "erasure" / "manifest.json").read_text())
    assert manifest["corpus"]["n_sentences"] == 300
    assert manifest["notes"]["used"]["counts"] == {"train": 12, "eval": 6}
    assert manifest["notes"]["erase_layers"] == [1]
    size = sample_size(manifest)
    assert size.smallest == 6 and size.text == "train 12; eval 6"
    assert "as few as 6 sentences" in sample_caveat({"erasure": size})


def test_circuits_counts_pairs_not_sentences_in_the_report() -> None:
    manifest = {"corpus": {"n_sentences": 3000}, "notes": {"used": {"unit": "TFC1 pairs (one sentence each)",
                                                                     "counts": {"pairs": 16}}}}  # fmt: skip
    size = sample_size(manifest)
    assert size.smallest == 16 < SMALL_SAMPLE and size.text == "TFC1 pairs (one sentence each): pairs 16"


def test_a_corpus_much_larger_than_the_default_sizes_gets_one_line_and_a_manifest_record(
    capsys: pytest.CaptureFixture[str], tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Before: `run structure` on the 12,544 sentences of EWT train trained on 400 and scored 200 without a word.
    Now one line says what is used of how many, and the option that raises it; the manifest records both."""
    out = tmp_path / "out"
    code, _, err = bertscope(capsys, "run", "structure", "--model", tiny_model_dir, "--max-sentences", "200",
                             "--out", out, "--device", "cpu", "--no-report", *STRUCTURE_SMALL)
    assert code == 0, err
    lines = [line for line in err.splitlines() if " uses " in line]
    assert lines == ["[structure] uses 30 sentences (train 20, dev 4, test 6) of the 200 sentences of builtin; to "
                     "use more: --set structure.n_train=N (and structure.n_dev, structure.n_test)"]
    used = json.loads((out / "structure" / "manifest.json").read_text())["notes"]["used"]
    assert used["counts"] == {"train": 20, "dev": 4, "test": 6} and used["available"] == 200
    assert used["more"].startswith("--set structure.n_train=N")

    # a corpus that is not much larger than what is used: no such line (still recorded)
    code, _, err = bertscope(capsys, "run", "structure", "--model", tiny_model_dir, "--max-sentences", "60",
                             "--out", tmp_path / "small", "--device", "cpu", "--no-report", *STRUCTURE_SMALL)
    assert code == 0, err
    assert not [line for line in err.splitlines() if " uses " in line]
    used = json.loads((tmp_path / "small" / "structure" / "manifest.json").read_text())["notes"]["used"]
    assert used["available"] == 60
