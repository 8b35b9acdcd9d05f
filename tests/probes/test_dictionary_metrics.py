"""Dictionary metrics (known answers and SAELens 6.18's evals.py formulas, transcribed here, nothing installed)
and SAELens's on-disk format (round trip, files written as SAELens writes them, bad folders)."""

from __future__ import annotations

import json

import pytest
import torch
from bertscope.probes.dictionary import (
    Dictionary,
    DictionaryConfig,
    DictionaryFormatError,
    latent_statistics,
    load_dictionary,
    metrics_table,
    reconstruction_metrics,
    saelens_metrics,
    save_dictionary,
)
from safetensors.torch import save_file


def _saelens_reference(x, x_hat, f, n_batches=1):
    """SAELens 6.18 ``get_sparsity_and_variance_metrics``'s arithmetic (sae_lens/evals.py, lines 504-588),
    transcribed loop and all, on ``n_batches`` equal slices of already-masked rows."""
    metric = {k: [] for k in ("l2_norm_in", "l2_norm_out", "l2_ratio", "relative_reconstruction_bias", "l0", "l1",
                              "explained_variance_legacy", "mse", "cossim")}
    mean_sum_of_squares, mean_act_per_dimension, mean_sum_of_resid_squared = [], [], []
    for xi, xh, fi in zip(x.chunk(n_batches), x_hat.chunk(n_batches), f.chunk(n_batches), strict=False):
        flattened_mask_sum = xi.shape[0]
        l2_norm_in = torch.norm(xi, dim=-1)
        l2_norm_out = torch.norm(xh, dim=-1)
        l2_norm_in_for_div = l2_norm_in.clone()
        l2_norm_in_for_div[torch.abs(l2_norm_in_for_div) < 0.0001] = 1
        metric["l2_norm_in"].append(l2_norm_in)
        metric["l2_norm_out"].append(l2_norm_out)
        metric["l2_ratio"].append(l2_norm_out / l2_norm_in_for_div)
        x_hat_norm_squared = torch.norm(xh, dim=-1) ** 2
        x_dot_x_hat = (xi * xh).sum(dim=-1)
        metric["relative_reconstruction_bias"].append((x_hat_norm_squared.mean() / x_dot_x_hat.mean()).unsqueeze(0))
        metric["l0"].append((fi > 0).sum(dim=-1).float())
        metric["l1"].append(fi.sum(dim=-1))
        resid_sum_of_squares = (xi - xh).pow(2).sum(dim=-1)
        metric["mse"].append(resid_sum_of_squares / flattened_mask_sum)
        batched_variance_sum = (xi - xi.mean(dim=0)).pow(2).sum(dim=-1)
        metric["explained_variance_legacy"].append(1 - resid_sum_of_squares / batched_variance_sum)
        mean_sum_of_squares.append(xi.pow(2).sum(dim=-1).mean(dim=0))
        mean_act_per_dimension.append(xi.pow(2).mean(dim=0))
        mean_sum_of_resid_squared.append(resid_sum_of_squares.mean(dim=0))
        x_normed = xi / torch.norm(xi, dim=-1, keepdim=True)
        x_hat_normed = xh / torch.norm(xh, dim=-1, keepdim=True)
        metric["cossim"].append((x_normed * x_hat_normed).sum(dim=-1))
    out = {k: torch.cat(v).mean().item() for k, v in metric.items()}
    mss = torch.stack(mean_sum_of_squares).mean(dim=0)
    mapd = torch.cat(mean_act_per_dimension).mean(dim=0)
    out["explained_variance"] = (1 - torch.stack(mean_sum_of_resid_squared).mean(dim=0) / (mss - mapd**2)).item()
    return out


def _data(seed=0, n=200, d=6, m=10):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g) * 2 + 1
    x_hat = x * 0.8 + torch.randn(n, d, generator=g) * 0.3
    f = torch.relu(torch.randn(n, m, generator=g))
    return x, x_hat, f


def test_saelens_metrics_equal_saelens_evals_formulas():
    x, x_hat, f = _data()
    ours, ref = saelens_metrics(x, x_hat, f), _saelens_reference(x, x_hat, f)
    assert set(ours) == set(ref)
    for key in ref:
        assert ours[key] == pytest.approx(ref[key], rel=1e-6, abs=1e-6), key


def test_reconstruction_metrics_known_answers():
    x = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 2.0], [2.0, 0.0]])
    half = reconstruction_metrics(x, 0.5 * x, torch.tensor([[1.0, 0.0], [0.0, 0.0], [2.0, 3.0], [0.5, 0.0]]))
    assert half["relative_reconstruction_bias"] == pytest.approx(0.5)  # ||x/2||^2 / <x, x/2>
    assert half["cosine"] == pytest.approx(1.0)
    assert half["l2_ratio"] == pytest.approx(0.5)
    assert half["l0"] == pytest.approx((1 + 0 + 2 + 1) / 4)
    assert half["l1"] == pytest.approx((1 + 0 + 5 + 0.5) / 4)
    sq = 0.25 * (x**2).sum()  # sum ||x - x/2||^2
    total = ((x - x.mean(0)) ** 2).sum()
    assert half["mse"] == pytest.approx(float(sq / 8))
    assert half["explained_variance"] == pytest.approx(float(1 - sq / total))
    perfect = reconstruction_metrics(x, x.clone(), torch.ones(4, 3))
    assert perfect["explained_variance"] == 1.0 and perfect["mse"] == 0.0
    assert reconstruction_metrics(x, x.mean(0).expand_as(x), torch.zeros(4, 3))["explained_variance"] == \
        pytest.approx(0.0, abs=1e-12)  # predicting the mean explains nothing


def test_bertscope_explained_variance_is_the_correct_form_of_saelens():
    # SAELens's explained_variance subtracts the square of the mean second moment per dimension, not the squared
    # means: the two agree only by accident. Ours is 1 - residual variance / total variance.
    x, x_hat, f = _data(seed=1)
    ours = reconstruction_metrics(x, x_hat, f)["explained_variance"]
    var = ((x.double() - x.double().mean(0)) ** 2).sum(-1).mean()
    assert ours == pytest.approx(float(1 - ((x - x_hat).double() ** 2).sum(-1).mean() / var))
    assert abs(ours - saelens_metrics(x, x_hat, f)["explained_variance"]) > 1e-3


def test_latent_statistics_and_per_class_table():
    f = torch.tensor([[1.0, 0.0, 0.0, 2.0], [1.0, 0.0, 0.0, 0.0], [1.0, 0.5, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    stats = latent_statistics(f, dense_threshold=0.5)
    assert stats["density"].tolist() == [1.0, 0.25, 0.0, 0.25]
    assert stats["dead_fraction"] == 0.25 and stats["dense_fraction"] == 0.25
    x = torch.randn(4, 3)
    table = metrics_table(x, x * 0.9, f, ["word", "word", "punct", "word"])
    assert set(table["token_class"]) == {"all", "word", "punct"}
    n = table[table.metric == "n_tokens"].set_index("token_class")["value"]
    assert n.to_dict() == {"all": 4.0, "punct": 1.0, "word": 3.0}
    l0 = table[table.metric == "l0"].set_index("token_class")["value"]
    assert l0["punct"] == 2.0 and l0["word"] == pytest.approx(4 / 3)


# ------------------------------------------------------------------ SAELens's on-disk format
CASES = [("sae", "relu", None), ("sae", "topk", 3), ("sae", "batchtopk", 3), ("sae", "jumprelu", None),
         ("transcoder", "relu", None), ("transcoder", "jumprelu", None), ("skip_transcoder", "relu", None)]


def _random(kind, arch, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    cfg = DictionaryConfig(d_in=6, d_sae=10, arch=arch, k=k, kind=kind, d_out=None if kind == "sae" else 4,
                           site="blocks.1.hook_resid_mid", site_out=None if kind == "sae" else "blocks.1.hook_mlp_out",
                           metadata={"model": "tiny", "tokens_trained": 123})
    d = Dictionary(cfg)
    with torch.no_grad():
        for p in d.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        if d.batch_threshold is not None:
            d.batch_threshold.fill_(0.3)
    return d.eval()


@pytest.mark.parametrize("kind,arch,k", CASES)
def test_saelens_format_round_trip(tmp_path, kind, arch, k):
    d = _random(kind, arch, k)
    save_dictionary(d, tmp_path)
    cfg = json.loads((tmp_path / "cfg.json").read_text())
    expected_arch = {("sae", "relu"): "standard", ("sae", "topk"): "topk", ("sae", "batchtopk"): "jumprelu",
                     ("sae", "jumprelu"): "jumprelu", ("transcoder", "relu"): "transcoder",
                     ("transcoder", "jumprelu"): "jumprelu_transcoder",
                     ("skip_transcoder", "relu"): "skip_transcoder"}[(kind, arch)]
    assert cfg["architecture"] == expected_arch
    assert cfg["apply_b_dec_to_input"] is (kind == "sae") and cfg["normalize_activations"] == "none"
    assert cfg["metadata"]["hook_name"] == "blocks.1.hook_resid_mid"
    back = load_dictionary(tmp_path)
    assert back.config == d.config
    x = torch.randn(20, 6, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(back.encode(x), d.encode(x), atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(back(x), d(x), atol=1e-6, rtol=1e-6)


def _saelens_encode_decode(cfg, w, x):
    """SAELens 6.18 inference SAEs' encode/decode (standard, topk with rescale, jumprelu), from its source."""
    sae_in = x - w["b_dec"] * cfg["apply_b_dec_to_input"]
    hidden_pre = sae_in @ w["W_enc"] + w["b_enc"]
    if cfg["architecture"] == "topk":
        if cfg["rescale_acts_by_decoder_norm"]:
            hidden_pre = hidden_pre * w["W_dec"].norm(dim=-1)
        vals, idx = torch.topk(hidden_pre, cfg["k"], dim=-1, sorted=False)
        acts = torch.zeros_like(hidden_pre).scatter_(-1, idx, vals.relu())
        dec_in = acts / w["W_dec"].norm(dim=-1) if cfg["rescale_acts_by_decoder_norm"] else acts
    elif cfg["architecture"] == "jumprelu":
        acts = hidden_pre.relu() * (hidden_pre > w["threshold"]).to(hidden_pre.dtype)
        dec_in = acts
    else:
        acts = hidden_pre.relu()
        dec_in = acts
    return acts, dec_in @ w["W_dec"] + w["b_dec"]


@pytest.mark.parametrize("arch,b_dec_in,rescale", [("standard", False, False), ("topk", True, True),
                                                   ("topk", False, True), ("jumprelu", True, False)])
def test_reads_folders_written_the_way_saelens_writes_them(tmp_path, arch, b_dec_in, rescale):
    g = torch.Generator().manual_seed(2)
    w = {"W_enc": torch.randn(6, 12, generator=g), "b_enc": torch.randn(12, generator=g) * 0.1,
         "W_dec": torch.randn(12, 6, generator=g), "b_dec": torch.randn(6, generator=g)}
    if arch == "jumprelu":
        w["threshold"] = torch.rand(12, generator=g)
    cfg = {"d_in": 6, "d_sae": 12, "dtype": "float32", "device": "cpu", "apply_b_dec_to_input": b_dec_in,
           "normalize_activations": "none", "reshape_activations": "none", "architecture": arch,
           "metadata": {"hook_name": "blocks.0.hook_resid_post", "model_name": "gpt2"}}
    if arch == "topk":
        cfg.update(k=4, rescale_acts_by_decoder_norm=rescale)
    save_file(w, str(tmp_path / "sae_weights.safetensors"))
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    d = load_dictionary(tmp_path)
    assert d.config.site == "blocks.0.hook_resid_post"
    x = torch.randn(30, 6, generator=g) * 3
    acts, out = _saelens_encode_decode(cfg, w, x)
    with torch.no_grad():
        torch.testing.assert_close(d(x), out, atol=1e-4, rtol=1e-5)
        assert torch.equal(d.encode(x) > 0, acts > 0)


def test_not_a_dictionary_is_a_clear_error(tmp_path):
    with pytest.raises(DictionaryFormatError, match="is not a dictionary"):
        load_dictionary(tmp_path)
    (tmp_path / "cfg.json").write_text("{not json")
    (tmp_path / "sae_weights.safetensors").write_bytes(b"junk")
    with pytest.raises(DictionaryFormatError, match="not a readable dictionary"):
        load_dictionary(tmp_path)
    save_file({"W_enc": torch.zeros(2, 2)}, str(tmp_path / "sae_weights.safetensors"))
    (tmp_path / "cfg.json").write_text(json.dumps({"architecture": "gated", "d_in": 2, "d_sae": 2}))
    with pytest.raises(DictionaryFormatError, match="gated"):
        load_dictionary(tmp_path)
