"""Each latent's top activating contexts and quantile samples (issue 40 item 10): known answers on planted rows
(``latent_samples``), and ``sae train`` writes them beside each dictionary (``latent_contexts.parquet``)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
import transformers
from bertscope.experiments.cli import main
from bertscope.experiments.corpus import load_corpus
from bertscope.experiments.dictionary import CorpusActivations
from bertscope.probes.dictionary import identity_dictionary, latent_samples, load_dictionary
from helpers import save_tiny_bert

import bertscope

SITE = "blocks.0.hook_resid_post"


def _planted(n: int = 500, d: int = 4, seed: int = 0) -> torch.Tensor:
    """Rows whose coordinate 0 is positive on a random third of the rows with distinct values; the identity
    dictionary's latent 0 is ``relu(x[:, 0])``, so it fires exactly there."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    x[:, 0] = -torch.rand(n, generator=g) - 0.1
    fires = torch.randperm(n, generator=g)[: n // 3]
    x[fires, 0] = torch.rand(len(fires), generator=g) * 5 + 0.01
    return x


def _rows(x: torch.Tensor, parts: int = 3):
    """``x`` in uneven pieces with per-row metadata (``tag`` = the global row)."""
    cuts = np.linspace(0, len(x), parts + 1).astype(int)
    return [(x[a:b], pd.DataFrame({"tag": np.arange(a, b)})) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]


def test_top_rows_are_exactly_where_the_planted_latent_fires_most():
    x = _planted()
    d = identity_dictionary(4)
    table = latent_samples(d, _rows(x), n_top=8, n_bins=4, per_bin=3, chunk=64)
    top = table[(table.latent == 0) & (table.kind == "top")]
    expected = torch.argsort(x[:, 0], descending=True)[:8].numpy()
    assert top["row"].tolist() == expected.tolist()
    assert top["tag"].tolist() == expected.tolist()  # the caller's metadata follows each row
    assert top["rank"].tolist() == list(range(8))
    np.testing.assert_allclose(top["value"], x[expected, 0].numpy(), rtol=1e-6)
    fires = (x[:, 0] > 0).numpy()
    assert top["frequency"].iloc[0] == pytest.approx(fires.mean())
    assert top["max_value"].iloc[0] == pytest.approx(float(x[:, 0].max()))


def test_quantile_samples_lie_in_their_interval_and_only_where_the_latent_fires():
    x = _planted()
    d = identity_dictionary(4)
    table = latent_samples(d, _rows(x), n_top=2, n_bins=4, per_bin=3, seed=1)
    q = table[(table.latent == 0) & (table.kind == "quantile")]
    vmax = float(x[:, 0].max())
    fires = set(np.flatnonzero((x[:, 0] > 0).numpy()))
    assert set(q["row"]) <= fires and q["row"].is_unique
    assert (q.groupby("bin").size() <= 3).all() and set(q["bin"]) <= {0, 1, 2, 3}
    v = x[torch.as_tensor(q["row"].to_numpy().copy()), 0].numpy()
    assert ((v >= q["bin_low"] * vmax - 1e-6) & (v <= q["bin_high"] * vmax + 1e-6)).all()
    # every bin holding at least 3 firing rows gives 3 samples
    counts = np.bincount(np.minimum((x[list(fires), 0].numpy() / vmax * 4).astype(int), 3), minlength=4)
    assert q.groupby("bin").size().reindex(range(4), fill_value=0).tolist() == np.minimum(counts, 3).tolist()
    # the negative half of the identity (latent 4 = relu(-x0)) never fires where latent 0 does
    assert not set(table[table.latent == 4]["row"]) & fires


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_mlm_contexts")
    save_tiny_bert(folder, transformers.BertForMaskedLM)
    return folder


def test_sae_train_writes_each_latents_top_contexts(tiny, tmp_path):
    out = tmp_path / "sae"
    rc = main(["sae", "train", "--model", str(tiny), "--site", SITE, "--k", "4", "--width", "2x", "--tokens", "1k",
               "--out", str(out), "--train-batch", "128", "--buffer", "512", "--max-sentences", "40", "--quiet",
               "--no-controls"])
    assert rc == 0
    table = pd.read_parquet(out / SITE / "latent_contexts.parquet")
    assert {"latent", "kind", "value", "sentence_index", "position", "token", "context"} <= set(table.columns)
    assert table["context"].str.contains(r"\[\[").all()
    assert not table["token"].isin(["[CLS]", "[SEP]"]).any()  # special tokens are left out, as in training
    # known answer: recompute every latent on the same sentences; the top row is each latent's largest value
    model = bertscope.load(tiny)
    d = load_dictionary(out / SITE)
    sentences = list(load_corpus("builtin", max_sentences=40))
    best = {}
    for acts in CorpusActivations(model, sentences, [SITE]).stage_batches():
        meta = acts.rows()
        real = torch.from_numpy((meta["token_class"] == "real").to_numpy().copy())
        f = d.encode(acts.flat(SITE)[real]).detach()
        m = meta[real.numpy()].reset_index(drop=True)
        for lat in range(f.shape[1]):
            i = int(f[:, lat].argmax())
            v = float(f[i, lat])
            if v > 0 and v > best.get(lat, (0,))[0]:
                best[lat] = (v, int(m.sentence_index[i]), int(m.position[i]))
    top = table[(table.kind == "top") & (table["rank"] == 0)].set_index("latent")
    assert set(top.index) == set(best)
    for lat, (v, s, p) in best.items():
        assert top.loc[lat, "value"] == pytest.approx(v, rel=1e-4)
        assert (int(top.loc[lat, "sentence_index"]), int(top.loc[lat, "position"])) == (s, p)
