"""The `mixing` experiment: end to end through the CLI on tiny checkpoints, known answers of its measures, and
findings generated from the saved table."""

from __future__ import annotations

from pathlib import Path

import bertscope.experiments.mixing as mixing
import numpy as np
import pandas as pd
import pytest
import torch
import transformers
from bertscope.experiments import cli, registry
from bertscope.experiments.mixing import experiment, measures
from bertscope.experiments.mixing import plots as mixing_plots

MAX_SENTENCES = "5"


def _run(model_dir: Path, out: Path, monkeypatch: pytest.MonkeyPatch, max_sentences: str = MAX_SENTENCES) -> Path:
    monkeypatch.setattr(mixing_plots, "FORMATS", ("png",))  # PDFs cost time and prove nothing more here
    code = cli.main(["run", "mixing", "--model", str(model_dir), "--max-sentences", max_sentences, "--out", str(out),
                     "--device", "cpu", "--quiet", "--no-report"])  # fmt: skip
    assert code == 0
    return out / "mixing"


@pytest.fixture(scope="module")
def pooled_run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One CLI run on the tiny BertModel (no MLM head: the pooled-embedding target)."""
    with pytest.MonkeyPatch.context() as mp:
        return _run(tiny_model_dir, tmp_path_factory.mktemp("mixing") / "r", mp)


def test_registered_after_positions_and_satisfies_the_protocol() -> None:
    names = list(registry.EXPERIMENTS)
    assert names.index("mixing") == names.index("positions") + 1
    assert isinstance(registry.load_experiment("mixing"), registry.Experiment)
    assert set(mixing.CAPTIONS) == {"fig_mixing_ratio", "fig_special_tokens", "fig_faithfulness", "fig_example_maps"}


@pytest.mark.slow
def test_cli_run_writes_the_documented_table_and_figures(pooled_run: Path, tiny_model_dir: Path) -> None:
    results = pd.read_parquet(pooled_run / "results.parquet")
    assert list(results.columns) == experiment.RESULT_COLUMNS
    assert set(results.metric) == {"mixing_ratio", "share_cls", "share_sep", "share_punct", "spearman_vs_loo"}
    assert results.model.nunique() == 1 and str(tiny_model_dir) in results.model.iloc[0]
    assert set(results.corpus) == {"builtin"}
    per_layer = results[results.metric == "mixing_ratio"]
    for m in ("attention", "attention_norm", "residual_norm", "alti", "value_zeroing"):
        assert sorted(per_layer[per_layer.method == m].layer) == [0, 1]  # the tiny model's 2 layers
        assert sorted(per_layer[per_layer.method == f"rollout:{m}"].layer) == [0, 1]
    assert (results.n == int(MAX_SENTENCES)).all()
    finite = results.dropna(subset=["ci_low"])
    assert ((finite.ci_low <= finite.value + 1e-12) & (finite.value <= finite.ci_high + 1e-12)).all()
    shares = results[results.metric.str.startswith("share_")]
    assert shares.value.between(0, 1).all()
    # known answer: leave-one-out agrees with itself exactly
    loo = results[(results.metric == "spearman_vs_loo") & (results.method == "loo")].iloc[0]
    assert (loo.value, loo.ci_low, loo.ci_high) == (1.0, 1.0, 1.0)
    faith = set(results[results.metric == "spearman_vs_loo"].method)
    assert {"alti", "rollout:alti", "attention", "rollout:attention", "integrated_gradients", "grad_x_input"} <= faith
    # under 'attention' the share of [CLS] is the head-averaged attention mass to [CLS]: rows sum to 1, so <= 1
    maps = pd.read_parquet(pooled_run / "example_maps.parquet")
    rows = maps.groupby(["sentence", "method", "query"])["value"].sum()
    np.testing.assert_allclose(rows, 1.0, atol=1e-5)
    figures = sorted(p.name for p in pooled_run.glob("fig_*.png"))
    assert figures == sorted(f"{stem}.png" for stem in mixing.CAPTIONS)
    for p in pooled_run.glob("fig_*"):
        p.unlink()
    assert sorted(p.name for p in mixing.plot(pooled_run, formats=("png",))) == figures  # from the tables alone


@pytest.mark.slow
def test_mlm_checkpoint_uses_the_masked_lm_loss(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from helpers import save_tiny_bert

    save_tiny_bert(tmp_path / "mlm", cls=transformers.BertForMaskedLM)
    out = _run(tmp_path / "mlm", tmp_path / "r", monkeypatch, max_sentences="3")
    manifest = (out / "manifest.json").read_text()
    assert '"loo": "mlm_loss"' in manifest
    results = pd.read_parquet(out / "results.parquet")
    loo = results[(results.metric == "spearman_vs_loo") & (results.method == "loo")]
    assert loo.value.iloc[0] == 1.0


# ------------------------------------------------------------------------------------ measures, known answers


def _groups(ids: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"cls": ids == 101, "sep": ids == 102, "punct": ids == 1012}


def test_identity_contributions_mean_no_mixing_and_all_to_cls_means_share_one() -> None:
    ids = torch.tensor([[101, 7, 8, 1012, 102, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]])
    eye = torch.diag_embed(mask.double())[:, None]  # [1, 1, q, k]: every token only from itself
    rows = measures.layer_rows("m", eye, mask, _groups(ids), [3])
    value = rows.set_index("metric")["sum"] / rows.set_index("metric")["count"]
    assert value["mixing_ratio"] == 0.0
    assert value["share_cls"] == pytest.approx(1 / 5) and value["share_punct"] == pytest.approx(1 / 5)
    to_cls = torch.zeros(1, 1, 6, 6, dtype=torch.float64)
    to_cls[0, 0, :5, 0] = 3.0  # unnormalised: shares divide by the row sum
    rows = measures.layer_rows("m", to_cls, mask, _groups(ids), [3]).set_index("metric")
    assert rows.loc["share_cls", "sum"] == 5.0 and rows.loc["share_sep", "sum"] == 0.0
    assert rows.loc["mixing_ratio", "sum"] == 4.0  # every token but [CLS] itself is all context
    assert (rows["count"] == 5).all() and (rows["sentence"] == 3).all()


def test_read_out_of_pooled_rows_is_the_mean_share() -> None:
    c = torch.tensor([[[1.0, 3.0], [2.0, 2.0]]])
    rows = torch.tensor([[0.5, 0.5]])
    np.testing.assert_allclose(measures.read_out(c, rows), [[0.5 * 0.25 + 0.5 * 0.5, 0.5 * 0.75 + 0.5 * 0.5]])


def test_spearman_rows_known_answers_and_constant_sentences_left_out() -> None:
    ref = torch.tensor([[0.1, 0.5, 0.2, 0.9], [1.0, 2.0, 3.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    attr = torch.tensor([[1.0, 5.0, 2.0, 9.0], [-3.0, -2.0, -1.0, 0.0], [1.0, 2.0, 3.0, 4.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1]])
    rows = measures.spearman_rows("m", attr, ref, mask, [0, 1, 2], layer=5)
    assert rows["sentence"].tolist() == [0, 1]  # sentence 2's reference is constant: undefined
    # sentence 1 compares magnitudes over the 3 real tokens: |attr| = 3, 2, 1 vs 1, 2, 3 -> -1
    np.testing.assert_allclose(rows["sum"], [1.0, -1.0])
    assert set(rows.metric) == {"spearman_vs_loo"} and set(rows.layer) == {5}


def test_summarize_is_a_ratio_of_sums_with_a_sentence_bootstrap() -> None:
    per = pd.DataFrame({"method": "m", "layer": 0, "sentence": [0, 1, 2, 3], "metric": "x",
                        "sum": [1.0, 2.0, 3.0, 10.0], "count": [1.0, 1.0, 1.0, 2.0]})  # fmt: skip
    a = measures.summarize(per, n_boot=200, seed=1)
    b = measures.summarize(per, n_boot=200, seed=1)
    pd.testing.assert_frame_equal(a, b)  # deterministic for a seed
    row = a.iloc[0]
    assert row.value == pytest.approx(16 / 5) and row.n == 4
    assert row.ci_low < row.value < row.ci_high


# ------------------------------------------------------------------------------------------------ findings


def test_findings_follow_the_saved_numbers(pooled_run: Path, tmp_path: Path) -> None:
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(pooled_run, out)
    before = mixing.findings(out)
    assert len(before) == 4  # faithfulness, [CLS], [SEP], mixing ratio
    results = pd.read_parquet(out / "results.parquet")
    pick = (results.metric == "spearman_vs_loo") & (results.method == "rollout:attention_norm")
    results.loc[pick, ["value", "ci_low", "ci_high"]] = [0.987, 0.951, 0.999]
    cls = (results.metric == "share_cls") & (results.method == "attention")
    results.loc[cls, ["value", "ci_low", "ci_high"]] = [0.001, 0.0, 0.002]
    results.loc[cls & (results.layer == 1), ["value", "ci_low", "ci_high"]] = [0.9, 0.88, 0.91]
    results.to_parquet(out / "results.parquet")
    (out / "results.csv").unlink()
    after = mixing.findings(out)
    assert "rollout of attention norm 0.99 [0.95, 1.00]" in after[0].text
    assert after[0].numbers["spearman:rollout:attention_norm"] == pytest.approx(0.987)
    assert "0.90 [0.88, 0.91] of the attention weights at layer 1" in after[1].text
    assert "shrinks below half" in after[1].text  # no tiny random model gives [CLS] 0.45 of its contributions
    assert [f.text for f in before] != [f.text for f in after]
