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
from family_fixtures import save_tiny_family, wordpiece_tokenizer
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
    elif family == "bert":
        tokenizer = wordpiece_tokenizer()
        torch.manual_seed(0)
        config = transformers.BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                                         num_attention_heads=4, intermediate_size=64, max_position_embeddings=64)
        transformers.BertModel(config).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
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


@pytest.mark.parametrize("family", FAMILIES)
def test_word_maps_and_special_tokens_follow_each_tokenizer(family: str, tmp_path: Path) -> None:
    """Known answer: each word's pieces decode back to the word (whatever the word-start marker: ``##``, ``Ġ``,
    ``▁``), and the non-word positions are exactly the tokenizer's own special tokens, in its template."""
    from bertscope.experiments.corpus import encode
    from bertscope.experiments.corpus.base import Sentence

    tokenizer = models.load(save_family(family, tmp_path)).tokenizer
    words = ["Tokenization", "splits", "uncommon", "words", "."]
    batch = next(iter(encode([Sentence(id="s", words=tuple(words), text=" ".join(words))], tokenizer, max_length=48)))
    ids, word_ids = batch.input_ids[0].tolist(), batch.word_ids[0].tolist()
    for w, word in enumerate(words):
        pieces = [i for i, k in zip(ids, word_ids, strict=True) if k == w]
        assert tokenizer.decode(pieces).strip().lower() in (word.lower(), "<unk>", "[unk]") or \
            tokenizer.unk_token_id in pieces, (family, word, tokenizer.convert_ids_to_tokens(pieces))
    specials = [i for i, k in zip(ids, word_ids, strict=True) if k == -1]
    expected = tokenizer(" ".join(words))["input_ids"]
    template = set(tokenizer.all_special_ids) - {tokenizer.unk_token_id}  # an unknown word is a word
    assert specials == [i for i in expected if i in template], family
    assert specials[0] in (tokenizer.cls_token_id, tokenizer.bos_token_id)
