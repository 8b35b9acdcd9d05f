"""``bertscope run minimal-pairs``: refused in one line (exit 2, nothing written) for a model without a masked-LM
head and for a bad pairs file; TSV (BLiMP's header) and JSONL (BLiMP's keys) pairs files read; BLiMP itself when
the shared data folder is present."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import transformers
from bertscope.experiments import cli

BLIMP = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "blimp" / "blimp.tsv.gz"
ROWS = [("The cat sleeps.", "The cat sleep.", "agreement", "morphology"),
        ("Nobody has ever left.", "Somebody has ever left.", "npi", "semantics"),
        ("The dogs bark.", "The dogs barks.", "agreement", "morphology")]  # fmt: skip


@pytest.fixture(scope="module")
def mlm_folder(tmp_path_factory):
    from helpers import save_tiny_bert

    folder = tmp_path_factory.mktemp("tiny-mlm")
    save_tiny_bert(folder, transformers.BertForMaskedLM)
    return folder


def _run(args, out, capsys):
    code = cli.main(["run", "minimal-pairs", "--out", str(out), "--no-report", "--quiet", *args])
    return code, capsys.readouterr()


def test_model_without_mlm_head_is_refused_in_one_line(tmp_path, capsys):
    out = tmp_path / "out"
    code, said = _run([], out, capsys)  # the bundled sentence encoder has no masked-LM head
    err = said.err.strip().splitlines()
    assert code == 2 and len(err) == 1, said.err
    assert "has no masked-LM head" in err[0] and "--model" in err[0]
    assert not out.exists() or not any(out.iterdir())


def _tsv(path: Path) -> Path:
    lines = ["UID\tfield\tlinguistics_term\tpair_id\tsentence_good\tsentence_bad"]
    lines += [f"{p}\t{f}\tterm\t{i}\t{g}\t{b}" for i, (g, b, p, f) in enumerate(ROWS)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _jsonl(path: Path) -> Path:
    path.write_text("".join(json.dumps({"sentence_good": g, "sentence_bad": b, "UID": p, "field": f,
                                        "linguistics_term": "term", "pairID": str(i)}) + "\n"
                            for i, (g, b, p, f) in enumerate(ROWS)))
    return path


@pytest.mark.parametrize("write", [_tsv, _jsonl], ids=["tsv", "jsonl"])
def test_pairs_file_is_read_and_scored(write, mlm_folder, tmp_path, capsys):
    corpus = write(tmp_path / ("pairs.tsv" if write is _tsv else "pairs.jsonl"))
    out = tmp_path / "out"
    code, said = _run(["--model", str(mlm_folder), "--corpus", str(corpus)], out, capsys)
    assert code == 0, said.err
    folder = out / "minimal_pairs"
    results = pd.read_parquet(folder / "results.parquet")
    assert len(results) == 2 * len(ROWS)  # a row per pair and method
    first = results[results["method"] == "original"]
    assert first["good"].tolist() == [r[0] for r in ROWS] and first["paradigm"].tolist() == [r[2] for r in ROWS]
    assert set(first["field"]) == {"morphology", "semantics"} and set(first["phenomenon"]) == {"term"}
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["corpus"]["n_pairs"] == len(ROWS)
    accuracy = pd.read_csv(folder / "accuracy.csv")
    assert set(accuracy["level"]) == {"overall", "field", "paradigm"}


def test_bad_pairs_file_is_refused_in_one_line(mlm_folder, tmp_path, capsys):
    corpus = tmp_path / "pairs.jsonl"
    corpus.write_text(json.dumps({"sentence_good": "A cat sat."}) + "\n")
    out = tmp_path / "out"
    code, said = _run(["--model", str(mlm_folder), "--corpus", str(corpus)], out, capsys)
    err = said.err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "pairs.jsonl:1" in err[0] and "'bad'" in err[0], said.err
    assert not out.exists()


@pytest.mark.skipif(not BLIMP.exists(), reason=f"BLiMP is not at {BLIMP} (the shared data folder is absent)")
def test_blimp_file_runs(mlm_folder, tmp_path, capsys):
    out = tmp_path / "out"
    code, said = _run(["--model", str(mlm_folder), "--corpus", str(BLIMP), "--max-sentences", "12"], out, capsys)
    assert code == 0, said.err
    results = pd.read_parquet(out / "minimal_pairs" / "results.parquet")
    assert len(results) == 24 and set(results["paradigm"]) == {"adjunct_island"}
    assert set(results["field"]) == {"syntax"} and set(results["phenomenon"]) == {"island_effects"}


def test_chunks_on_two_workers_give_the_one_process_scores(mlm_folder, tmp_path, capsys):
    """A chunk of pairs per job, scored on two forked workers (one thread each) or here: the same table."""
    corpus = _tsv(tmp_path / "pairs.tsv")
    tables = []
    for workers in ("1", "2"):
        out = tmp_path / f"out{workers}"
        code, said = _run(["--model", str(mlm_folder), "--corpus", str(corpus), "--threads", "1", "--set",
                           "minimal-pairs.chunk_pairs=1", "--set", f"minimal-pairs.workers={workers}"], out, capsys)
        assert code == 0, said.err
        tables.append(pd.read_parquet(out / "minimal_pairs" / "results.parquet"))
    pd.testing.assert_frame_equal(tables[0], tables[1], check_exact=False, rtol=0, atol=1e-9)
