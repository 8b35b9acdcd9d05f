"""One numbering of layers across every experiment's tables, sentences and figures (issue 40.5).

`experiments.naming.LAYER_COLUMNS` says what each experiment's layer columns count ("residual": the embeddings
are 0 and k is the stream after layer k-1; "block": ``blocks.{L}``). Every case below plants a table whose
layer index is known, generates the experiment's findings (and figures) from it, and checks that they name the
layer the convention's way and no other. To add an experiment, add its columns to ``LAYER_COLUMNS`` and a case to
``CASES`` (a function writing its tables into a folder and returning the phrases its findings must contain).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from bertscope.experiments import naming

# ------------------------------------------------------------------------------------------------ the cases


def erasure_tables(out: Path) -> tuple[str, list[str], list[str]]:
    """A 6-block model's erasure: UPOS erased at residual index 3 (= after layer 2), read at index 6 (= after
    layer 5). Returns (experiment, phrases that must appear, phrases that must not)."""
    from bertscope.experiments.erasure import steps

    base = {"model": "m", "train_corpus": "a", "eval_corpus": "b", "split": "eval", "n_train": 10, "n_eval": 10,
            "selection": "none", "delta_ci_low": np.nan, "delta_ci_high": np.nan, "majority": np.nan}
    rows = []
    for k in range(7):
        rows.append({**base, "concept": "none", "method": "none", "erase_layer": 0, "rank": 0, "measure": "uuas",
                     "target": "tree", "layer": k, "value": 0.30, "ci_low": 0.28, "ci_high": 0.32, "delta": 0.0})
    for name, v in (("uuas_random_tree", 0.12), ("uuas_linear_chain", 0.35)):
        rows.append({**base, "concept": "none", "method": "none", "erase_layer": 0, "rank": 0, "measure": name,
                     "target": "tree", "layer": 6, "value": v, "ci_low": v, "ci_high": v, "delta": 0.0})
    for method, drop in (("leace", 0.4), ("inlp", 0.5), ("random", 0.01)):
        rank = 13 if method != "inlp" else 40
        for k in range(3, 7):
            for target, d in (("upos", drop), ("position", drop / 4)):
                rows.append({**base, "concept": "upos", "method": method, "erase_layer": 3, "rank": rank,
                             "measure": "probe_accuracy", "target": target, "layer": k, "value": 0.9 - d,
                             "ci_low": 0.8 - d, "ci_high": 0.95 - d, "delta": -d, "delta_ci_low": -d - 0.02,
                             "delta_ci_high": -d + 0.02})
            rows.append({**base, "concept": "upos", "method": method, "erase_layer": 3, "rank": rank,
                         "measure": "uuas", "target": "tree", "layer": k, "value": 0.29, "ci_low": 0.27,
                         "ci_high": 0.31, "delta": -0.01})
        rows.append({**base, "concept": "upos", "method": method, "erase_layer": 3, "rank": rank,
                     "measure": "embedding_cosine", "target": "sentence", "layer": 6, "value": 1 - drop,
                     "ci_low": 1 - drop, "ci_high": 1 - drop, "delta": np.nan})
        rows.append({**base, "concept": "upos", "method": method, "erase_layer": 3, "rank": rank,
                     "measure": "site_control_accuracy", "target": "word_type", "layer": 3, "value": 0.5,
                     "ci_low": 0.4, "ci_high": 0.6, "delta": -drop / 2})
    # INLP's equal-rank random control
    extra = [dict(r, rank=40) for r in rows if r["method"] == "random"]
    results = pd.DataFrame(rows + extra)
    results.to_parquet(out / "results.parquet")
    steps.summary(results).to_parquet(out / "summary.parquet")
    present = ["upos after layer 2", "accuracy after layer 5", "after layer 5 the erasures"]
    return "erasure", present, ["layer 3", "layer 6", "layer-6"]


def structure_tables(out: Path) -> tuple[str, list[str], list[str]]:
    """Structure's summary with its best layer at residual index 3 (= after layer 2)."""
    layers = np.arange(7)
    uuas = np.where(layers == 3, 0.6, 0.3)
    s = pd.DataFrame({"layer": layers, "uuas": uuas, "uuas_ci_low": uuas - 0.05, "uuas_ci_high": uuas + 0.05,
                      "dev_uuas": uuas, "linear_chain_uuas": 0.4, "random_tree_uuas": 0.1})
    for m in ("dspr", "root_acc", "nspr"):
        s[m], s[f"{m}_ci_low"], s[f"{m}_ci_high"], s[f"dev_{m}"] = uuas, uuas - 0.1, uuas + 0.1, uuas
    s.to_parquet(out / "summary.parquet")
    return "structure", ["after layer 2"], ["layer 3"]


def features_tables(out: Path) -> tuple[str, list[str], list[str]]:
    """Features' summary of one SAE in block 2 (a block index: "layer 2", ``blocks.2``)."""
    row = {"encoder": "trained", "site": "blocks.2.hook_resid_post", "kind": "sae", "layer": 2, "basis": "latent",
           "n_units": 50, "threshold": 0.5, "d_sae": 64, "tokens_trained": 1000, "n_position": 3, "n_duplicate": 1,
           "n_syntax": 2, "n_special": 4, "n_labelled": 10, "share_beating_neuron_and_pca": 0.2,
           "median_test_mcc": 0.3}
    pd.DataFrame([row]).to_parquet(out / "summary.parquet")
    return "features", ["layer 2", "blocks.2.hook_resid_post"], ["after layer", "layer 3"]


CASES: list[Callable[[Path], tuple[str, list[str], list[str]]]] = [erasure_tables, structure_tables,
                                                                    features_tables]


def _findings(experiment: str) -> Callable:
    return importlib.import_module(f"bertscope.experiments.{experiment}.findings").findings


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_every_experiment_names_layers_one_way(case, tmp_path: Path):
    experiment, present, absent = case(tmp_path)
    texts = [f.text for f in _findings(experiment)(tmp_path)]
    assert texts, experiment
    joined = "\n".join(texts)
    for phrase in present:
        assert phrase in joined, (phrase, joined)
    for phrase in absent:
        assert not re.search(rf"\b{re.escape(phrase)}\b", joined), (phrase, joined)
    assert naming.stray_spellings(joined) == [], joined


def test_layer_columns_are_declared_for_every_case_and_name_real_sites():
    declared = naming.LAYER_COLUMNS
    for case in CASES:
        assert case.__name__.split("_")[0] in declared
    assert all(kind in ("residual", "block") for cols in declared.values() for kind in cols.values())
    assert [naming.layer_words("residual", k) for k in (0, 3)] == ["embeddings", "after layer 2"]
    assert naming.layer_words("block", 3) == "layer 3"
    assert naming.residual_site(0) == "embed.hook_out" and naming.residual_site(3) == "blocks.2.hook_resid_post"
    from bertscope.experiments.erasure import data
    from bertscope.experiments.features import steps

    assert [data.site(k) for k in range(4)] == [naming.residual_site(k) for k in range(4)]
    assert all(s.name.startswith(f"blocks.{s.layer}.") for s in steps.default_sites(6, None, None))


def test_erasure_findings_lead_with_the_largest_effect(tmp_path: Path):
    erasure_tables(tmp_path)
    found = _findings("erasure")(tmp_path)
    first = found[0]
    assert first.text.startswith("Erasing upos after layer 2 with INLP") and first.numbers["concept_same_delta"] == -0.5
    tree = next(f for f in found if "parse tree" in f.text)
    assert found.index(tree) > 0 and tree.numbers["random_tree_uuas"] == 0.12
    assert "does not beat the chain" in tree.text  # clean 0.30 [0.28, 0.32] against a chain at 0.35


def _capture(monkeypatch) -> list:
    from bertscope.experiments import io

    figures: list = []

    def keep(fig, base, formats=io.FIGURE_FORMATS, dpi=150):
        figures.append((Path(base).name, fig))
        return []

    monkeypatch.setattr(io, "save_figure", keep)
    return figures


def test_erasure_figures_label_layers_like_the_hooks(tmp_path: Path, monkeypatch):
    from bertscope.experiments.erasure import plots

    erasure_tables(tmp_path)
    captured = _capture(monkeypatch)
    plots.plot(tmp_path)
    figures = dict(captured)
    assert {"erasure_uuas", "erasure_probes"} <= set(figures)
    uuas = figures["erasure_uuas"]
    ax = uuas.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["emb", "0", "1", "2", "3", "4", "5"]
    assert ax.get_title() == "upos erased after layer 2\nrank: LEACE 13, INLP 40" and "after layer" in ax.get_xlabel()
    assert ax.get_legend() is None  # one legend for the figure, below the panels; ranks are per panel
    legend = [t.get_text() for leg in uuas.legends for t in leg.get_texts()]
    assert {"LEACE", "INLP", "clean run", "random tree (reads no vectors)"} <= set(legend)
    assert any(len(c.get_paths()) for c in ax.collections)  # the bootstrap bands are drawn
    probes = figures["erasure_probes"].axes[0]
    assert "after layer 5" in probes.get_ylabel() and probes.get_title().startswith("upos erased after layer 2\n")
    assert min(t.get_fontsize() for t in probes.get_xticklabels()) >= 8
