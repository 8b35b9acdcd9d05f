"""Sparse dictionaries: every architecture recovers a planted sparse code; training conventions (SAELens's)
pinned; streaming memory, determinism, resume, several sites in one pass, special-token exclusion."""

from __future__ import annotations

import math

import pytest
import torch
from bertscope.probes.dictionary import (
    ActivationBatch,
    Dictionary,
    DictionaryConfig,
    TrainingInterrupted,
    TrainSettings,
    auxk_loss,
    batch_topk_activation,
    dictionary_loss,
    geometric_median,
    norm_scaling_factor,
    topk_activation,
    train_dictionaries,
)
from bertscope.probes.dictionary.models import JumpReLUFunction, StepFunction


def planted_code(n: int, d: int = 32, m: int = 24, active: int = 3, seed: int = 0, d_out: int | None = None):
    """Rows that are sparse non-negative combinations (``active`` of ``m``, weights in [0.5, 1.5]) of known unit
    directions ``D [m, d]`` (and, for transcoders, the same code through ``D_out [m, d_out]``)."""
    g = torch.Generator().manual_seed(seed)
    D = torch.nn.functional.normalize(torch.randn(m, d, generator=g), dim=-1)
    idx = torch.stack([torch.randperm(m, generator=g)[:active] for _ in range(n)])
    c = torch.zeros(n, m).scatter_(1, idx, torch.rand(n, active, generator=g) + 0.5)
    if d_out is None:
        return D, c @ D
    D_out = torch.nn.functional.normalize(torch.randn(m, d_out, generator=g), dim=-1)
    return D, D_out, c @ D, c @ D_out


def _chunks(x: torch.Tensor, size: int = 1000) -> list[torch.Tensor]:
    return [x[i : i + size] for i in range(0, len(x), size)]


def _match(truth: torch.Tensor, W_dec: torch.Tensor) -> torch.Tensor:
    """For each true direction, the best cosine with a learned decoder row."""
    return (truth @ torch.nn.functional.normalize(W_dec, dim=-1).T).max(1).values


FAST = dict(batch_size=256, buffer_rows=4096, lr=3e-3, progress=False, dead_tokens=20_000)
ARCH_SETTINGS = {
    "topk": dict(k=3, settings={}),
    "batchtopk": dict(k=3, settings={}),
    "relu": dict(k=None, settings={"l1_coefficient": 0.3, "l1_warm_up_tokens": 5_000}),
    # SAELens's straight-through estimator (pinned below); the bandwidth is set to the scale of this toy's
    # pre-activations (~1-3 in the normalised space): SAELens's 0.001 default is for its own inputs and leaves
    # the threshold gradient almost always zero here. No dead-latent resampling, as SAELens trains JumpReLU: the
    # planted code needs 24 of the 48 latents, so the right answer has 24 dead ones, and reviving them onto
    # high-loss rows (every dead_tokens) sets a fresh latent on a planted direction another latent already owns.
    # With resampling the worst direction ends split between two latents (cosines 0.963 and 0.903, L0 6.1
    # against the planted 3; 0.82 at 400k tokens: more training, more splits); without it, on planted seeds 0, 1
    # and 2: exactly 24 latents alive, L0 3.00, worst cosine 0.998-0.999.
    "jumprelu": dict(k=None, settings={"l0_coefficient": 1.0, "jumprelu_init_threshold": 1.0,
                                       "jumprelu_bandwidth": 0.5, "resample": False}, tokens=200_000),
}


@pytest.mark.parametrize("arch", list(ARCH_SETTINGS))
def test_every_architecture_recovers_a_planted_sparse_code(arch):
    torch.set_num_threads(1)
    D, X = planted_code(40_000)
    spec = ARCH_SETTINGS[arch]
    cfg = DictionaryConfig(d_in=32, d_sae=48, arch=arch, k=spec["k"], site="x")
    st = TrainSettings(tokens=spec.get("tokens", 100_000), **FAST, **spec["settings"])
    d = train_dictionaries(_chunks(X), cfg, st)["x"]
    cos = _match(D, d.W_dec.detach())
    assert cos.min() >= 0.99, f"{arch}: worst planted direction recovered at cosine {cos.min():.4f}"
    with torch.no_grad():
        f = d.encode(X[:2000])
    assert (f > 0).sum(-1).float().mean() <= 2.5 * 3  # sparse: of the order of the 3 planted atoms per row
    if arch in ("topk", "batchtopk", "jumprelu"):
        # unit norm in the normalised space the dictionary trained in; the saved weights fold the scale s in
        s = d.config.metadata["scale_in_folded"]
        torch.testing.assert_close(d.W_dec.norm(dim=-1) * s, torch.ones(48), atol=1e-5, rtol=0)


def test_transcoder_recovers_the_planted_output_directions():
    torch.set_num_threads(1)
    D_in, D_out, X, Y = planted_code(30_000, d_out=20, seed=1)
    cfg = DictionaryConfig(d_in=32, d_sae=48, arch="relu", kind="transcoder", d_out=20, site="mlp_in",
                           site_out="mlp_out")
    source = [ActivationBatch({"mlp_in": x, "mlp_out": y}) for x, y in zip(_chunks(X), _chunks(Y), strict=False)]
    st = TrainSettings(tokens=150_000, **FAST, l1_coefficient=0.3, l1_warm_up_tokens=5_000, b_dec_init="mean")
    d = train_dictionaries(source, {"tc": cfg}, st)["tc"]
    cos = _match(D_out, d.W_dec.detach())
    assert cos.min() >= 0.99, f"worst planted output direction at cosine {cos.min():.4f}"


def test_skip_transcoder_puts_a_linear_map_in_its_skip_path():
    # A purely linear "MLP" y = x A: the known answer is W_skip = A (the sparse latents have nothing to add).
    torch.set_num_threads(1)
    X = torch.randn(20_000, 32, generator=torch.Generator().manual_seed(6))  # dense, full rank: A is identifiable
    A = torch.randn(32, 20, generator=torch.Generator().manual_seed(5)) * 0.3
    cfg = DictionaryConfig(d_in=32, d_sae=48, arch="relu", kind="skip_transcoder", d_out=20, site="i", site_out="o")
    source = [ActivationBatch({"i": x, "o": x @ A}) for x in _chunks(X)]
    st = TrainSettings(tokens=60_000, **FAST, l1_coefficient=0.3, b_dec_init="mean")
    d = train_dictionaries(source, {"tc": cfg}, st)["tc"]
    assert torch.nn.functional.cosine_similarity(d.W_skip.detach().flatten(), A.flatten(), dim=0) > 0.99


# ------------------------------------------------------------------ conventions (SAELens 6.x)
def test_topk_and_batchtopk_activations_follow_saelens():
    h = torch.tensor([[3.0, -1.0, 2.0, 0.5], [-2.0, -3.0, -0.5, -1.0]])
    # TopK: top k per row, then ReLU (a negative row keeps nothing)
    assert topk_activation(h, 2).tolist() == [[3.0, 0.0, 2.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
    # BatchTopK: ReLU first, then the k * rows largest over the batch
    assert batch_topk_activation(h, 1.5).tolist() == [[3.0, 0.0, 2.0, 0.5], [0.0, 0.0, 0.0, 0.0]]


def test_jumprelu_straight_through_gradients_are_saelens():
    h = torch.tensor([[0.50, 0.98, 1.20], [1.01, 0.30, 0.96]], requires_grad=True)
    t = torch.tensor([1.0, 1.0, 1.0], requires_grad=True)
    bw = 0.1
    out = JumpReLUFunction.apply(h, t, bw)
    assert out.tolist() == [[0.0, 0.0, 1.2000000476837158], [1.0099999904632568, 0.0, 0.0]]
    out.sum().backward()
    in_band = ((h - t).abs() < bw / 2).float()  # rect((h - t) / bw)
    torch.testing.assert_close(t.grad, (-(t / bw) * in_band).sum(0).detach())
    torch.testing.assert_close(h.grad, (h > t).float())
    t.grad = None
    StepFunction.apply(h, t, bw).sum().backward()
    torch.testing.assert_close(t.grad, (-(1 / bw) * in_band).sum(0))


def test_relu_loss_weights_l1_by_decoder_norms_with_warm_up():
    d = Dictionary(DictionaryConfig(d_in=3, d_sae=2, arch="relu"))
    with torch.no_grad():
        d.W_enc.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]))
        d.W_dec.copy_(torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 0.5]]))
    x = torch.tensor([[1.0, 2.0, 0.0]])
    f = torch.tensor([[1.0, 2.0]])
    x_hat = f @ d.W_dec
    mse = (x_hat - x).pow(2).sum().detach()
    l1 = 1.0 * 2.0 + 2.0 * 0.5  # sum_i f_i ||W_dec[i]||
    st = TrainSettings(tokens=10, batch_size=1, l1_coefficient=0.1, l1_warm_up_tokens=4, progress=False)
    loss, _, _ = dictionary_loss(d, x, x, st, tokens=1)  # warm-up: (1 + 1) / 4 of the coefficient
    assert float(loss.detach()) == pytest.approx(float(mse) + 0.1 * 0.5 * l1)
    loss, _, _ = dictionary_loss(d, x, x, st, tokens=100)
    assert float(loss.detach()) == pytest.approx(float(mse) + 0.1 * l1)


def test_auxk_loss_is_saelens_formula():
    g = torch.Generator().manual_seed(0)
    d = Dictionary(DictionaryConfig(d_in=4, d_sae=6, arch="topk", k=2))
    d.init_weights(g)
    with torch.no_grad():
        d.b_dec.copy_(torch.tensor([0.1, -0.2, 0.3, 0.0]))
    h = torch.randn(5, 6, generator=g)
    y, y_hat = torch.randn(5, 4, generator=g), torch.randn(5, 4, generator=g)
    dead = torch.tensor([True, False, True, True, False, False])
    # SAELens: k_aux = d_in // 2 = 2, scale = min(3 / 2, 1) = 1; top-2 dead pre-activations, decoded WITH b_dec
    masked = torch.where(dead, h, -torch.inf)
    top = masked.topk(2, dim=-1)
    acts = torch.zeros_like(h).scatter(-1, top.indices, top.values)
    expected = ((acts @ d.W_dec + d.b_dec) - (y - y_hat)).pow(2).sum(-1).mean()
    torch.testing.assert_close(auxk_loss(d, h, y, y_hat, dead), expected)
    one_dead = torch.tensor([False, False, True, False, False, False])  # scale 1/2, k_aux 1
    acts1 = torch.zeros_like(h)
    acts1[:, 2] = h[:, 2]
    expected1 = 0.5 * ((acts1 @ d.W_dec + d.b_dec) - (y - y_hat)).pow(2).sum(-1).mean()
    torch.testing.assert_close(auxk_loss(d, h, y, y_hat, one_dead), expected1)


def test_sae_encodes_relative_to_b_dec_and_transcoder_does_not():
    sae = Dictionary(DictionaryConfig(d_in=2, d_sae=2, arch="relu"))
    tc = Dictionary(DictionaryConfig(d_in=2, d_sae=2, arch="relu", kind="transcoder", d_out=3))
    for d in (sae, tc):
        with torch.no_grad():
            d.W_enc.copy_(torch.eye(2))
            d.b_dec.fill_(1.0)
    x = torch.tensor([[3.0, 0.5]])
    assert sae.pre_activation(x).tolist() == [[2.0, -0.5]]
    assert tc.pre_activation(x).tolist() == [[3.0, 0.5]]


@pytest.mark.parametrize("arch", ["relu", "topk", "batchtopk", "jumprelu"])
def test_folding_the_normalisation_keeps_latents_and_reconstructions(arch):
    g = torch.Generator().manual_seed(3)
    d = Dictionary(DictionaryConfig(d_in=5, d_sae=8, arch=arch, k=3 if "topk" in arch else None))
    d.init_weights(g)
    with torch.no_grad():
        d.b_dec.copy_(torch.randn(5, generator=g))
        d.b_enc.copy_(torch.randn(8, generator=g) * 0.1)
        if arch == "batchtopk":
            d.batch_threshold.fill_(0.2)
    x, s = torch.randn(7, 5, generator=g) * 10, 0.37
    with torch.no_grad():
        f_scaled, x_hat_scaled = d.encode(x * s), d(x * s) / s
        d.fold_scaling(s)
        torch.testing.assert_close(d.encode(x), f_scaled)
        torch.testing.assert_close(d(x), x_hat_scaled)


def test_geometric_median_and_norm_scaling_factor_known_answers():
    x = torch.tensor([[0.0, 0.0], [1.0, 0.0], [10.0, 0.0]])  # on a line: the median is the middle point
    torch.testing.assert_close(geometric_median(x), torch.tensor([1.0, 0.0]), atol=1e-3, rtol=0)
    y = torch.tensor([[3.0, 4.0], [6.0, 8.0]])  # mean norm 7.5, d = 2
    assert norm_scaling_factor(y) == pytest.approx(math.sqrt(2) / 7.5)


# ------------------------------------------------------------------ streaming, determinism, resume
def _small(**kw):
    base = dict(tokens=6_000, batch_size=100, buffer_rows=1_000, lr=3e-3, progress=False, dead_tokens=2_000)
    base.update(kw)
    return TrainSettings(**base)


def test_memory_is_bounded_by_the_buffer_whatever_the_source_size():
    produced = {"n": 0}

    def source():  # 500 batches of 64 rows, made lazily: far more rows than the buffer holds
        g = torch.Generator().manual_seed(0)
        for _ in range(500):
            produced["n"] += 1
            yield torch.randn(64, 8, generator=g)

    from bertscope.probes.dictionary import RowReader, ShuffleBuffer

    reader = RowReader(source(), ["x"], single_site="x")
    buf = ShuffleBuffer(reader, capacity=512, batch_size=64, seed=0)
    seen = 0
    for _ in range(20):
        for acts, _codes in buf.next_round():
            seen += acts["x"].shape[0]
            assert reader._pending_rows <= 64  # the reader holds at most one source batch beyond the buffer
    assert buf.max_rows <= 512
    assert produced["n"] <= seen // 64 + 512 // 64 + 1  # the source was read as needed, not materialised
    cfg = DictionaryConfig(d_in=8, d_sae=16, arch="topk", k=2, site="x")
    train_dictionaries(source(), cfg, _small(buffer_rows=400, tokens=2_000))  # a one-shot generator trains too


class _CountingSource:
    """A re-iterable source that counts its passes (each pass would be a model forward over the corpus)."""

    def __init__(self, x: torch.Tensor) -> None:
        self.x, self.passes = x, 0

    def __iter__(self):
        self.passes += 1
        yield from _chunks(self.x, 300)


def test_a_corpus_that_fits_the_buffer_is_read_once_and_reshuffled_every_epoch():
    _, X = planted_code(3_000, d=8, m=10, seed=6)
    cfg = DictionaryConfig(d_in=8, d_sae=16, arch="topk", k=2, site="x")
    fits = _CountingSource(X)
    d = train_dictionaries(fits, cfg, _small(buffer_rows=3_000, tokens=12_000))["x"]
    assert fits.passes == 1  # four epochs from one read
    meta = d.config.metadata
    assert meta["held_in_memory"] and meta["unique_tokens"] == 3_000 and meta["epochs"] == 4.0
    from bertscope.probes.dictionary import EpochBuffer

    buf = EpochBuffer(({"x": X}, torch.zeros(3_000, dtype=torch.int64)), batch_size=1_000, seed=0)
    first, second = ([a["x"] for a, _ in buf.next_round()] for _ in range(2))
    assert not torch.equal(torch.cat(first), torch.cat(second))  # a fresh order every epoch
    rows = {tuple(r.tolist()) for r in torch.cat(first)}
    assert len(rows) == 3_000 and rows == {tuple(r.tolist()) for r in X}  # every row once per epoch
    streams = _CountingSource(X)
    train_dictionaries(streams, cfg, _small(buffer_rows=1_000, tokens=12_000))
    assert streams.passes >= 4  # larger than the buffer: streamed again on every pass


def test_training_is_deterministic_per_seed_and_several_sites_equal_separate_runs():
    torch.set_num_threads(1)
    _, A = planted_code(3_000, d=8, m=10, seed=2)
    _, B = planted_code(3_000, d=6, m=10, seed=3)
    source = [ActivationBatch({"a": a, "b": b}) for a, b in zip(_chunks(A, 500), _chunks(B, 500), strict=False)]
    cfgs = {"a": DictionaryConfig(d_in=8, d_sae=16, arch="topk", k=2, site="a"),
            "b": DictionaryConfig(d_in=6, d_sae=12, arch="jumprelu", site="b")}
    both = train_dictionaries(source, cfgs, _small())
    again = train_dictionaries(source, cfgs, _small())
    other = train_dictionaries(source, cfgs, _small(seed=1))
    alone = train_dictionaries(source, {"b": cfgs["b"]}, _small())["b"]
    for name in cfgs:
        assert torch.equal(both[name].W_dec, again[name].W_dec)
        assert not torch.equal(both[name].W_dec, other[name].W_dec)
    assert torch.equal(both["b"].W_dec, alone.W_dec) and torch.equal(both["b"].log_threshold, alone.log_threshold)


@pytest.mark.parametrize(("arch", "buffer_rows"), [("topk", 1_000), ("relu", 1_000), ("topk", 8_000)])
def test_resume_from_a_checkpoint_equals_an_uninterrupted_run(tmp_path, arch, buffer_rows):
    """Streaming (buffer 1,000 rows < 4,000) and whole-corpus-in-memory (buffer 8,000) runs both resume."""
    torch.set_num_threads(1)
    _, X = planted_code(4_000, d=8, m=10, seed=4)
    cfg = DictionaryConfig(d_in=8, d_sae=16, arch=arch, k=2 if arch == "topk" else None, site="x")
    st = _small(checkpoint_tokens=1_000, l1_coefficient=0.3, dead_tokens=600,  # resampling happens mid-run (relu)
                buffer_rows=buffer_rows, tokens=12_000 if buffer_rows > 4_000 else 6_000)
    full = train_dictionaries(_chunks(X, 300), cfg, st)["x"]
    with pytest.raises(TrainingInterrupted):
        train_dictionaries(_chunks(X, 300), cfg, st, checkpoint_dir=tmp_path, stop_after_tokens=2_500)
    assert (tmp_path / "checkpoint.pt").exists() and not list(tmp_path.glob("*.partial"))
    resumed = train_dictionaries(_chunks(X, 300), cfg, st, checkpoint_dir=tmp_path)["x"]
    for name in ("W_enc", "b_enc", "W_dec", "b_dec"):
        assert torch.equal(getattr(full, name), getattr(resumed, name)), name
    assert resumed.config.metadata["tokens_trained"] == st.tokens
    assert resumed.config.metadata["held_in_memory"] == (buffer_rows > 4_000)
    other = DictionaryConfig(d_in=8, d_sae=32, arch=arch, k=2 if arch == "topk" else None, site="x")
    with pytest.raises(ValueError, match="another configuration"):
        train_dictionaries(_chunks(X, 300), other, st, checkpoint_dir=tmp_path)


def test_special_tokens_and_padding_are_left_out_unless_asked():
    _, X = planted_code(3_000, d=8, m=10, seed=5)
    outliers = torch.full((3_000, 8), 1e4)  # [CLS]-like rows with enormous norms
    mixed = [ActivationBatch({"x": torch.cat([x, o])}, ["word"] * len(x) + ["special"] * (len(o) // 2)
                             + ["pad"] * (len(o) - len(o) // 2))
             for x, o in zip(_chunks(X, 500), _chunks(outliers, 500), strict=False)]
    clean = [ActivationBatch({"x": x}, ["word"] * len(x)) for x in _chunks(X, 500)]
    cfg = DictionaryConfig(d_in=8, d_sae=16, arch="topk", k=2, site="x")
    a = train_dictionaries(mixed, cfg, _small())["x"]
    b = train_dictionaries(clean, cfg, _small())["x"]
    assert torch.equal(a.W_dec, b.W_dec)
    assert a.config.metadata["token_classes_excluded"] == ["special", "pad"]
    c = train_dictionaries(mixed, cfg, _small(include_special=True))["x"]
    assert c.config.metadata["scale_in_folded"] < a.config.metadata["scale_in_folded"] / 100


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="k < d_sae"):
        DictionaryConfig(d_in=4, d_sae=8, arch="topk", k=8)
    with pytest.raises(ValueError, match="arch must be"):
        DictionaryConfig(d_in=4, d_sae=8, arch="gated")
    cfg = DictionaryConfig(d_in=4, d_sae=8, arch="topk", k=2, site="x")
    with pytest.raises(ValueError, match="fewer than one batch"):
        train_dictionaries(iter([torch.randn(50, 4)]), cfg, _small())
    with pytest.raises(ValueError, match="width 5"):
        train_dictionaries([torch.randn(5000, 5)], cfg, _small())
    with pytest.raises(KeyError, match="no activations for site"):
        train_dictionaries([{"y": torch.randn(500, 4)}], cfg, _small())


def test_topk_training_loss_and_gradients_equal_the_dense_computation():
    """The sparse TopK path (TopKEncodeFunction, AuxK on the dead latents only) gives the dense formulas' loss
    and gradients: topk_activation, decode, MSE + AuxK (auxk_loss on the full pre-activations)."""
    torch.manual_seed(0)
    cfg = DictionaryConfig(d_in=16, d_sae=64, arch="topk", k=4, site="x")
    d = Dictionary(cfg)
    d.init_weights(torch.Generator().manual_seed(1))
    with torch.no_grad():
        d.b_dec.copy_(torch.randn(16) * 0.1)
        d.b_enc.copy_(torch.randn(64) * 0.1)
    x = torch.randn(50, 16)
    dead = torch.zeros(64, dtype=torch.bool)
    dead[::5] = True
    st = TrainSettings(tokens=1024, batch_size=512, progress=False, aux_coefficient=0.5)
    loss, f, y_hat = dictionary_loss(d, x, x, st, tokens=0, dead=dead)
    loss.backward()
    fast = {n: p.grad.clone() for n, p in d.named_parameters()}
    d.zero_grad()
    h = d.pre_activation(x)
    f_ref = topk_activation(h, 4)
    y_ref = d.decode(f_ref)
    ref = (y_ref - x).pow(2).sum(-1).mean() + 0.5 * auxk_loss(d, h, x, y_ref, dead)
    ref.backward()
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(f, f_ref.detach())
    for n, p in d.named_parameters():
        torch.testing.assert_close(fast[n], p.grad, atol=1e-5, rtol=1e-4, msg=n)
