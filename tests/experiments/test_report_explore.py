"""The explorer in the report and on the command line: the notable-head rule (planted tables and a planted
attention pattern), ``bertscope report --explore/--explore-ids`` and the default, ``bertscope explore``."""

from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from bertscope.experiments import cli, report_explore
from bertscope.experiments.explorer import mixing_methods


def bertscope(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def fake_run(out: Path, model: Path | None, tables: bool = True, max_sentences: int = 12) -> Path:
    """A results folder: a same-token manifest (the run's options) and, with ``tables``, the two tables the
    default rule reads, naming duplicate head L1H0 and syntax head L0H1."""
    d = out / "same_token"
    d.mkdir(parents=True)
    options = {"model": None if model is None else str(model), "corpus": "builtin", "max_sentences": max_sentences,
               "seed": 0}  # fmt: skip
    (d / "manifest.json").write_text(json.dumps({"experiment": "same-token", "status": "complete",
                                                 "options": options}))  # fmt: skip
    if tables:
        summary = pd.DataFrame({"stat": ["heads max", "top duplicate ratio", "top duplicate ratio"],
                                "layer": [None, 1, 0], "head": [None, 0, 2], "ratio": [None, 9.0, 3.0]})  # fmt: skip
        summary.to_csv(d / "summary.csv", index=False)
        (out / "heads").mkdir()
        pd.DataFrame({"relation": ["ALL", "punct", "nsubj", "amod"], "layer": [1, 1, 0, 1], "head": [1, 1, 1, 3],
                      "gain": [0.5, 0.9, 0.2, -0.1]}).to_csv(out / "heads" / "syntax.csv", index=False)  # fmt: skip
    return out


def test_notable_heads_are_read_from_the_tables(tmp_path: Path) -> None:
    out = fake_run(tmp_path / "r", None)
    assert report_explore.notable_heads(out) == {"duplicate": [(1, 0), (0, 2)], "syntax": [(0, 1)]}
    assert report_explore.notable_heads(tmp_path) == {"duplicate": [], "syntax": []}


def test_head_activity_known_answers() -> None:
    # sentence 0: [CLS] a b a [SEP]; sentence 1: [CLS] a b c [SEP] (no repeats)
    ids = torch.tensor([[101, 5, 6, 5, 102], [101, 5, 6, 7, 102]])
    mask = torch.ones_like(ids)
    special = torch.tensor([[1, 0, 0, 0, 1]] * 2).bool()
    pattern = torch.zeros(2, 5, 5)
    pattern[:, :, 0] = 1.0  # everything on [CLS] ...
    pattern[0, 1, :] = torch.tensor([0.2, 0.0, 0.0, 0.8, 0.0])  # ... but token 1 gives 0.8 to its copy (3)
    pattern[0, 3, :] = torch.tensor([0.6, 0.4, 0.0, 0.0, 0.0])  # and token 3 gives 0.4 to its copy (1)
    pattern[1, 2, :] = torch.tensor([0.3, 0.7, 0.0, 0.0, 0.0])  # sentence 1: token 2 looks at token 1
    dup = report_explore.head_activity(pattern, ids, mask, special, "duplicate")
    np.testing.assert_allclose(dup, [(0.8 + 0.4) / 2, 0.0])
    syn = report_explore.head_activity(pattern, ids, mask, special, "syntax")
    np.testing.assert_allclose(syn, [(0.8 + 0.0 + 0.4) / 3, (0.0 + 0.7 + 0.0) / 3])


def test_report_default_explorer_picks_sentences_by_the_notable_heads(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, tiny_model_dir: Path
) -> None:
    out = fake_run(tmp_path / "r", tiny_model_dir)
    code, stdout, err = bertscope(capsys, "report", out, "--device", "cpu")
    assert code == 0, err
    assert "5 sentences, where the notable heads are most active among the first 12 sentences" in stdout
    assert "duplicate heads L1H0, L0H2; syntax heads L0H1" in stdout
    page = (out / "index.html").read_text()
    assert '<section id="explorer">' in page and "<iframe srcdoc=" in page
    assert "<script" not in page  # the explorer's script lives, escaped, inside the iframe's srcdoc
    # the chosen sentences are the best-scoring ones, as score_sentences ranks them
    from bertscope.experiments.corpus import load_corpus
    from bertscope.experiments.options import load_model

    model = load_model(str(tiny_model_dir), device=torch.device("cpu"), dtype=torch.float32)
    texts = [s.text for s in load_corpus("builtin", max_sentences=12, seed=0).sentences]
    score = report_explore.score_sentences(model, texts, report_explore.notable_heads(out))
    best = np.argsort(-score, kind="stable")[:5]
    srcdoc = html.unescape(page.split("<iframe srcdoc=")[1].split("></iframe>")[0])
    for i in best:
        assert json.dumps(texts[i])[1:-1].replace("<", "\\u003c") in srcdoc


def test_report_explore_n_and_ids_and_unavailable(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, tiny_model_dir: Path
) -> None:
    out = fake_run(tmp_path / "r", tiny_model_dir, tables=False)
    code, stdout, err = bertscope(capsys, "report", out)  # default, but no tables: says so, embeds nothing
    assert code == 0 and "no explorer: no notable heads" in err and "<iframe" not in (out / "index.html").read_text()
    code, stdout, _ = bertscope(capsys, "report", out, "--explore", "2", "--device", "cpu")
    assert code == 0 and "2 sentences, the first 2 corpus sentences" in stdout
    code, stdout, _ = bertscope(capsys, "report", out, "--explore-ids", "3,7", "--device", "cpu", "--mixing", "alti")
    assert code == 0 and "chosen with --explore-ids" in stdout
    page = (out / "index.html").read_text()
    assert "<td>3</td>" in page and "<td>7</td>" in page and "ALTI (Ferrando et al. 2022)" in html.unescape(page)
    size = len(page.encode())
    code, _, err = bertscope(capsys, "report", out, "--explore-ids", "3,99")
    assert code == 2 and err.count("\n") == 1 and "outside the corpus" in err
    code, _, err = bertscope(capsys, "report", out, "--explore-ids", "a,b")
    assert code == 2 and err.count("\n") == 1
    assert len((out / "index.html").read_bytes()) == size  # a usage error writes nothing
    code, _, err = bertscope(capsys, "report", out, "--explore", "2", "--model", str(tmp_path / "nowhere"))
    assert code == 0 and "no explorer: the model is unavailable" in err


def test_explore_command_writes_one_page_and_refuses_bad_input(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, tiny_model_dir: Path
) -> None:
    page = tmp_path / "explore.html"
    common = ["--model", tiny_model_dir, "--device", "cpu"]
    code, stdout, err = bertscope(capsys, "explore", "The cat sat.", "A dog barked loudly.", *common,
                                  "--mixing", "attention_norm", "--out", page)  # fmt: skip
    assert code == 0, err
    assert f"explorer: {page}" in stdout and "2 sentence(s)" in stdout
    text = page.read_text()
    assert '"id":"attention_norm"' in text and "A dog barked loudly." in text and not list(tmp_path.glob("*.partial"))
    for bad in (["", "--out", tmp_path / "a.html"], ["x", "--mixing", "nope", "--out", tmp_path / "b.html"],
                ["x", "--out", tmp_path / "c.txt"], ["one two three four", "--max-length", "3",
                                                       "--out", tmp_path / "d.html"]):  # fmt: skip
        code, _, err = bertscope(capsys, "explore", *bad, *common)
        assert code == 2 and err.startswith("bertscope: error:") and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["explore.html"]  # nothing else written


def test_mixing_methods_parses_and_refuses() -> None:
    assert mixing_methods("alti, attention_norm,alti") == ["alti", "attention_norm"]
    assert mixing_methods(None) == []
    for bad in ("attention", "grad_x_input", "nope", ""):
        with pytest.raises(ValueError, match="choose from"):
            mixing_methods(bad)
