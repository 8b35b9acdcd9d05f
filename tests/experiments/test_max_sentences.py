"""``--max-sentences`` has one meaning in every experiment: it caps the corpus (the experiment uses its first N
sentences, all of them when it has fewer); without it the experiment's own default size applies. The number
used is printed (issue 27, item 5: ``run heads --max-sentences 500`` silently used 400)."""

from __future__ import annotations

import dataclasses
import importlib
import json
from pathlib import Path

import pytest
import torch
from bertscope.experiments import io as experiment_io
from bertscope.experiments.corpus import Corpus, load_corpus
from bertscope.experiments.options import Inputs, RunOptions, corpus_summary, model_summary, sentences_used
from bertscope.experiments.registry import EXPERIMENTS
from bertscope.experiments.runner import run_experiment

from bertscope import models

DEFAULT = 4  # the experiments' own default size in these tests (Settings.max_sentences)
TINY = dict(
    max_sentences=DEFAULT, n_boot=10, ci=0.9,
    vocab_sample=20, example_max_tokens=14, random_corpus="repeated-random:m=3", random_sentences=4,  # same-token
    distance_sentences=2, importance_sentences=2, importance_batch=4, n_projections=1, pruning_points=2,  # heads
    window_len=4, max_windows=8, tune_windows=4, n_folds=2, pairs_per_window=2, table_pairs=20,  # positions
    mdl_blocks=2, alphas=(1.0,), ridge_alphas=(1.0,),
    costly_sentences=2, ig_steps=2, n_examples=1,  # mixing
)
SIZED = ["heads", "positions", "same-token", "mixing"]  # the experiments with a default size


def test_sentences_used_caps_and_says_why() -> None:
    assert sentences_used(500, 400, 3000) == (500, "--max-sentences 500")
    assert sentences_used(40, 400, 40) == (40, "--max-sentences 40")
    n, why = sentences_used(500, 400, 120)  # a shorter corpus: all of it, and the message says so
    assert n == 120 and "only 120" in why
    n, why = sentences_used(None, 400, 3000)
    assert n == 400 and "default 400" in why
    assert sentences_used(None, 400, 50)[0] == 50
    assert sentences_used(None, None, 50) == (50, "the whole corpus; --max-sentences caps it")


@pytest.fixture(scope="module")
def short_corpus() -> Corpus:
    return load_corpus("builtin", max_sentences=12)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path) -> models.Encoder:
    return models.load(tiny_model_dir)


def _run(name: str, model, corpus: Corpus, max_sentences: int | None, out: Path, monkeypatch) -> dict:
    module = importlib.import_module(EXPERIMENTS[name])
    fields = {f.name for f in dataclasses.fields(module.Settings)}
    small = dataclasses.replace(module.Settings(), **{k: v for k, v in TINY.items() if k in fields})
    monkeypatch.setattr(module, "Settings", lambda: small)
    monkeypatch.setattr(module, "plot", lambda out_dir: [])
    monkeypatch.setattr(experiment_io, "save_figure", lambda *a, **k: [])
    if max_sentences is not None:  # what prepare_inputs does with --max-sentences N
        corpus = corpus[:max_sentences]
    inputs = Inputs(model, corpus, torch.device("cpu"), torch.float32, model_summary(model), corpus_summary(corpus))
    options = RunOptions(out=out, quiet=True, max_length=48, max_sentences=max_sentences)
    result = run_experiment(module, options, inputs)
    assert result.status == "complete", result.error
    return json.loads((out / module.DIRNAME / "manifest.json").read_text())


def _used(manifest: dict) -> int:
    notes = manifest["notes"]
    if "sentences" in notes:  # mixing
        return notes["sentences"]["per_layer_methods"]
    if "n_sentences" in notes:  # heads, positions
        return notes["n_sentences"]
    return notes["sentences_per_corpus"]["builtin"]  # same-token


@pytest.mark.parametrize("name", SIZED)
def test_max_sentences_above_the_default_is_used_and_printed(name, tiny, short_corpus, tmp_path, monkeypatch):
    """--max-sentences 6 with a default of 4: 6 sentences, whatever the experiment (heads and positions used 4)."""
    manifest = _run(name, tiny, short_corpus, 6, tmp_path, monkeypatch)
    assert _used(manifest) == 6
    assert any("6 sentences" in line and "--max-sentences 6" in line for line in manifest["log"]), manifest["log"]


@pytest.mark.parametrize("name", ["heads"])
def test_without_the_option_the_default_applies(name, tiny, short_corpus, tmp_path, monkeypatch):
    manifest = _run(name, tiny, short_corpus, None, tmp_path, monkeypatch)
    assert _used(manifest) == DEFAULT
    assert any(f"{DEFAULT} sentences" in line and f"default {DEFAULT}" in line for line in manifest["log"])
