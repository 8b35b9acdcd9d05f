"""Same-token experiment on models: a planted copy head, parity with transformers, the framework run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from bertscope.experiments import same_token
from bertscope.experiments.corpus import encode, load_corpus
from bertscope.experiments.same_token.experiment import measure
from bertscope.experiments.same_token.weights import self_preference, weight_view

from bertscope import models

PLANT_LAYER, PLANT_HEAD = 1, 2


def offset_pattern(attention_mask: torch.Tensor, m: int, n_heads: int) -> torch.Tensor:
    """[batch, head, query, key] where content token i of [CLS] w_1..w_m w_1..w_m [SEP] attends to its copy
    (i + m in the first half, i - m in the second) and [CLS]/[SEP] attend to themselves."""
    batch, n = attention_mask.shape
    if not bool((attention_mask.sum(-1) == 2 * m + 2).all()):
        raise AssertionError("every repeated-random sequence should hold 2m tokens plus [CLS] and [SEP]")
    target = torch.arange(n)
    target[1 : m + 1] += m
    target[m + 1 : 2 * m + 1] -= m
    one_hot = torch.nn.functional.one_hot(target, n).float()
    return one_hot.expand(batch, n_heads, n, n).clone()


@pytest.fixture(scope="module")
def planted(tiny_config, tokenizer) -> pd.DataFrame:
    model = models.random_encoder(tiny_config, seed=0, tokenizer=tokenizer)
    corpus = load_corpus("repeated-random", tokenizer=tokenizer, max_sentences=24, seed=3)
    m = corpus.meta["m"]

    def plant(pattern: torch.Tensor, hook) -> torch.Tensor:  # noqa: ANN001
        out = pattern.clone()
        out[:, PLANT_HEAD] = offset_pattern(torch.ones(pattern.shape[0], pattern.shape[-1]), m, 1)[:, 0]
        return out

    with model.hooks(fwd_hooks=[(f"blocks.{PLANT_LAYER}.attn.hook_pattern", plant)]):
        return measure(model, encode(corpus, tokenizer, batch_size=10), corpus=corpus.name, n_boot=50)


def test_planted_offset_head_scores_one_on_repeated_random(planted: pd.DataFrame) -> None:
    heads = planted[(planted.source == "head")].set_index(["weighting", "metric", "layer", "head"])
    for weighting in ("attention", "norm"):
        for metric in ("duplicate", "duplicate_earlier"):
            row = heads.loc[(weighting, metric, PLANT_LAYER, PLANT_HEAD)]
            assert row.value == pytest.approx(1.0, abs=1e-6), (weighting, metric)
            # uniform null: one copy among the 2m + 2 real tokens
            assert row.ratio_uniform == pytest.approx(42.0, rel=1e-6)
        assert heads.loc[(weighting, "self", PLANT_LAYER, PLANT_HEAD)].value == 0.0
        others = heads.xs((weighting, "duplicate"), level=("weighting", "metric")).drop((PLANT_LAYER, PLANT_HEAD))
        assert others.value.max() < 0.5  # random heads are near uniform (1/42 per copy)
    # every repeated-random copy sits at offset m, where every content pair is a copy: no offset support
    dup = heads.loc[("attention", "duplicate", PLANT_LAYER, PLANT_HEAD)]
    assert dup.null_kind == "uniform" and np.isnan(dup.null_offset)


def test_planted_run_covers_every_source(planted: pd.DataFrame, tiny_config) -> None:
    raw = planted[planted.source == "raw"]
    sites = ["embed.hook_word", "embed.hook_out", *(f"blocks.{i}.hook_resid_post" for i in range(tiny_config.n_layers))]
    assert sorted(raw.site.unique()) == sorted(sites)
    assert (raw["head"] == -1).all() and (raw[raw.site.str.startswith("embed")].layer == -1).all()
    heads = planted[planted.source == "head"]
    assert len(heads.groupby(["layer", "head"])) == tiny_config.n_layers * tiny_config.n_heads
    # word embeddings of copies are identical: raw attention ties them exactly, so the argmax is always
    # self-or-copy, and a copy gets exactly the self weight
    word = raw[raw.site == "embed.hook_word"].set_index("metric")
    assert word.loc["argmax_self_or_copy", "value"] == 1.0
    assert word.loc["self", "value"] == word.loc["duplicate", "value"]
    assert (planted.loc[planted.metric == "to_pad", "value"] == 0).all()


def test_numbers_agree_with_transformers_attentions(bundled, hf_bundled) -> None:
    corpus = load_corpus("builtin", max_sentences=6)
    encoded = encode(corpus, bundled.tokenizer, batch_size=4)  # two batches, the second one padded
    ours = measure(bundled, encoded, corpus="builtin", n_boot=10)
    expected = _reference_masses(hf_bundled, encoded, bundled.tokenizer)
    got = ours.set_index(["source", "site", "weighting", "metric", "layer", "head"])["value"]
    checked = 0
    for key, value in expected.items():
        assert got.loc[key] == pytest.approx(value, abs=2e-5), key
        checked += 1
    assert checked == 6 * 12 * 2 * 3 + 2 * 2  # heads x weightings x metrics + raw sites x metrics


def test_self_preference_known_answers() -> None:
    q = torch.eye(6) * torch.arange(1.0, 7.0)[:, None]  # orthogonal: a token's own key is its only match
    top1, percentile = self_preference(q, q)
    assert torch.equal(top1, torch.ones(6)) and torch.equal(percentile, torch.ones(6))
    top1, percentile = self_preference(torch.eye(4), 0.5 - torch.eye(4))  # own key scores lowest
    assert torch.equal(top1, torch.zeros(4)) and torch.equal(percentile, torch.zeros(4))


def test_weight_view_agrees_with_transformers_weights(bundled, hf_bundled) -> None:
    view = weight_view(bundled, n_tokens=300, seed=1, n_boot=20)
    assert len(view[view.source == "head"]) == 6 * 12 * 2 and set(view.corpus) == {"vocab-sample"}
    with pytest.raises(ValueError, match="n_tokens"):
        weight_view(bundled, n_tokens=10**6)

    ids = [1996, 4937, 2001, 2006, 3899, 2003, 2204, 2307, 7592, 2088, 2017, 2062]
    view = weight_view(bundled, token_ids=ids, n_boot=5).set_index(["site", "head", "metric"])["value"]
    emb = hf_bundled.embeddings
    with torch.no_grad():
        position = emb.position_embeddings.weight[1:128].mean(0)
        x = emb.LayerNorm(emb.word_embeddings.weight[ids] + emb.token_type_embeddings.weight[0] + position)
        x = x.double()
        attn = hf_bundled.encoder.layer[0].attention.self
        for h in (0, 7):
            sl = slice(h * 32, (h + 1) * 32)
            q = x @ attn.query.weight.double()[sl].T + attn.query.bias.double()[sl]
            k = x @ attn.key.weight.double()[sl].T + attn.key.bias.double()[sl]
            s = q @ k.T
            own = s.diagonal()[:, None]
            off = ~torch.eye(len(ids), dtype=torch.bool)
            top1 = float((((s > own) & off).sum(-1) == 0).double().mean())
            pct = float((((s < own) & off).sum(-1) / (len(ids) - 1)).double().mean())
            assert view[("blocks.0.attn.W_QK", h, "qk_self_top1")] == pytest.approx(top1)
            assert view[("blocks.0.attn.W_QK", h, "qk_self_percentile")] == pytest.approx(pct)
        raw = (x @ x.T).double()
        top1 = float((((raw > raw.diagonal()[:, None]) & off).sum(-1) == 0).double().mean())
        assert view[("embed.hook_out", -1, "qk_self_top1")] == pytest.approx(top1)


def test_framework_run_writes_tables_and_figures(bundled, tmp_path: Path, monkeypatch) -> None:
    from bertscope.experiments.options import Inputs, RunOptions, corpus_summary, model_summary
    from bertscope.experiments.runner import run_experiment

    monkeypatch.setattr(same_token, "Settings", lambda: same_token.experiment.Settings(n_boot=50, vocab_sample=200))
    options = RunOptions(out=tmp_path, max_sentences=6, quiet=True)
    corpus = load_corpus("builtin", max_sentences=6)
    inputs = Inputs(bundled, corpus, torch.device("cpu"), torch.float32, model_summary(bundled), corpus_summary(corpus))
    result = run_experiment(same_token, options, inputs)
    assert result.status == "complete", result.error
    out = tmp_path / same_token.DIRNAME
    results = pd.read_parquet(out / "results.parquet")
    required = ["model", "corpus", "source", "layer", "head", "metric", "value", "ci_low", "ci_high", "null",
                "ratio", "n_queries"]  # fmt: skip
    assert set(required) <= set(results.columns)
    assert set(results.corpus) == {"builtin", "repeated-random", "vocab-sample"}
    assert set(results.source) == {"raw", "head"}
    for name in ("summary.parquet", "example_maps.parquet", "heatmaps_builtin.png", "heatmaps_repeated_random.png",
                 "raw_vs_learned.png", "weights_self_preference.png", "example_maps_repeated_random.png"):
        assert (out / name).is_file(), name
    boot = results[(results.metric == "self") & (results.source == "raw")]
    assert (boot.ci_low <= boot.value).all() and (boot.value <= boot.ci_high).all()
    assert set(results.loc[results.corpus != "vocab-sample", "n_sentences"]) == {6}


# ------------------------------------------------------------------------------------------------ helpers


@torch.no_grad()
def _reference_masses(hf, encoded, tokenizer) -> dict[tuple, float]:
    """Self, duplicate and duplicate_earlier mass per head (plain and Kobayashi norm-weighted) and raw self
    and duplicate mass on the word embeddings and embedding output, from transformers' BertModel with
    explicit per-query loops."""
    specials = {tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id}
    sums: dict[tuple, list[float]] = {}

    def add(key: tuple, value: float) -> None:
        sums.setdefault(key, []).append(value)

    for batch in encoded:
        ids, mask = batch.input_ids, batch.attention_mask
        out = hf(input_ids=ids, attention_mask=mask, token_type_ids=batch.token_type_ids,
                 output_attentions=True, output_hidden_states=True)  # fmt: skip
        word = hf.embeddings.word_embeddings(ids)
        n_heads = hf.config.num_attention_heads
        d_head = hf.config.hidden_size // n_heads
        for b in range(ids.shape[0]):
            n = int(mask[b].sum())
            toks = ids[b, :n].tolist()
            content = [i for i in range(n) if toks[i] not in specials]
            copies = {i: [j for j in content if j != i and toks[j] == toks[i]] for i in content}
            patterns = {}
            for layer, att in enumerate(out.attentions):
                a = att[b, :, :n, :n].double()
                attn = hf.encoder.layer[layer].attention
                x = out.hidden_states[layer][b, :n].double()
                v = x @ attn.self.value.weight.double().T + attn.self.value.bias.double()
                w_o = attn.output.dense.weight.double()  # [d_model, d_model]: out = concat(z) @ w_o.T
                for h in range(n_heads):
                    sl = slice(h * d_head, (h + 1) * d_head)
                    f = v[:, sl] @ w_o[:, sl].T  # [key, d_model]
                    weighted = a[h] * f.norm(dim=-1)[None, :]
                    patterns[("head", f"blocks.{layer}.attn.hook_pattern", "attention", layer, h)] = a[h]
                    patterns[("head", f"blocks.{layer}.attn.hook_pattern", "norm", layer, h)] = (
                        weighted / weighted.sum(-1, keepdim=True)
                    )
            for site, x in (("embed.hook_word", word[b, :n]), ("embed.hook_out", out.hidden_states[0][b, :n])):
                x = x.double()
                patterns[("raw", site, "attention", -1, -1)] = (x @ x.T / x.shape[-1] ** 0.5).softmax(-1)
            for (source, site, weighting, layer, h), a in patterns.items():
                metrics = ("self", "duplicate") if source == "raw" else ("self", "duplicate", "duplicate_earlier")
                for i in content:
                    keys = {"self": [i], "duplicate": copies[i], "duplicate_earlier": [j for j in copies[i] if j < i]}
                    for metric in metrics:
                        if metric != "self" and not keys[metric]:
                            continue
                        add((source, site, weighting, metric, layer, h), float(a[i, keys[metric]].sum()))
    return {key: float(np.mean(values)) for key, values in sums.items()}
