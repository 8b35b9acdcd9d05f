"""Every registered experiment (and ``capture``) runs end to end on a tiny random checkpoint of every family,
loaded from a folder with its own tokenizer (special tokens and word boundaries come from the tokenizer).
Experiments go through the runner with tiny settings (fields an experiment lacks are ignored); capture through
the CLI."""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

import pytest
import torch
import transformers
from bertscope.experiments import cli
from bertscope.experiments.corpus import load_corpus
from bertscope.experiments.options import Inputs, RunOptions, corpus_summary, model_summary
from bertscope.experiments.registry import EXPERIMENTS
from bertscope.experiments.runner import run_experiment
from family_fixtures import save_tiny_family
from fixtures_deberta_modernbert import save_tiny_deberta, save_tiny_modernbert

from bertscope import models

FAMILIES = ["bert", "roberta", "xlm-roberta", "distilbert", "albert", "electra", "deberta-v2", "modernbert"]
N_SENTENCES = "6"
#: the smallest settings that still exercise every step (an experiment ignores names it does not have)
TINY = dict(
    max_sentences=12, n_boot=20, vocab_sample=60, example_max_tokens=20,  # same-token
    distance_sentences=4, importance_sentences=4, importance_batch=4, n_projections=1, pruning_points=2,  # heads
    window_len=8, max_windows=24, tune_windows=12, n_folds=3, pairs_per_window=4, table_pairs=100,  # positions
    mdl_blocks=3, alphas=(1.0, 10.0), ridge_alphas=(1.0, 100.0),
)


def save_family(family: str, folder: Path) -> Path:
    """A tiny ``family`` checkpoint with its tokenizer in ``folder``."""
    if family == "deberta-v2":
        save_tiny_deberta(folder, transformers.DebertaV2Model)
    elif family == "modernbert":
        save_tiny_modernbert(folder, transformers.ModernBertModel)
    else:
        save_tiny_family(family, folder, head="base")
    return folder


@pytest.fixture(scope="module", params=FAMILIES)
def family_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    return request.param, save_family(request.param, tmp_path_factory.mktemp(request.param))


@pytest.mark.slow
@pytest.mark.parametrize("experiment", list(EXPERIMENTS))
def test_experiment_runs_on_family(family_dir, experiment, tmp_path, monkeypatch) -> None:
    family, folder = family_dir
    module = importlib.import_module(EXPERIMENTS[experiment])
    fields = {f.name for f in dataclasses.fields(module.Settings)}
    small = dataclasses.replace(module.Settings(), **{k: v for k, v in TINY.items() if k in fields})
    monkeypatch.setattr(module, "Settings", lambda: small)
    if hasattr(module, "plots") and hasattr(module.plots, "FORMATS"):
        monkeypatch.setattr(module.plots, "FORMATS", ("png",))
    model = models.load(folder)
    corpus = load_corpus("builtin", max_sentences=40)
    inputs = Inputs(model, corpus, torch.device("cpu"), torch.float32, model_summary(model), corpus_summary(corpus))
    result = run_experiment(module, RunOptions(out=tmp_path, quiet=True, max_length=48), inputs)
    assert result.status == "complete", f"{experiment} on {family}: {result.error}"
    assert (tmp_path / module.DIRNAME / "results.parquet").is_file()


def test_capture_runs_on_family(family_dir: tuple[str, Path], tmp_path: Path) -> None:
    family, folder = family_dir
    out = tmp_path / "cap"
    code = cli.main(["capture", "--hooks", "blocks.0.hook_resid_post", "--model", str(folder), "--max-sentences",
                     N_SENTENCES, "--batch-size", "3", "--max-length", "48", "--out", str(out), "--device", "cpu",
                     "--quiet"])
    assert code == 0, f"capture failed on {family}"
    assert any(out.glob("shard-*.safetensors"))
