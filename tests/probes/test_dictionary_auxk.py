"""The two AuxK conventions (issue 40 item 14), each pinned against a line-by-line transcription of its source:
SAELens's ``calculate_topk_aux_loss`` (the default) and Gao et al.'s code (openai/sparse_autoencoder ``train.py``:
``auxk_mask_fn``, ``sharded_topk``, ReLU, ``decode_sparse``, ``normalized_mse``, ``nan_to_num``)."""

from __future__ import annotations

import pytest
import torch
from bertscope.probes.dictionary import Dictionary, DictionaryConfig, TrainSettings, train_dictionaries
from bertscope.probes.dictionary.architectures.kernels import auxk_gao, auxk_loss


def _saelens_reference(sae_in, sae_out, hidden_pre, dead, W_dec, b_dec):
    """SAELens TopKTrainingSAE.calculate_topk_aux_loss (with _calculate_topk_aux_acts), transcribed."""
    num_dead = int(dead.sum())
    residual = (sae_in - sae_out).detach()
    k_aux = sae_in.shape[-1] // 2
    scale = min(num_dead / k_aux, 1.0)
    k_aux = min(k_aux, num_dead)
    auxk_latents = torch.where(dead[None], hidden_pre, -torch.inf)
    top = auxk_latents.topk(k_aux, sorted=False)
    auxk_acts = torch.zeros_like(hidden_pre).scatter(-1, top.indices, top.values)
    recons = auxk_acts @ W_dec + b_dec
    return scale * (recons - residual).pow(2).sum(dim=-1).mean()


def _gao_reference(x, recons, latents_pre_act, dead, W_dec, pre_bias, auxk):
    """openai/sparse_autoencoder train.py's AuxK term (without auxk_coef), transcribed."""
    masked = latents_pre_act * dead  # auxk_mask_fn: x.data *= dead_mask
    top = torch.topk(masked, k=auxk, dim=-1)
    auxk_vals = torch.relu(top.values)
    aux_recons = torch.zeros_like(masked).scatter(-1, top.indices, auxk_vals) @ W_dec + pre_bias  # decode_sparse
    xs = x - recons.detach() + pre_bias.detach()
    mse = ((aux_recons - xs) ** 2).mean(dim=1).mean()
    unit = ((xs.mean(dim=0)[None, :].broadcast_to(xs.shape) - xs) ** 2).mean(dim=1).mean()  # normalized_mse
    return (mse / unit).nan_to_num(0)


def _case(n_dead: int, d_in: int = 16, d_sae: int = 64, rows: int = 50, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    d = Dictionary(DictionaryConfig(d_in=d_in, d_sae=d_sae, arch="topk", k=4))
    d.init_weights(g)
    with torch.no_grad():
        d.b_dec.copy_(torch.randn(d_in, generator=g))
    h = torch.randn(rows, d_sae, generator=g).requires_grad_()
    y, y_hat = torch.randn(rows, d_in, generator=g), torch.randn(rows, d_in, generator=g)
    dead = torch.zeros(d_sae, dtype=torch.bool)
    dead[torch.randperm(d_sae, generator=g)[:n_dead]] = True
    return d, h, y, y_hat, dead


def _grads(loss, d, h):
    return torch.autograd.grad(loss, [d.W_dec, d.b_dec, h])


@pytest.mark.parametrize("n_dead", [3, 8, 40])  # fewer dead latents than d_in // 2, as many, more
def test_saelens_convention_is_saelens_code(n_dead):
    d, h, y, y_hat, dead = _case(n_dead)
    ours = auxk_loss(d, h, y, y_hat, dead)
    ref = _saelens_reference(y, y_hat, h, dead, d.W_dec, d.b_dec)
    torch.testing.assert_close(ours, ref)
    for a, b in zip(_grads(ours, d, h), _grads(ref, d, h), strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize(("n_dead", "aux_k"), [(3, 8), (20, 8), (40, 40)])  # fewer dead than aux_k, more, equal
def test_gao_convention_is_openai_code(n_dead, aux_k):
    d, h, y, y_hat, dead = _case(n_dead)
    ours = auxk_gao(d, h, y, y_hat, dead, aux_k)
    ref = _gao_reference(y, y_hat, h, dead.to(h.dtype), d.W_dec, d.b_dec, aux_k)
    torch.testing.assert_close(ours, ref)
    for a, b in zip(_grads(ours, d, h), _grads(ref, d, h), strict=True):
        torch.testing.assert_close(a, b)


def test_the_conventions_differ_and_none_dead_is_zero():
    d, h, y, y_hat, dead = _case(20)
    assert not torch.isclose(auxk_gao(d, h, y, y_hat, dead, 8), auxk_loss(d, h, y, y_hat, dead))
    none = torch.zeros_like(dead)
    assert float(auxk_gao(d, h, y, y_hat, none)) == 0.0 and float(auxk_loss(d, h, y, y_hat, none)) == 0.0


def test_training_with_gao_auxk_uses_it():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 8, generator=g)
    cfg = DictionaryConfig(d_in=8, d_sae=64, arch="topk", k=2, site="s")
    base = dict(tokens=4096, batch_size=256, buffer_rows=8192, progress=False, dead_tokens=256)
    a = train_dictionaries([x], cfg, TrainSettings(**base))["s"]
    b = train_dictionaries([x], cfg, TrainSettings(**base, auxk="gao", aux_k=16))["s"]
    assert not torch.allclose(a.W_enc, b.W_enc)
    with pytest.raises(ValueError, match="auxk must be"):
        TrainSettings(auxk="openai")


def test_sae_train_takes_the_gao_convention_and_refuses_a_bad_coefficient(tmp_path, capsys):
    import transformers
    from bertscope.experiments.cli import main
    from bertscope.probes.dictionary import load_dictionary
    from helpers import save_tiny_bert

    save_tiny_bert(tmp_path / "m", transformers.BertForMaskedLM)
    site = "blocks.0.hook_resid_post"
    common = ["sae", "train", "--model", str(tmp_path / "m"), "--site", site, "--k", "4", "--width", "2x",
              "--tokens", "1k", "--train-batch", "128", "--buffer", "512", "--max-sentences", "40", "--quiet",
              "--no-controls"]
    assert main([*common, "--out", str(tmp_path / "bad"), "--aux-coefficient", "-1"]) == 2
    assert not (tmp_path / "bad").exists()
    assert "--aux-coefficient" in capsys.readouterr().err
    assert main([*common, "--out", str(tmp_path / "sae"), "--auxk", "gao", "--aux-coefficient", "0.03125"]) == 0
    meta = load_dictionary(tmp_path / "sae" / site).config.metadata
    assert "gao" in str(meta) and "0.03125" in str(meta)
