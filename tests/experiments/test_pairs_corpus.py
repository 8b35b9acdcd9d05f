"""The pairs corpus reader (`experiments.corpus.pairs`) and its plumbing: CSV, TSV and JSONL, with or without a
header, quoted delimiters and gzip read the same rows; bad files are refused in one line naming the line; a
pairs experiment run alone gets the file as ``inputs.pairs`` and its manifest corpus is the file."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import types

import pytest
from bertscope.experiments.corpus.pairs import PairsError, PairsFormat, pairs_from_rows, read_pairs
from bertscope.experiments.options import RunOptions, UsageError, read_pairs_spec

FMT = PairsFormat("similarity pairs", ("a", "b", "score"), optional=("genre",), numeric=("score",),
                  aliases={"a": ("sentence1",), "b": ("sentence2",)})
ROWS = [("A man, a plan.", "A canal", 3.5), ("Tabs\tand \"quotes\"", "x", 0.0), ("one", "two", 5.0)]


def _csv(rows, header: bool, delimiter: str = ",") -> str:
    import csv
    import io

    buf = io.StringIO()
    w = csv.writer(buf, delimiter=delimiter)
    if header:
        w.writerow(["sentence1", "sentence2", "score"])
    w.writerows(rows)
    return buf.getvalue()


@pytest.mark.parametrize("name,text", [
    ("p.csv", _csv(ROWS, header=True)),
    ("p.csv", _csv(ROWS, header=False)),
    ("p.tsv", _csv(ROWS, header=True, delimiter="\t")),
    ("p.tsv", _csv(ROWS, header=False, delimiter="\t")),
    ("p.jsonl", "".join(json.dumps({"a": a, "b": b, "score": s}) + "\n" for a, b, s in ROWS)),
])
def test_every_form_reads_the_same_rows(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    pairs = read_pairs(path, FMT)
    assert pairs.frame[["a", "b", "score"]].values.tolist() == [list(r) for r in ROWS]
    assert pairs.frame["id"].tolist() == [0, 1, 2]
    gz = tmp_path / (name + ".gz")
    gz.write_bytes(gzip.compress(text.encode()))
    assert read_pairs(gz, FMT).frame.equals(pairs.frame)


def test_optional_columns_and_max_rows(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text("genre,sentence1,sentence2,score\nnews,a,b,1\nforum,c,d,2\n")
    pairs = read_pairs(path, FMT, max_rows=1)
    assert pairs.frame.to_dict("records") == [{"id": 0, "a": "a", "b": "b", "score": 1.0, "genre": "news"}]
    assert pairs.summary()["n_pairs"] == 1 and len(pairs.summary()["sha256"]) == 64


@pytest.mark.parametrize("text,expect", [
    ("", "the file is empty"),
    ("sentence1,sentence2,score\n", "no similarity pairs rows"),
    ("a,b\n", ":1: no 'score' column"),
    ("a,b,3\nc,d,high\n", ":2: score 'high' is not a number"),
    ("a,,3\n", ":1: empty 'b' text"),
    ("a,\"  \",3\n", ":1: empty 'b' text"),
])
def test_bad_files_refused_in_one_line(tmp_path, text, expect):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(PairsError) as e:
        read_pairs(path, FMT)
    assert expect in str(e.value) and "\n" not in str(e.value)


def test_bad_jsonl_and_missing_file(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"a": "x", "b": "y", "score": 1}\n[1, 2]\n')
    with pytest.raises(PairsError, match=r"bad.jsonl:2: not a JSON object"):
        read_pairs(path, FMT)
    with pytest.raises(PairsError, match="cannot read it"):
        read_pairs(tmp_path / "absent.csv", FMT)


def test_builtin_rows_are_checked_like_a_file():
    pairs = pairs_from_rows("demo", [{"a": "x", "b": "y", "score": 1}], FMT)
    assert pairs.source == "builtin" and pairs.frame["score"].tolist() == [1.0]
    with pytest.raises(PairsError, match="empty 'a' text"):
        pairs_from_rows("demo", [{"a": "", "b": "y", "score": 1}], FMT)


def test_read_pairs_spec_only_for_pairs_experiments(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text(_csv(ROWS, header=False))
    pairs_module = types.SimpleNamespace(PAIRS=FMT)
    sentences_module = types.SimpleNamespace()
    assert read_pairs_spec(pairs_module, RunOptions(corpus="builtin")) is None
    assert read_pairs_spec(sentences_module, RunOptions(corpus=str(path))) is None
    assert len(read_pairs_spec(pairs_module, RunOptions(corpus=str(path), max_sentences=2))) == 2
    path.write_text("a,b,x\n")
    with pytest.raises(UsageError, match=r"^--corpus .*p.csv: .*p.csv:1: score 'x' is not a number$"):
        read_pairs_spec(pairs_module, RunOptions(corpus=str(path)))


def test_reading_pairs_does_not_import_torch(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text(_csv(ROWS, header=True))
    code = ("import sys; from bertscope.experiments.corpus.pairs import PairsFormat, read_pairs;"
            f"read_pairs({str(path)!r}, PairsFormat('p', ('a', 'b'), aliases={{'a': ('sentence1',), "
            "'b': ('sentence2',)})); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_prepare_inputs_with_pairs_records_the_file(tmp_path):
    from bertscope.experiments.options import prepare_inputs

    path = tmp_path / "p.csv"
    path.write_text(_csv(ROWS, header=True))
    options = RunOptions(corpus=str(path), max_sentences=5)
    pairs = read_pairs_spec(types.SimpleNamespace(PAIRS=FMT), options)
    inputs = prepare_inputs(options, pairs)
    assert inputs.pairs is pairs
    assert inputs.corpus_info["source"] == str(path) and inputs.corpus_info["n_pairs"] == 3
    assert inputs.corpus.name == "builtin"  # the sentence corpus a pairs run does not read
