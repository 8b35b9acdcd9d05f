"""``bertscope run similarity --corpus PAIRS``: pairs files in every accepted shape parse the same; bad ones are
refused in one line, exit 2, nothing written; a small run on a tiny model writes every table, figure and the pair
view."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from bertscope.experiments import cli
from bertscope.experiments.corpus.pairs import PairsError, read_pairs
from bertscope.experiments.similarity import PAIRS

ROWS = [("A man, a plan, a canal.", "A canal, planned by a man.", 3.8),
        ("The cat sat on the mat.", "A cat is sitting on a mat.", 4.6),
        ("He said \"no\", then left.", "Stocks fell on Monday.", 0.0),
        ("Dogs bark.", "Dogs are barking loudly.", 4.0),
        ("The train was late.", "The bus was late.", 2.0),
        ("She is not happy.", "She is happy.", 2.4),
        ("Birds fly south in winter.", "In winter, birds migrate south.", 4.8),
        ("The bank raised rates.", "A girl reads a book.", 0.2),
        ("The dog chased the cat.", "The cat chased the dog.", 3.0),
        ("Rain flooded the town.", "The town was flooded by rain.", 5.0)]


def _csv(rows, header: str | None = None, sep: str = ",") -> str:
    import csv
    import io

    buf = io.StringIO()
    w = csv.writer(buf, delimiter=sep, lineterminator="\n")
    if header:
        w.writerow(header.split(sep))
    w.writerows(rows)
    return buf.getvalue()


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    from helpers import save_tiny_bert

    folder = tmp_path_factory.mktemp("tiny-bert")
    save_tiny_bert(folder)
    return folder


SHAPES = {
    "stsb.csv": lambda: _csv(ROWS),  # STS-B as shipped: no header, quoted commas
    "header.csv": lambda: _csv(ROWS, "sentence1,sentence2,score"),  # MTEB / sentence-transformers spelling
    "glue.tsv": lambda: _csv(ROWS, "sentence1\tsentence2\tlabel", sep="\t"),
    "plain.tsv": lambda: _csv(ROWS, sep="\t"),
    "pairs.jsonl": lambda: "".join(json.dumps({"a": a, "b": b, "score": s}) + "\n" for a, b, s in ROWS),
    "mteb.jsonl": lambda: "".join(json.dumps({"sentence1": a, "sentence2": b, "score": s}) + "\n"
                                  for a, b, s in ROWS),
}


def test_every_shape_of_a_pairs_file_parses_the_same(tmp_path) -> None:
    frames = {}
    for name, text in SHAPES.items():
        (tmp_path / name).write_text(text())
        frames[name] = read_pairs(tmp_path / name, PAIRS).frame
    expected = pd.DataFrame({"id": range(len(ROWS)), "a": [r[0] for r in ROWS], "b": [r[1] for r in ROWS],
                             "score": [r[2] for r in ROWS]})
    for name, frame in frames.items():
        pd.testing.assert_frame_equal(frame[["id", "a", "b", "score"]], expected, check_dtype=False, obj=name)
    stsb = frames["stsb.csv"]
    assert stsb.a[0] == "A man, a plan, a canal." and stsb.a[2] == 'He said "no", then left.'


BAD = {
    "missing.csv": ("The cat sat.,A cat sits.\n", "no 'score' column"),
    "text.csv": ("The cat sat.,A cat sits.,high\n", "is not a number"),
    "empty.csv": ("", "empty"),
    "blank.jsonl": (json.dumps({"a": "The cat sat.", "b": " ", "score": 3}) + "\n", "empty 'b' text"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_pairs_file_is_refused_in_one_line_with_nothing_written(name, tiny_folder, tmp_path, capsys) -> None:
    text, why = BAD[name]
    path = tmp_path / name
    path.write_text(_csv(ROWS[:4]) + text if name != "empty.csv" and name.endswith(".csv") else text)
    with pytest.raises(PairsError, match=why):
        read_pairs(path, PAIRS)
    out = tmp_path / "out"
    code = cli.main(["run", "similarity", "--corpus", str(path), "--model", str(tiny_folder), "--out", str(out),
                     "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and why in err[0] and str(path.name) in err[0], err
    assert not out.exists()


def test_too_few_pairs_is_refused_before_anything_is_written(tiny_folder, tmp_path, capsys) -> None:
    path = tmp_path / "few.csv"
    path.write_text(_csv(ROWS[:3]))
    out = tmp_path / "out"
    code = cli.main(["run", "similarity", "--corpus", str(path), "--model", str(tiny_folder), "--out", str(out),
                     "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "at least 8" in err[0]
    assert not out.exists()


def test_small_run_writes_every_table_figure_and_the_pair_view(tiny_folder, tmp_path, capsys) -> None:
    from bertscope.experiments.similarity import findings

    path = tmp_path / "pairs.csv"
    path.write_text(_csv(ROWS))
    out = tmp_path / "out"
    code = cli.main(["run", "similarity", "--corpus", str(path), "--model", str(tiny_folder), "--out", str(out),
                     "--quiet", "--no-report", "--set", "similarity.attributed=3", "--set", "similarity.steps=2",
                     "--set", "similarity.n_boot=50", "--set", "similarity.n_random=2", "--set",
                     "similarity.methods=integrated-jacobians,occlusion,mixing:rollout:attention"])
    assert code == 0, capsys.readouterr().err
    folder = out / "similarity"
    for name in ("results", "benchmark", "heads", "faithfulness", "aopc", "methods", "claims", "negation",
                 "concentration", "matrices"):
        assert (folder / f"{name}.parquet").is_file() and (folder / f"{name}.csv").is_file(), name
    for fig in ("fig_token_heatmaps", "fig_spearman_layers", "fig_head_shares", "fig_faithfulness"):
        assert (folder / f"{fig}.png").is_file(), fig
    assert "sp-data" in (folder / "pairs.html").read_text()
    bench = pd.read_parquet(folder / "benchmark.parquet")
    assert len(bench) == 2 * 2 * 3  # two splits x two layers x three poolings
    own = bench[bench.own]
    assert set(own.site) == {"blocks.1.hook_resid_post"} and set(own.pooling) == {"mean"}
    assert bench.chosen.sum() == 2 and set(bench.chosen_on) == {"select"}
    faith = pd.read_parquet(folder / "faithfulness.parquet")
    assert set(faith.k) == {1, 2, 5, 10} and {"random", "occlusion"} <= set(faith.method)
    assert set(faith.removal) == {"reference", "delete"} and set(faith.sides) == {"one", "both"}
    aopc = pd.read_parquet(folder / "aopc.parquet")
    assert len(aopc) == 2 * 2 * 4  # removals x sides x (three methods and random)
    ratio = aopc[aopc.method == "mixing:rollout:attention"].ratio_to_rollout
    assert np.allclose(ratio[np.isfinite(ratio)], 1.0)
    heads = pd.read_parquet(folder / "heads.parquet")
    assert (heads.kind == "head").sum() == 2 * 4
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["notes"]["pairs"]["n_pairs"] == len(ROWS)
    assert findings(folder)
