"""The explorer's data (hooks -> real-token arrays -> quantised codes) and its page (self-contained, safe).

Browser tests are in test_explorer_browser.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from bertscope.experiments import explorer
from bertscope.experiments.explorer import data, page
from helpers import corpus_texts

from bertscope import models

XSS = "</script><img src=x onerror=alert(1)> <script>window.__pwned=1</script> & \u2028 end"


@pytest.fixture(scope="module")
def tiny(tiny_config, tokenizer) -> models.Encoder:
    """A tiny random encoder (2 layers, 4 heads, d_head 8) with the bundled tokenizer."""
    return models.random_encoder(tiny_config, seed=3, tokenizer=tokenizer)


def _scripts(document: str) -> list[str]:
    return re.findall(r"<script\b[^>]*>(.*?)</script>", document, flags=re.S)


# ---------------------------------------------------------------------------------------------- hooks
def test_softmax_of_q_dot_k_is_the_hooked_pattern(bundled):
    """The query-key view's convention: pattern = softmax(q . k / sqrt(d_head) + mask) over keys, with q and k
    from ``blocks.L.attn.hook_q`` / ``hook_k`` ``[batch, pos, head, d_head]`` (padded keys excluded)."""
    inputs = bundled.tokenize(["The cat sat on the mat.", "Dogs bark."])
    assert not bool(inputs["attention_mask"].all())  # the batch is padded
    _, cache = bundled.run_with_cache(**inputs, names_filter=lambda n: n.endswith(("hook_q", "hook_k", "hook_pattern")))
    keep = inputs["attention_mask"].bool()[:, None, None, :]
    for layer in range(bundled.config.n_layers):
        q, k = cache[f"blocks.{layer}.attn.hook_q"], cache[f"blocks.{layer}.attn.hook_k"]
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / q.shape[-1] ** 0.5
        ours = scores.masked_fill(~keep, float("-inf")).softmax(-1)
        torch.testing.assert_close(ours, cache[f"blocks.{layer}.attn.hook_pattern"], atol=1e-5, rtol=1e-4)


def test_capture_keeps_only_real_tokens_and_matches_unpadded_runs(tiny):
    texts = ["The cat sat on the mat because it was tired.", "Dogs bark.", "A"]
    caught = data.capture(tiny, tiny.tokenize(texts), batch_size=2)  # two chunks
    for i, text in enumerate(texts):
        alone = tiny.tokenize([text])
        n = int(alone["input_ids"].shape[1])
        assert len(caught.tokens[i]) == n and caught.tokens[i][0] == "[CLS]" and caught.tokens[i][-1] == "[SEP]"
        assert caught.pattern[i].shape == (2, 4, n, n)
        assert caught.q[i].shape == caught.k[i].shape == (2, n, 4, 8)
        _, cache = tiny.run_with_cache(**alone, names_filter=lambda name: name.endswith(("hook_pattern", "hook_q")))
        ref = torch.stack([cache[f"blocks.{layer}.attn.hook_pattern"][0] for layer in range(2)]).numpy()
        np.testing.assert_allclose(caught.pattern[i], ref, atol=1e-5)
        np.testing.assert_allclose(caught.q[i][1], cache["blocks.1.attn.hook_q"][0].numpy(), atol=1e-5)
        np.testing.assert_allclose(caught.pattern[i].sum(-1), 1.0, atol=1e-5)


def test_capture_leaves_out_queries_and_keys_where_not_asked(tiny):
    caught = data.capture(tiny, tiny.tokenize(["one", "two", "three"]), qk=[False, True, False], batch_size=1)
    assert caught.q[0] is None and caught.k[2] is None and caught.q[1] is not None


# ---------------------------------------------------------------------------------------------- codes
def test_map_code_round_trips_within_half_a_step_and_keeps_zeros():
    rng = np.random.default_rng(0)
    m = rng.random((3, 2, 7, 7)).astype(np.float32)
    m[m < 0.4] = 0.0
    m[1, 1] = -m[1, 1]  # a signed head: lo < 0
    m[2, 0] = 0.0  # a constant head
    enc = data.encode_map(m)
    back = data.decode_map(enc, m.shape)
    span = np.maximum(m.reshape(6, -1).max(1), 0) - np.minimum(m.reshape(6, -1).min(1), 0)
    step = np.where(span > 0, span, 1.0).reshape(3, 2, 1, 1) / data.MAP_LEVELS
    assert np.all(np.abs(back - m) <= step / 2 + 1e-6)
    assert np.all(back[0, 0][m[0, 0] == 0] == 0)  # exact zeros stay exact zeros (they are what compresses)
    assert np.all(back[2, 0] == 0)


def test_map_code_uses_the_fixed_unit_scale_for_probabilities():
    rng = np.random.default_rng(2)
    m = rng.dirichlet(np.ones(9) * 0.3, size=(2, 3, 9)).astype(np.float32)  # rows sum to 1
    enc = data.encode_map(m)
    assert np.all(np.frombuffer(__import__("base64").b64decode(enc["hi"]), "<f4") == 1.0)
    back = data.decode_map(enc, m.shape)
    assert np.all(np.abs(back - m) <= 0.5 / data.MAP_LEVELS + 1e-6)
    assert np.all(back[m < 0.5 / data.MAP_LEVELS] == 0)


def test_qk_code_round_trips_within_half_a_step():
    rng = np.random.default_rng(1)
    q = rng.normal(size=(2, 5, 3, 4)).astype(np.float32)
    k = 3 * rng.normal(size=(2, 5, 3, 4)).astype(np.float32)
    enc = data.encode_qk(q, k)
    q2, k2 = data.decode_qk(enc, 5)
    for orig, back in ((q, q2), (k, k2)):
        step = np.abs(orig).max(axis=1, keepdims=True) / data.QK_LEVELS  # per layer, head and dimension
        assert np.all(np.abs(back - orig) <= step / 2 + 1e-6)


# ---------------------------------------------------------------------------------------------- explore
def test_explore_with_extra_maps_per_method(tiny):
    """The mixing-method path: ``[batch, layer, query, key]`` over the padded batch, or one ``[layer, query,
    key]`` per sentence over its real tokens; padded positions never reach the page."""
    texts = ["The cat sat on the mat.", "Dogs bark."]
    inputs = tiny.tokenize(texts)
    padded = int(inputs["input_ids"].shape[1])
    mask = inputs["attention_mask"].bool()
    rng = torch.Generator().manual_seed(0)
    batch_maps = torch.rand(2, 2, padded, padded, generator=rng)
    real = mask[:, None, :, None] & mask[:, None, None, :]
    batch_maps = torch.where(real, batch_maps, torch.full_like(batch_maps, 99.0))  # padding: a value to spot
    lengths = [int(m.sum()) for m in mask]
    per_sentence = [torch.rand(3, n, n, generator=rng) for n in lengths]  # its own layer count

    view = explorer.explore(tiny, texts, maps={"alti": batch_maps, "mine": per_sentence}, labels={"alti": "ALTI"})
    methods = {m["id"]: m for m in view.payload["methods"]}
    assert list(methods) == ["attention", "alti", "mine"]
    assert (methods["alti"]["layers"], methods["alti"]["heads"], methods["alti"]["label"]) == (2, 1, "ALTI")
    assert (methods["mine"]["layers"], methods["mine"]["heads"]) == (3, 1)
    assert (methods["attention"]["layers"], methods["attention"]["heads"], methods["attention"]["vmax"]) == (2, 4, 1.0)
    for i, n in enumerate(lengths):
        s = view.payload["sentences"][i]
        assert len(s["tokens"]) == n
        alti = data.decode_map(s["maps"]["alti"], (2, 1, n, n))
        real_pos = mask[i].nonzero().flatten()
        want = batch_maps[i][:, real_pos][:, :, real_pos].numpy()
        assert alti.max() <= 1.0  # the planted 99s were padding and are gone
        np.testing.assert_allclose(alti[:, 0], want, atol=1 / data.MAP_LEVELS)
        mine = data.decode_map(s["maps"]["mine"], (3, 1, n, n))
        np.testing.assert_allclose(mine[:, 0], per_sentence[i].numpy(), atol=1 / data.MAP_LEVELS)


def test_explore_rejects_bad_maps_clearly(tiny):
    texts = ["The cat sat.", "Dogs bark."]
    with pytest.raises(ValueError, match="has 3 sentences, expected 2"):
        explorer.explore(tiny, texts, maps={"alti": torch.rand(3, 2, 5, 5)})
    with pytest.raises(ValueError, match="padded length"):
        explorer.explore(tiny, texts, maps={"alti": torch.rand(2, 2, 4, 4)})
    with pytest.raises(ValueError, match="another name"):
        explorer.explore(tiny, texts, maps={"attention": [torch.rand(2, 5, 5), torch.rand(2, 4, 4)]})
    with pytest.raises(ValueError, match="non-empty"):
        explorer.explore(tiny, [])
    with pytest.raises(ValueError, match="qk indices"):
        explorer.explore(tiny, texts, qk=[5])


def test_qk_auto_embeds_short_sentences_and_stays_within_budget(tiny, monkeypatch):
    short = explorer.explore(tiny, ["one", "two words", "three little words"])
    assert all(s["qk"] is not None for s in short.payload["sentences"])
    per_token = 2 * tiny.config.n_layers * tiny.config.d_model
    n_fit = 2
    monkeypatch.setattr(explorer, "QK_AUTO_BYTES", per_token * 60 * n_fit + 10)
    long = [" ".join(["word"] * 58)] * (n_fit + 3)  # 60 tokens each
    caught = explorer.explore(tiny, long)
    has = [s["qk"] is not None for s in caught.payload["sentences"]]
    assert has == [True] * n_fit + [False] * 3
    none = explorer.explore(tiny, ["one", "two"], qk=False)
    assert all(s["qk"] is None for s in none.payload["sentences"])
    some = explorer.explore(tiny, ["one", "two"], qk=[1])
    assert [s["qk"] is not None for s in some.payload["sentences"]] == [False, True]


# ---------------------------------------------------------------------------------------------- page
def test_page_is_self_contained_and_data_cannot_become_markup():
    tokens = ["[CLS]", "</script><img src=x onerror=window.__pwned=1>", "&amp;", "\u2028", "<b>", "[SEP]"]
    n = len(tokens)
    sentence = data.SentenceData(XSS, tokens, {"attention": np.full((1, 2, n, n), 1 / n, np.float32)})
    view = explorer.build([sentence], labels={"attention": "<i>attention</i>"}, title="<title>&")
    document = view.html()
    assert document.count("<script") == 2 and len(_scripts(document)) == 2
    assert "<img" not in document and "<b>" not in document and "<i>" not in document
    assert "\u2028" not in document and "\u2029" not in document
    assert "<title>&lt;title&gt;&amp;</title>" in document
    raw = re.search(r'<script type="application/json" id="bs-data">(.*?)</script>', document, re.S).group(1)
    code = document.replace(raw, "")
    assert not re.search(r"\b(src|href)\s*=|https?://|@import|url\(", code)  # nothing loaded from anywhere
    assert json.loads(raw) == view.payload  # the escapes are JSON escapes: the data arrive unchanged
    assert view.payload["sentences"][0]["tokens"] == tokens and view.payload["sentences"][0]["text"] == XSS


def test_page_allows_only_its_own_script_by_hash():
    import base64
    import hashlib

    n = 3
    view = explorer.build([data.SentenceData("a b c", list("abc"), {"attention": np.ones((1, 1, n, n)) / n})])
    document = view.html()
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', document).group(1)
    script = page.asset("explorer.js")
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in csp and "default-src 'none'" in csp
    assert _scripts(document)[1] == script


def test_save_and_jupyter_repr(tiny, tmp_path):
    view = explorer.explore(tiny, "The cat sat.")
    (tmp_path / "out").mkdir()
    path = view.save(tmp_path / "out" / "explore.html")
    assert path.read_text(encoding="utf-8") == view.html()
    assert not list((tmp_path / "out").glob("*.partial"))
    shown = view._repr_html_()
    assert shown.startswith("<iframe srcdoc=") and "<script" not in shown  # the whole page, attribute-escaped
    assert "Explorer: 1 sentence" in repr(view)


@pytest.mark.slow
def test_import_bertscope_does_not_import_the_explorer():
    code = "import sys, bertscope; print('bertscope.experiments.explorer' in sys.modules, callable(bertscope.explore))"
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True"]


@pytest.mark.slow
def test_ten_sentences_of_128_tokens_fit_in_5_mb(bundled):
    texts = corpus_texts(bundled.tokenizer, 10, 128)
    view = explorer.explore(bundled, texts)
    lengths = [len(s["tokens"]) for s in view.payload["sentences"]]
    assert min(lengths) >= 120 and max(lengths) <= 128
    size = view.nbytes
    print(f"\nexplorer size, 10 sentences x {lengths} tokens, bundled model: {size / 1e6:.2f} MB ({size} bytes)")
    assert size <= 5_000_000
