"""TransformerLens-style names on bertscope encoders (models/lens.py), with TransformerLens' conventions pinned:
stacked W_Q/W_K/W_V [layer, head, d_model, d_head] reproduce the cached q/k/v from the attention input, z @ W_O
the per-head results, W_in/W_out the MLP; QK = W_Q W_K^T and OV = W_V W_O as factored matrices match the dense
products; add_hook/reset_hooks use the one hook mechanism; token helpers follow TransformerLens' semantics."""

from __future__ import annotations

import pytest
import torch
import transformers
from bertscope.models.lens import FactoredMatrix
from einops import einsum

from bertscope import models
from tests.family_fixtures import tiny_config
from tests.fixtures_deberta_modernbert import DEBERTA_V3_TINY, MODERNBERT_TINY
from tests.helpers import assert_close_across_kernels

TEXT = "The cat sat on the mat because the cat was tired."


def _perturbed(config: models.EncoderConfig, seed: int = 0) -> models.Encoder:
    """A random encoder whose biases and LayerNorms are not the trivial zeros/ones of BERT's initialisation."""
    model = models.random_encoder(config, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return model


def _family_models() -> dict[str, models.Encoder]:
    cfg = models.EncoderConfig
    return {
        "bert-pre-ln": _perturbed(cfg(vocab_size=50, d_model=32, n_layers=2, n_heads=4, d_mlp=48, max_positions=16,
                                      norm_placement="pre", hidden_dropout=0.0, attention_dropout=0.0)),
        "raw-attention": _perturbed(cfg(vocab_size=50, d_model=32, n_layers=2, n_heads=4, d_mlp=48, max_positions=16,
                                        attention_projections=False, hidden_dropout=0.0, attention_dropout=0.0)),
        "albert": _perturbed(cfg.from_hf(tiny_config("albert"))),
        "deberta-v3": _perturbed(cfg.from_hf(transformers.DebertaV2Config(**DEBERTA_V3_TINY, vocab_size=50))),
        "modernbert": _perturbed(cfg.from_hf(transformers.ModernBertConfig(**MODERNBERT_TINY, vocab_size=50))),
    }


@pytest.fixture(scope="module")
def family_models() -> dict[str, models.Encoder]:
    return _family_models()


def _attn_input(model: models.Encoder, cache, layer: int) -> torch.Tensor:
    """The attention sublayer's input: resid_pre (post-LN) or ln1(resid_pre) (pre-LN)."""
    x = cache[f"blocks.{layer}.hook_resid_pre"]
    return x if model.config.norm_placement == "post" else model.blocks[layer].ln1(x)


def _check_weights_reproduce_cache(model: models.Encoder, inputs) -> None:
    W_Q, W_K, W_V, W_O = model.W_Q, model.W_K, model.W_V, model.W_O
    b_Q, b_K, b_V, b_O = model.b_Q, model.b_K, model.b_V, model.b_O
    cfg = model.cfg
    L, H, M, D = cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.d_head
    for w in (W_Q, W_K, W_V):
        assert w.shape == (L, H, M, D)
    assert W_O.shape == (L, H, D, M) and b_O.shape == (L, M)
    assert b_Q.shape == b_K.shape == b_V.shape == (L, H, D)
    assert model.W_in.shape == (L, M, cfg.d_mlp) and model.W_out.shape == (L, cfg.d_mlp, M)
    assert model.b_in.shape == (L, cfg.d_mlp) and model.b_out.shape == (L, M)
    with torch.no_grad():
        _, cache = model.run_with_cache(inputs)
        for layer in range(L):
            x = _attn_input(model, cache, layer)
            for name, W, b in (("q", W_Q, b_Q), ("k", W_K, b_K), ("v", W_V, b_V)):
                got = einsum(x, W[layer], "b p m, h m d -> b p h d") + b[layer]
                assert_close_across_kernels(got, cache[f"blocks.{layer}.attn.hook_{name}"], msg=f"{name} L{layer}")
            z = cache[f"blocks.{layer}.attn.hook_z"]
            result = einsum(z, W_O[layer], "b p h d, h d m -> b p h m")
            assert_close_across_kernels(result, cache[f"blocks.{layer}.attn.hook_result"], msg=f"result L{layer}")
            attn_out = model.blocks[layer].attn(x, model.context(cache[f"blocks.{layer}.hook_resid_pre"], None))
            assert_close_across_kernels(result.sum(2) + b_O[layer], attn_out, msg=f"attn_out L{layer}")
            mid = cache[f"blocks.{layer}.hook_resid_mid"]
            mlp_in = mid if model.config.norm_placement == "post" else model.blocks[layer].ln2(mid)
            pre = mlp_in @ model.W_in[layer] + model.b_in[layer]
            assert_close_across_kernels(pre, cache[f"blocks.{layer}.mlp.hook_pre"], msg=f"mlp pre L{layer}")
            if cfg.gated_mlp:
                gate = mlp_in @ model.W_gate[layer] + model.b_gate[layer]
                assert_close_across_kernels(gate, cache[f"blocks.{layer}.mlp.hook_gate"], msg=f"gate L{layer}")
            out = cache[f"blocks.{layer}.mlp.hook_post"] @ model.W_out[layer] + model.b_out[layer]
            assert_close_across_kernels(out, cache[f"blocks.{layer}.hook_mlp_out"], msg=f"mlp out L{layer}")


def test_stacked_weights_reproduce_cached_activations_bundled(bundled):
    """Known answer on the real model: x @ W_Q[l] + b_Q[l] is the cached hook_q (k, v too), z @ W_O[l] the cached
    per-head results, their sum + b_O the attention output, x @ W_in + b_in the MLP's hook_pre, ... ."""
    _check_weights_reproduce_cache(bundled, TEXT)


@pytest.mark.parametrize("family", ["bert-pre-ln", "raw-attention", "albert", "deberta-v3", "modernbert"])
def test_stacked_weights_every_family(family_models, family):
    model = family_models[family]
    ids = torch.randint(5, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    _check_weights_reproduce_cache(model, ids)


def test_family_specifics(family_models):
    albert = family_models["albert"]
    assert torch.equal(albert.W_Q[0], albert.W_Q[2])  # one shared layer: every layer reads the same matrix
    modern = family_models["modernbert"]
    assert not bool(modern.b_Q.any()) and not bool(modern.b_O.any())  # no attention biases: zeros, right shape
    assert modern.cfg.positional_embedding_type == "rotary" and modern.cfg.gated_mlp
    assert family_models["deberta-v3"].cfg.positional_embedding_type in ("relative", "standard+relative")
    with pytest.raises(ValueError, match="gated MLPs"):
        _ = family_models["albert"].W_gate
    raw = family_models["raw-attention"]
    assert torch.equal(torch.cat(list(raw.W_Q[0]), dim=1), torch.eye(32))  # head h reads its slice of d_model


def test_cfg_is_a_live_view_of_the_config(bundled, family_models):
    cfg, config = bundled.cfg, bundled.config
    assert (cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.d_head, cfg.d_mlp) == (6, 12, 384, 32, 1536)
    assert cfg.d_vocab == config.vocab_size and cfg.n_ctx == config.max_length and cfg.act_fn == "gelu"
    assert cfg.normalization_type == "LN" and cfg.normalization_placement == "post"
    assert cfg.layer_norm_eps == config.layer_norm_eps  # every EncoderConfig field under its own name
    assert cfg.device == bundled.device and cfg.dtype == torch.float32
    assert "/" not in cfg.model_name and cfg.model_name  # a name, never the local path
    assert family_models["bert-pre-ln"].cfg.normalization_placement == "pre"
    assert set(cfg.to_dict()) >= {"n_layers", "d_head", "n_ctx", "d_vocab", "act_fn", "device", "dtype"}
    with pytest.raises(AttributeError, match="read-only"):
        cfg.n_layers = 3
    with pytest.raises(AttributeError, match="no 'n_kv'"):
        _ = cfg.n_kv


def _trace_powers(m: torch.Tensor, k: int) -> torch.Tensor:
    return torch.linalg.matrix_power(m.double(), k).diagonal(dim1=-2, dim2=-1).sum(-1)


def test_factored_qk_ov_match_dense_products(bundled):
    QK, OV = bundled.QK, bundled.OV
    assert QK.shape == OV.shape == (6, 12, 384, 384) and QK.mdim == 32
    dense_qk = bundled.W_Q[2] @ bundled.W_K[2].transpose(-2, -1)  # one layer: [head, d_model, d_model]
    dense_ov = bundled.W_V[2] @ bundled.W_O[2]
    torch.testing.assert_close(QK[2].AB, dense_qk)
    torch.testing.assert_close(OV[2].AB, dense_ov)
    # one head, indexed like TransformerLens: QK[layer, head]
    qk = QK[2, 8]
    torch.testing.assert_close(qk.AB, dense_qk[8])
    dense = dense_ov[8].double()
    ov = FactoredMatrix(bundled.W_V[2, 8].double(), bundled.W_O[2, 8].double())
    U, S, Vh = ov.svd()  # TransformerLens: AB == U diag(S) Vh^T, singular values descending
    torch.testing.assert_close(U @ torch.diag(S) @ Vh.T, dense)
    torch.testing.assert_close(S, torch.linalg.svdvals(dense)[:32])
    torch.testing.assert_close(ov.norm(), torch.linalg.matrix_norm(dense))
    # eigenvalues of BA are AB's non-zero ones: same power sums tr((AB)^k) = sum(lambda^k)
    lam = ov.eigenvalues
    assert lam.shape == (32,)
    for k in (1, 2, 3):
        torch.testing.assert_close(lam.pow(k).sum().real, _trace_powers(dense, k), rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(ov.T.AB, dense.T)


def test_factored_matrix_products():
    g = torch.Generator().manual_seed(0)
    A, B = torch.randn(3, 6, 2, generator=g, dtype=torch.float64), torch.randn(3, 2, 5, generator=g,
                                                                              dtype=torch.float64)
    f, dense = FactoredMatrix(A, B), A @ B
    v, w = torch.randn(5, generator=g, dtype=torch.float64), torch.randn(6, generator=g, dtype=torch.float64)
    torch.testing.assert_close(f @ v, dense @ v)
    torch.testing.assert_close(w @ f, w @ dense)
    C = torch.randn(5, 4, generator=g, dtype=torch.float64)
    assert isinstance(f @ C, FactoredMatrix)
    torch.testing.assert_close((f @ C).AB, dense @ C)
    torch.testing.assert_close(f.T @ w, dense.transpose(-2, -1) @ w)
    D = torch.randn(4, 6, generator=g, dtype=torch.float64)
    torch.testing.assert_close((D @ f).AB, D @ dense)
    g2 = FactoredMatrix(torch.randn(5, 3, generator=g, dtype=torch.float64),
                        torch.randn(3, 7, generator=g, dtype=torch.float64))
    torch.testing.assert_close((f @ g2).AB, dense @ g2.AB)
    with pytest.raises(ValueError, match="square"):
        _ = f.BA
    with pytest.raises(ValueError, match="inner dimensions"):
        FactoredMatrix(A, A)


def test_add_hook_and_reset_hooks(bundled):
    with torch.no_grad():
        clean = bundled(TEXT)

        def zero_head(z, hook):
            z = z.clone()
            z[:, :, 5] = 0
            return z

        bundled.add_hook("blocks.3.attn.hook_z", zero_head)
        ablated = bundled(TEXT)
        assert not torch.allclose(ablated, clean)
        bundled.reset_hooks()
        torch.testing.assert_close(bundled(TEXT), clean, rtol=0, atol=0)

        seen = []
        bundled.add_hook(lambda name: name.endswith("attn.hook_pattern"), lambda t, hook: seen.append(hook.name))
        bundled.add_hook("blocks.*.hook_resid_post", lambda t, hook: seen.append(hook.name), is_permanent=True)
        bundled(TEXT)
        assert len(seen) == 12
        bundled.reset_hooks()
        seen.clear()
        bundled(TEXT)
        assert len(seen) == 6 and all(n.endswith("hook_resid_post") for n in seen)  # the permanent ones stay
        bundled.reset_hooks(including_permanent=True)
        seen.clear()
        bundled(TEXT)
        assert seen == [] and not any(h.is_hooked for h in bundled.hook_dict.values())
    with pytest.raises(NotImplementedError, match="incl_bwd"):
        bundled.add_hook("blocks.0.hook_resid_pre", lambda t, hook: None, dir="bwd")
    with pytest.raises(KeyError):
        bundled.add_hook("blocks.0.hook_nope", lambda t, hook: None)


def test_token_helpers(bundled):
    cat = bundled.to_single_token("cat")
    assert bundled.tokenizer.convert_ids_to_tokens(cat) == "cat"
    assert bundled.to_single_token("##s") == bundled.tokenizer.convert_tokens_to_ids("##s")
    with pytest.raises(ValueError, match="not a single token.*pieces"):
        bundled.to_single_token("unbelievableness")
    ids = bundled.to_tokens(TEXT)["input_ids"]
    # as TransformerLens: decode(ids, clean_up_tokenization_spaces=False), special tokens kept
    expected = bundled.tokenizer.decode(ids[0].tolist(), clean_up_tokenization_spaces=False)
    assert bundled.to_string(ids[0]) == expected == "[CLS] the cat sat on the mat because the cat was tired. [SEP]"
    assert bundled.to_string(ids) == [bundled.to_string(ids[0])]
    assert bundled.to_string(cat) == "cat"
    pieces = bundled.to_str_tokens(TEXT)
    assert bundled.get_token_position("cat", TEXT) == pieces.index("cat") == 2
    assert bundled.get_token_position("cat", TEXT, mode="last") == 9
    assert bundled.get_token_position(cat, ids) == 2 and bundled.get_token_position(cat, ids[0], mode="last") == 9
    with pytest.raises(ValueError, match="does not occur"):
        bundled.get_token_position("dog", TEXT)
    with pytest.raises(ValueError, match="not a single token"):
        bundled.get_token_position("unbelievableness", TEXT)
    with pytest.raises(ValueError, match="'first' or 'last'"):
        bundled.get_token_position("cat", TEXT, mode="middle")
