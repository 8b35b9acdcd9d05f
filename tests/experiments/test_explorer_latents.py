"""The explorer's latent view (issue 29: `bertscope explore` colours tokens by a chosen latent).

Known answer: a dictionary at ``embed.hook_word`` (each row is the token's own embedding) whose latent 1 is
planted to fire on one token id, "cat": its threshold sits between that token's projection and every other
token's in the texts, so the page must colour exactly the "cat" tokens, with the value the planted rule gives.
The page in real Chromium is tested in test_explorer_latents_browser.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from bertscope.experiments import cli, explorer
from bertscope.experiments.options import load_model
from bertscope.probes.dictionary import Dictionary, DictionaryConfig, save_dictionary

TEXTS = ["The cat sat on the mat with another cat.", "A dog saw a cat </b><img src=x> & ran."]
SITE = "embed.hook_word"


def planted(model, folder: Path, token: str = "cat", texts=TEXTS, d_in: int | None = None) -> tuple[Path, float]:
    """Save a ReLU SAE at ``embed.hook_word`` whose latent 1 fires on ``token`` only (among the tokens of
    ``texts``), latent 0 never fires, latent 2 is 0.5 everywhere; returns the folder and latent 1's value on
    ``token``."""
    e = model.embed.word.weight.detach().float()
    tid = model.tokenizer.convert_tokens_to_ids(token)
    w = e[tid] / e[tid].norm()
    ids = sorted({i for row in model.tokenizer(list(texts))["input_ids"] for i in row} - {tid})
    own, others = float(e[tid] @ w), float((e[ids] @ w).max())
    assert own > others + 1e-3
    threshold = (own + others) / 2
    width = d_in or e.shape[1]
    d = Dictionary(DictionaryConfig(d_in=width, d_sae=3, arch="relu", kind="sae", site=SITE))
    with torch.no_grad():
        for p in (d.W_enc, d.b_enc, d.W_dec, d.b_dec):
            p.zero_()
        d.W_enc[:, 1] = w[:width] if d_in else w
        d.b_enc.copy_(torch.tensor([-1.0, -threshold, 0.5]))
        d.W_dec[1] = w[:width] if d_in else w
    save_dictionary(d, folder)
    return folder, own - threshold


@pytest.fixture(scope="module")
def tiny(tiny_config, tokenizer):
    from bertscope import models

    return models.random_encoder(tiny_config, seed=3, tokenizer=tokenizer)


def test_planted_latent_colours_exactly_its_token(tiny, tmp_path: Path):
    folder, value = planted(tiny, tmp_path / "cat-dict")
    view = explorer.explore(tiny, TEXTS, dictionary=folder, latents=[1, 0, 2])
    info = view.payload["latents"]
    assert info["ids"] == [1, 0, 2] and info["site"] == SITE and info["dictionary"] == "cat-dict"
    assert info["d_sae"] == 3 and str(tmp_path) not in json.dumps(info)  # no local path on a shared page
    n_cat = 0
    for s in view.payload["sentences"]:
        cat = np.array([t == "cat" for t in s["tokens"]])
        v = np.array(s["latents"])
        assert v.shape == (3, len(s["tokens"]))
        assert ((v[0] > 0) == cat).all()  # latent 1 fires on exactly the "cat" tokens
        np.testing.assert_allclose(v[0][cat], value, rtol=1e-3)
        assert (v[1] == 0).all() and np.allclose(v[2], 0.5)
        n_cat += int(cat.sum())
    assert n_cat == 3
    assert info["vmax"] == pytest.approx([value, 0.0, 0.5], rel=1e-3)


def test_latent_values_are_the_dictionarys_encoding_of_the_site(tiny, tmp_path: Path):
    """Not only the planted case: any dictionary's values are ``encode`` of the hooked rows at its site."""
    d = Dictionary(DictionaryConfig(d_in=32, d_sae=16, arch="topk", k=4, site="blocks.1.hook_resid_post"))
    d.init_weights(torch.Generator().manual_seed(1))
    view = explorer.explore(tiny, TEXTS[:1], dictionary=d, latents="3,7", qk=False)
    inputs = tiny.tokenize(TEXTS[:1])
    _, cache = tiny.run_with_cache(inputs["input_ids"], inputs["attention_mask"])
    want = d.encode(cache["blocks.1.hook_resid_post"][0])[:, [3, 7]].T.detach().numpy()
    np.testing.assert_allclose(view.payload["sentences"][0]["latents"], want, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("case", ["not a dictionary", "out of range", "site missing", "other width", "no latents"])
def test_bad_dictionary_or_latent_is_a_clear_error(tiny, tmp_path: Path, case: str):
    folder, _ = planted(tiny, tmp_path / "d")
    latents: object = 1
    if case == "not a dictionary":
        folder = tmp_path / "empty"
        folder.mkdir()
    elif case == "out of range":
        latents = 3
    elif case == "site missing":
        d = Dictionary(DictionaryConfig(d_in=32, d_sae=4, arch="relu", site="blocks.7.hook_resid_post"))
        folder = save_dictionary(d, tmp_path / "deep")
    elif case == "other width":
        folder, _ = planted(tiny, tmp_path / "narrow", d_in=16)
    else:
        latents = ""
    expected = {"not a dictionary": "is not a dictionary", "out of range": "latent 3 is out of range",
                "site missing": "lacks", "other width": "another model", "no latents": "at least one latent"}[case]
    with pytest.raises(ValueError, match=expected):
        explorer.explore(tiny, TEXTS, dictionary=folder, latents=latents)


# ---------------------------------------------------------------------------------------------- the CLI
def bertscope(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_explore_colours_by_the_planted_latent(capsys, tmp_path: Path, tiny_model_dir: Path):
    model = load_model(str(tiny_model_dir), device=torch.device("cpu"), dtype=torch.float32)
    folder, value = planted(model, tmp_path / "dict")
    page = tmp_path / "e.html"
    code, out, err = bertscope(capsys, "explore", *TEXTS, "--model", tiny_model_dir, "--dictionary", folder,
                               "--latent", "1,2", "--out", page)
    assert code == 0, err
    assert "latent view: 1, 2 of embed.hook_word" in out
    doc = page.read_text()
    data = json.loads(re.search(r'id="bs-data">(.*?)</script>', doc, re.S).group(1))
    for s in data["sentences"]:
        cat = np.array([t == "cat" for t in s["tokens"]])
        assert ((np.array(s["latents"][0]) > 0) == cat).all()
    assert "<img src=x>" not in doc and "http://" not in doc and "https://" not in doc


@pytest.mark.parametrize("case", ["not a dictionary", "out of range", "site missing", "other width", "alone"])
def test_cli_explore_refuses_in_one_line_exit_2(capsys, tmp_path: Path, tiny_model_dir: Path, case: str):
    model = load_model(str(tiny_model_dir), device=torch.device("cpu"), dtype=torch.float32)
    folder, _ = planted(model, tmp_path / "d")
    args = ["--dictionary", folder, "--latent", "1"]
    if case == "not a dictionary":
        args[1] = tmp_path
    elif case == "out of range":
        args[3] = "99"
    elif case == "site missing":
        d = Dictionary(DictionaryConfig(d_in=32, d_sae=4, arch="relu", site="blocks.9.hook_resid_post"))
        args[1] = save_dictionary(d, tmp_path / "deep")
    elif case == "other width":
        args[1], _ = planted(model, tmp_path / "narrow", d_in=16)
    else:
        args = args[:2]
    page = tmp_path / "e.html"
    code, _, err = bertscope(capsys, "explore", "a cat", "--model", tiny_model_dir, *args, "--out", page)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert not page.exists()
