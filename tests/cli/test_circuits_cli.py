"""``bertscope circuits`` (bad input: one line, exit 2, nothing written; a small run writes its tables) and the
experiment's pieces: the TFC1 task builder and the head-overlap statistic."""

from __future__ import annotations

import json

import numpy as np
import pytest
from bertscope.experiments import cli
from bertscope.experiments.circuits import measures


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    from helpers import save_tiny_bert

    folder = tmp_path_factory.mktemp("tiny-bert")
    save_tiny_bert(folder)
    return folder


def _pairs(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


GOOD = [{"clean": "the cat sat on the mat cat", "corrupted": "the cat sat on the mat the", "query": "cat"},
        {"clean": "dogs bark at night dogs", "corrupted": "dogs bark at night the", "query": "dogs"},
        {"clean": "a bird sang in the tree bird", "corrupted": "a bird sang in the tree the", "query": "bird"}]


@pytest.mark.parametrize("case", ["unequal", "metric", "mask"])
def test_bad_input_fails_with_one_line_and_writes_nothing(case, tiny_folder, tmp_path, capsys):
    rows = GOOD + ([{"clean": "a b c", "corrupted": "a b c d", "query": "a"}] if case == "unequal" else [])
    task = _pairs(tmp_path / "pairs.jsonl", rows)
    metric = {"unequal": "cosine", "metric": "accuracy", "mask": "mask-logit-diff"}[case]
    out = tmp_path / "out"
    code = cli.main(["circuits", "--task", str(task), "--metric", metric, "--model", str(tiny_folder),
                     "--out", str(out), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("bertscope: error:")
    assert {"unequal": "line 4", "metric": "unknown metric", "mask": "masked-LM head"}[case] in err[0]
    assert not out.exists()


def test_small_run_writes_every_table(tiny_folder, tmp_path, capsys):
    """The old command is an alias of `run circuits --task FILE`: one line says so, then the runner writes
    OUT/circuits/ with every table and the manifest."""
    task = _pairs(tmp_path / "pairs.jsonl", GOOD)
    out = tmp_path / "out"
    code = cli.main(["circuits", "--task", str(task), "--metric", "cosine", "--model", str(tiny_folder),
                     "--out", str(out), "--steps", "1", "--candidates", "4", "--n-random", "1", "--quiet"])
    said = capsys.readouterr()
    assert code == 0, said.err
    assert said.out.splitlines()[0].startswith("bertscope circuits is now `bertscope run circuits --task")
    folder = out / "circuits"
    for name in ("results", "cost", "edges", "circuit", "faithfulness", "areas", "random_circuits"):
        assert (folder / f"{name}.csv").is_file(), name
    import pandas as pd

    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["settings"]["task"] == str(task)
    assert manifest["settings"]["ig_steps"] == 1 and manifest["settings"]["candidates"] == 4
    heads = pd.read_csv(folder / "results.csv")
    assert set(heads.method) == {"exact", "atp", "atp*", "eap-ig", "eap-ig-act"}
    assert len(heads) == 5 * 2 * 4  # methods x layers x heads of the tiny model
    assert set(heads.node) == {f"L{L}H{h}" for L in range(2) for h in range(4)}  # naming.head_name
    agreement = pd.read_csv(folder / "agreement.csv")
    assert {"spearman", "spearman_low", "spearman_high", "n_pairs"} <= set(agreement.columns)


def test_tfc1_pairs_repeat_a_single_occurrence_term():
    from helpers import BUNDLED
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(BUNDLED)
    sentences = [["the", "cat", "sat", "on", "the", "mat"], ["the", "the"], ["a", "dog", "barked", "."]]
    pairs = measures.tfc1_pairs(sentences, tok, max_pairs=5, seed=0)
    assert [p["sentence"] for p in pairs] == [0, 2]  # sentence 1 has no word occurring once except the filler
    for p in pairs:
        words = sentences[p["sentence"]]
        assert words.count(p["query"]) == 1 and p["query"] != "the"
        assert p["clean"] == " ".join(words) + " " + p["query"]
        assert p["corrupted"] == " ".join(words) + " the"
        assert len(tok(p["clean"])["input_ids"]) == len(tok(p["corrupted"])["input_ids"])


def test_head_overlap_against_chance():
    found, other = {(0, 1), (1, 2), (2, 3)}, {(0, 1), (1, 2), (5, 5), (4, 4)}
    o = measures.head_overlap(found, other, 72)
    assert o["overlap"] == 2 and o["expected"] == pytest.approx(3 * 4 / 72)
    from scipy.stats import hypergeom

    assert o["p_value"] == pytest.approx(sum(hypergeom.pmf(k, 72, 4, 3) for k in (2, 3)))


def test_figures_and_findings_from_saved_tables(tiny_folder, tmp_path):
    import shutil

    import matplotlib

    matplotlib.use("Agg")
    from bertscope.experiments.circuits import experiment, findings, plot

    task = _pairs(tmp_path / "pairs.jsonl", GOOD)
    out = tmp_path / "out"
    assert cli.main(["run", "circuits", "--task", str(task), "--metric", "cosine", "--model", str(tiny_folder),
                     "--out", str(tmp_path / "run"), "--set", "circuits.ig_steps=1", "--set",
                     "circuits.candidates=4", "--set", "circuits.n_random=1", "--quiet", "--no-report"]) == 0
    shutil.copytree(tmp_path / "run" / "circuits", out)
    import pandas as pd

    experiment.agreement(pd.read_csv(out / "results.csv")).to_csv(out / "agreement.csv", index=False)
    stems = {p.stem for p in plot(out, formats=("png",))}
    assert {"fig_head_maps", "fig_faithfulness"} <= stems
    texts = [f.text for f in findings(out)]
    assert any("Agreement with exact patching" in t for t in texts)
    assert any("Greedy pruning" in t for t in texts)


def test_the_parser_names_the_library_metrics():
    from bertscope.experiments.cli.circuits_command import METRIC_NAMES
    from bertscope.hooks.circuits import METRICS

    assert tuple(METRIC_NAMES) == tuple(METRICS)


def test_the_old_names_read_the_node_table():
    from bertscope.experiments.circuits import measures
    from bertscope.experiments.cli.circuits_command import ALL_HEAD_METHODS, HEAD_METHODS
    from bertscope.hooks.circuits import table
    from bertscope.hooks.circuits.attribution import METHODS
    from bertscope.hooks.circuits.edges import EDGE_METHODS

    assert set(ALL_HEAD_METHODS) == {"exact", *METHODS} == set(table.NODE_TABLE)
    assert HEAD_METHODS == measures.HEAD_METHODS == ("exact", "atp", "atp*", "eap-ig", "eap-ig-act")
    assert EDGE_METHODS == ("eap", "eap-ig")
    assert measures.AnalysisSettings is __import__("bertscope.experiments.circuits", fromlist=["Settings"]).Settings


def test_run_circuits_refuses_a_corpus_without_pairs(tiny_folder, tmp_path, capsys):
    """A corpus with no word that occurs once gives no TFC1 pair: `run circuits` refuses in one line (exit 2)
    and leaves no table behind."""
    corpus = tmp_path / "repeats.txt"
    corpus.write_text("a a a\nb b b\n")
    out = tmp_path / "out"
    code = cli.main(["run", "circuits", "--corpus", str(corpus), "--model", str(tiny_folder), "--out", str(out),
                     "--quiet"])
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line.startswith("bertscope: error:")]
    assert code == 2 and len(err) == 1 and "0 TFC1 pairs" in err[0], err
    assert not list(out.rglob("*.csv")) and not list(out.rglob("*.parquet"))


def test_spearman_interval_resamples_pairs():
    """The agreement interval resamples pairs: identical pairs give a zero-width interval at the point estimate;
    an estimate equal to exact patching gives 1 everywhere; a noisy one an interval around its point, equal to
    Spearman recomputed by pandas on each resample's means (same weights)."""
    import pandas as pd
    from bertscope.experiments.circuits.measures import spearman_interval

    rng = np.random.default_rng(0)
    exact = rng.normal(size=(30, 12)) + 0.3 * np.arange(12)
    assert spearman_interval(exact, exact, n_boot=50) == (1.0, 1.0, 1.0)
    row, ref = rng.normal(size=12), rng.normal(size=12)
    point, low, high = spearman_interval(np.tile(row, (30, 1)), np.tile(ref, (30, 1)), n_boot=50)
    assert low == pytest.approx(point) and high == pytest.approx(point)
    est = exact + rng.normal(scale=2.0, size=exact.shape)
    point, low, high = spearman_interval(est, exact, n_boot=200, seed=1)
    assert low < point < high
    w = np.random.default_rng(1).multinomial(30, np.full(30, 1 / 30), size=200) / 30
    boot = [pd.Series(wi @ est).corr(pd.Series(wi @ exact), method="spearman") for wi in w]
    assert (low, high) == pytest.approx(tuple(np.percentile(boot, [2.5, 97.5])))


def test_the_circuit_figure_places_nodes_by_layer_labels_them_beside_and_explains_edges(tmp_path, monkeypatch):
    """A planted circuit (old head names, as tables written before the convention spell them): every node sits on
    its layer's row (embeddings lowest, output highest), is labelled ``L1H0``/``MLP 1`` beside it (not on it), and
    the legend says what an edge's width and colour mean."""
    import matplotlib
    import pandas as pd

    matplotlib.use("Agg")
    from bertscope.experiments.circuits import plots

    edges = [("input", "a0.h1", 0.004), ("a0.h1", "a1.h0", 0.01), ("a1.h0", "output", -0.02), ("a0.h1", "m1", -0.001)]
    table = pd.DataFrame({"edge": [f"{s}->{r}" for s, r, _ in edges], "sender": [s for s, _, _ in edges],
                          "receiver": [r for _, r, _ in edges], "score": [v for _, _, v in edges],
                          "faithfulness": 0.5, "m_circuit": 0.25, "m_full": 0.3, "m_empty": 0.2, "n_evaluations": 4})
    drawn = {}
    monkeypatch.setattr(plots.io, "save_figure", lambda fig, base, formats: drawn.setdefault("fig", fig) and [])
    plots.plot_circuit(table, tmp_path, ("png",), n_layers=3, n_heads=2)
    ax = drawn["fig"].axes[0]
    labels = {t.get_text(): t for t in ax.texts}
    assert {"embeddings", "L0H1", "L1H0", "MLP 1", "output"} <= set(labels)
    assert not any(".h" in name for name in labels)
    y = {name: t.xy[1] for name, t in labels.items()}
    assert y["embeddings"] < y["L0H1"] < y["L1H0"] < y["MLP 1"] < y["output"]
    assert y["output"] == 2 * 3 + 1  # every layer of the model has its rows, not only the circuit's
    for t in labels.values():  # beside: offset from the node it names, never centred on it
        assert t.get_position() != t.xy and t.get_ha() == "left"
    rows = [t.get_text() for t in ax.get_yticklabels()]
    assert rows[0] == "embeddings" and rows[-1] == "output" and "layer 2 MLP" in rows
    legend = ax.get_legend()
    words = legend.get_title().get_text() + " ".join(t.get_text() for t in legend.get_texts())
    assert "edge colour" in words and "edge width" in words and "score < 0" in words and "|score| = 0.02" in words
    assert "2 head(s), 1 MLP(s)" in ax.get_title() and "faithfulness 0.50" in ax.get_title()
