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
    assert set(results.corpus) == {"builtin", "repeated-random", "random-control", "vocab-sample"}
    held = pd.read_parquet(out / "held_out.parquet")
    assert set(held.selection) == {"held-out"} and set(held.corpus) == {"builtin", "repeated-random"}
    assert {"duplicate_copy_specific", "duplicate_type_balanced"} <= set(results.metric)
    summary = pd.read_parquet(out / "summary.parquet")
    assert {"held-out", "in-sample"} <= set(summary.selection)
    findings = same_token.findings(out)
    assert any(f.claim == "same-token" for f in findings)
    assert all(any(ch.isdigit() for ch in f.text) for f in findings)
    assert set(same_token.CAPTIONS) >= {p.stem for p in out.glob("*.png")}
    assert set(results.source) == {"raw", "head"}
    for name in ("summary.parquet", "example_maps.parquet", "heatmaps_builtin.png", "heatmaps_repeated_random.png",
                 "raw_vs_learned.png", "weights_self_preference.png", "example_maps_repeated_random.png"):
        assert (out / name).is_file(), name
    boot = results[(results.metric == "self") & (results.source == "raw")]
    assert (boot.ci_low <= boot.value).all() and (boot.value <= boot.ci_high).all()
    assert set(results.loc[results.corpus != "vocab-sample", "n_sentences"]) == {6}


def test_control_separates_copy_heads_from_offset_heads(tiny_config, tokenizer) -> None:
    """An offset-m head scores duplicate 1 on repeated-random AND 1 at the would-be copies of the control:
    copy-specific mass 0. A head that attends to copies of its token scores 1 on repeated-random and ~0 on
    the control (it falls back to [CLS]): copy-specific 1."""
    from bertscope.experiments.same_token.collect import collect
    from bertscope.experiments.same_token.control import control_corpus, copy_specific

    model = models.random_encoder(tiny_config, seed=0, tokenizer=tokenizer)
    repeated = load_corpus("repeated-random", tokenizer=tokenizer, max_sentences=8, seed=3)
    m = repeated.meta["m"]
    control = control_corpus(tokenizer, 8, m=m, seed=3)
    assert all(len(set(s.words)) == 2 * m for s in control)  # same length, no repeats
    ids_in = {}

    def plant(pattern: torch.Tensor, hook) -> torch.Tensor:  # noqa: ANN001
        out = pattern.clone()
        n = pattern.shape[-1]
        out[:, PLANT_HEAD] = offset_pattern(torch.ones(pattern.shape[0], n), m, 1)[:, 0]
        ids = ids_in["ids"]
        same = (ids[:, :, None] == ids[:, None, :]) & ~torch.eye(n, dtype=torch.bool)
        same[:, :, 0] |= ~same.any(-1)  # no copy: all mass on [CLS]
        out[:, PLANT_HEAD + 1] = same.float() / same.float().sum(-1, keepdim=True)
        return out

    stores = {}
    for corpus, shadow in ((repeated, None), (control, m)):
        batches = list(encode(corpus, tokenizer, batch_size=8))
        ids_in["ids"] = batches[0].input_ids
        with model.hooks(fwd_hooks=[(f"blocks.{PLANT_LAYER}.attn.hook_pattern", plant)]):
            stores[corpus.name] = collect(model, batches, shadow_m=shadow)
    table = copy_specific(stores["repeated-random"], stores["random-control"], n_boot=20)
    rows = table[table.weighting == "attention"].set_index(["layer", "head"])
    offset_head, copy_head = rows.loc[(PLANT_LAYER, PLANT_HEAD)], rows.loc[(PLANT_LAYER, PLANT_HEAD + 1)]
    assert offset_head.null == pytest.approx(1.0) and offset_head.value == pytest.approx(0.0, abs=1e-6)
    assert copy_head.null == pytest.approx(0.0, abs=1e-6) and copy_head.value == pytest.approx(1.0)
    assert (table.ci_low <= table.value + 1e-9).all() and (table.value <= table.ci_high + 1e-9).all()


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


def test_findings_are_generated_from_the_tables(tmp_path: Path) -> None:
    """Planted tables: raw self mass 0.9 / 0.6 against a 0.05 null, 3 of 4 heads far below: the claim holds and
    the sentence cites those numbers; flip the heads above raw and the verdict becomes partial."""
    def row(site: str, value: float, **extra) -> dict:  # noqa: ANN003
        return {"corpus": "builtin", "source": "raw", "site": site, "layer": -1, "head": -1,
                "weighting": "attention", "metric": "self", "value": value, "ci_low": value - 0.02,
                "ci_high": value + 0.02, "null_uniform": 0.05, "n_sentences": 10, **extra}

    heads = [{**row("blocks.0.attn.hook_pattern", v), "source": "head", "layer": 0, "head": h}
             for h, v in enumerate([0.1, 0.1, 0.2, 0.9])]
    pd.DataFrame([row("embed.hook_word", 0.9), row("embed.hook_out", 0.6), *heads]).to_parquet(
        tmp_path / "results.parquet")
    (claim,) = same_token.findings(tmp_path)
    assert claim.claim == "same-token" and claim.holds is True
    assert "0.90 [0.88, 0.92]" in claim.text and "0.60 [0.58, 0.62]" in claim.text and "3 of 4" in claim.text
    heads = [{**h, "value": 0.95, "ci_low": 0.93, "ci_high": 0.97} for h in heads]
    pd.DataFrame([row("embed.hook_word", 0.9), row("embed.hook_out", 0.6), *heads]).to_parquet(
        tmp_path / "results.parquet")
    (claim,) = same_token.findings(tmp_path)
    assert claim.holds is None and "0 of 4" in claim.text
