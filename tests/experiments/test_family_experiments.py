"""Every registered experiment (and ``capture``) runs end to end on a tiny random checkpoint of every family,
loaded from a folder with its own tokenizer (special tokens and word boundaries come from the tokenizer).

Experiments go through the runner with the smallest settings that still reach every step (fields an experiment
lacks are ignored) on the shortest builtin sentences (gold trees included, for structure), two layers per
model. Figures are the experiments' own tests' business and most of the cost here: they are drawn only for
``PLOT_FAMILIES`` (whose tables lack rows other families have), and built there but not rasterised
(``io.save_figure`` only closes them). Where a method is undefined for a family, the experiment must say so in
its log and leave the method out; the tests assert the reason."""

from __future__ import annotations

import dataclasses
import importlib
import json
from pathlib import Path

import pandas as pd
import pytest
import torch
import transformers
from bertscope.experiments import cli
from bertscope.experiments import io as experiment_io
from bertscope.experiments.corpus import Corpus, load_corpus
from bertscope.experiments.options import Inputs, RunOptions, corpus_summary, model_summary
from bertscope.experiments.registry import EXPERIMENTS
from bertscope.experiments.runner import run_experiment
from family_fixtures import save_tiny_family, wordpiece_tokenizer
from fixtures_deberta_modernbert import save_tiny_deberta, save_tiny_modernbert

from bertscope import models

FAMILIES = ["bert", "roberta", "xlm-roberta", "distilbert", "albert", "electra", "deberta-v2", "modernbert"]
#: families whose experiment runs are not marked slow: one per position scheme (RoBERTa's offset table,
#: DeBERTa-v3's relative attention, ModernBERT's rotary pre-LN): ~75 CPU s. The rest of the matrix (~90 CPU s)
#: is marked slow; it is still part of the default suite.
FAST_FAMILIES = {"roberta", "deberta-v2", "modernbert"}
#: families whose positions are not an absolute table (rotary; DeBERTa-v3's relative attention)
NO_POSITION_TABLE = {"modernbert", "deberta-v2"}
#: family -> mixing methods that are undefined for it, with a phrase of the reason the log must give
UNDEFINED_MIXING = {"modernbert": {"residual_norm": "post-LN"}}
#: families whose figures are built (ModernBERT: no position table, no residual_norm, pre-LN)
PLOT_FAMILIES = {"modernbert"}
N_SENTENCES = 12  # shortest builtin sentences: structure's train 4 + dev 2 + test 3, with room for truncation
MAX_LENGTH = 48
#: the smallest settings that still exercise every step (an experiment ignores names it does not have)
TINY = dict(
    max_sentences=N_SENTENCES, n_boot=20, ci=0.9,
    vocab_sample=30, example_max_tokens=14, random_corpus="repeated-random:m=3",  # same-token
    distance_sentences=4, importance_sentences=3, importance_batch=4, n_projections=1, pruning_points=2,  # heads
    window_len=4, max_windows=8, tune_windows=4, n_folds=2, pairs_per_window=2, table_pairs=20,  # positions
    mdl_blocks=2, alphas=(1.0,), ridge_alphas=(1.0,),
    costly_sentences=2, ig_steps=2, n_examples=1,  # mixing
    n_train=4, n_dev=2, n_test=3, max_epochs=2, patience=1, ranks=(2,),  # structure
    n_pairs=4, n_random=1, n_random_circuits=2, candidates=4,  # circuits
    min_positives=2,  # features (2 dev sentences: a concept needs 2 positive and 2 negative rows per split)
    attributed=2, steps=1,  # similarity
)
#: experiment -> family -> settings that differ for that family: the tiny sentencepiece vocabularies (about 100
#: pieces) hold no one-piece word, so the TFC1 terms there are two pieces ("▁" + "the")
FAMILY_SETTINGS = {"circuits": {"albert": dict(query_pieces=2), "xlm-roberta": dict(query_pieces=2)}}
#: experiments that read the masked-LM head: they run on the family's checkpoint saved with one (``head="mlm"``)
MLM_EXPERIMENTS = {"minimal-pairs"}


def save_family(family: str, folder: Path, head: str = "base") -> Path:
    """A tiny ``family`` checkpoint with its tokenizer in ``folder`` (``head="mlm"``: with its masked-LM head)."""
    mlm = head == "mlm"
    if family == "deberta-v2":
        save_tiny_deberta(folder, transformers.DebertaV2ForMaskedLM if mlm else transformers.DebertaV2Model,
                          num_hidden_layers=2)
    elif family == "modernbert":  # layer 0 global, layer 1 local (window 8: shorter than most sentences)
        save_tiny_modernbert(folder, transformers.ModernBertForMaskedLM if mlm else transformers.ModernBertModel,
                             num_hidden_layers=2)
    elif family == "bert":
        tokenizer = wordpiece_tokenizer()
        torch.manual_seed(0)
        config = transformers.BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                                         num_attention_heads=4, intermediate_size=64, max_position_embeddings=64)
        (transformers.BertForMaskedLM if mlm else transformers.BertModel)(config).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    elif family == "distilbert":
        save_tiny_family(family, folder, head=head, n_layers=2)
    else:
        save_tiny_family(family, folder, head=head, num_hidden_layers=2)
    return folder


@pytest.fixture(scope="module")
def short_corpus() -> Corpus:
    """The ``N_SENTENCES`` shortest builtin sentences (by words), in corpus order."""
    corpus = load_corpus("builtin", max_sentences=200)
    keep = sorted(sorted(range(len(corpus)), key=lambda i: len(corpus[i]))[:N_SENTENCES])
    return Corpus(corpus.name, corpus.source, [corpus[i] for i in keep])


@pytest.fixture(scope="module")
def family_model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """(family, folder, loaded model) once per family."""
    folder = save_family(request.param, tmp_path_factory.mktemp(request.param))
    return request.param, folder, models.load(folder)


def _unrendered(fig, base, formats=None, dpi=150) -> list[Path]:
    import matplotlib.pyplot as plt

    plt.close(fig)
    return []


@pytest.mark.parametrize("experiment", list(EXPERIMENTS))
@pytest.mark.parametrize("family_model", [pytest.param(f, marks=() if f in FAST_FAMILIES else pytest.mark.slow)
                                          for f in FAMILIES], indirect=True, scope="module")
def test_experiment_runs_on_family(family_model, experiment, short_corpus, tmp_path, monkeypatch) -> None:
    family, _, model = family_model
    if experiment in MLM_EXPERIMENTS:
        model = models.load(save_family(family, tmp_path / "mlm", head="mlm"))
    module = importlib.import_module(EXPERIMENTS[experiment])
    fields = {f.name for f in dataclasses.fields(module.Settings)}
    tiny = {**TINY, **FAMILY_SETTINGS.get(experiment, {}).get(family, {})}
    small = dataclasses.replace(module.Settings(), **{k: v for k, v in tiny.items() if k in fields})
    monkeypatch.setattr(module, "Settings", lambda: small)
    monkeypatch.setattr(experiment_io, "save_figure", _unrendered)
    if family not in PLOT_FAMILIES:
        monkeypatch.setattr(module, "plot", lambda out_dir: [])
    inputs = Inputs(model, short_corpus, torch.device("cpu"), torch.float32, model_summary(model),
                    corpus_summary(short_corpus))
    result = run_experiment(module, RunOptions(out=tmp_path, quiet=True, max_length=MAX_LENGTH), inputs)
    assert result.status == "complete", f"{experiment} on {family}: {result.error}"
    out = tmp_path / module.DIRNAME
    results = pd.read_parquet(out / "results.parquet")
    assert len(results) > 0
    log = "\n".join(json.loads((out / "manifest.json").read_text())["log"])
    if experiment == "mixing":
        for method, reason in UNDEFINED_MIXING.get(family, {}).items():
            assert f"{method} skipped" in log and reason in log, log
            assert not results["method"].str.fullmatch(f"(rollout:)?{method}").any()
        assert results["method"].str.fullmatch("alti").any()  # ALTI has a pre-LN form: never skipped
    if experiment == "positions":
        has_table = family not in NO_POSITION_TABLE
        assert (model.W_pos_tokens is not None) == has_table
        assert ("no absolute position table" in log) == (not has_table), log
        assert (results["metric"] == "cka_position_embedding").any() == has_table
        assert (out / "position_table_pca.csv").is_file() == has_table


@pytest.mark.parametrize("family_model", FAMILIES, indirect=True, scope="module")
def test_capture_runs_on_family(family_model, tmp_path: Path) -> None:
    family, folder, _ = family_model
    out = tmp_path / "cap"
    code = cli.main(["capture", "--hooks", "blocks.0.hook_resid_post", "--model", str(folder), "--max-sentences",
                     "6", "--batch-size", "3", "--max-length", str(MAX_LENGTH), "--out", str(out), "--device", "cpu",
                     "--quiet"])
    assert code == 0, f"capture failed on {family}"
    assert any(out.glob("shard-*.safetensors"))


@pytest.mark.parametrize("family_model", FAMILIES, indirect=True, scope="module")
def test_word_maps_and_special_tokens_follow_each_tokenizer(family_model) -> None:
    """Known answer: each word's pieces decode back to the word (whatever the word-start marker: ``##``, ``Ġ``,
    ``▁``), and the non-word positions are exactly the tokenizer's own special tokens, in its template."""
    from bertscope.experiments.corpus import encode
    from bertscope.experiments.corpus.base import Sentence

    family, _, model = family_model
    tokenizer = model.tokenizer
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
