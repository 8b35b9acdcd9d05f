"""Concept erasure (probes/erasure.py): LEACE against its closed form, known-answer planted concepts, INLP's rank,
mean projection, the random-subspace control, and erasure as a hook intervention."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from bertscope.hooks import HookedModule, HookPoint
from bertscope.probes.erasure import (
    INLP,
    LeaceEraser,
    LeaceFitter,
    MeanProjection,
    RandomSubspaceEraser,
    concept_matrix,
    cross_covariance,
    optimal_linear_shrinkage,
)
from sklearn.linear_model import LogisticRegression


def planted(n: int = 3000, d: int = 16, seed: int = 0):
    """Isotropic noise plus two independent binary concepts along orthogonal unit directions v (y) and w (y2)."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    v, w = q[:, 0], q[:, 1]
    y, y2 = rng.integers(0, 2, n), rng.integers(0, 2, n)
    x = rng.normal(size=(n, d)) + 3.0 * np.outer(y, v) + 3.0 * np.outer(y2, w)
    return x, y, y2, v, w


def held_out_accuracy(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """A fresh logistic probe trained on the first half, scored on the second; and the majority rate there."""
    half = len(x) // 2
    probe = LogisticRegression(max_iter=1000).fit(x[:half], y[:half])
    majority = np.bincount(y[half:]).max() / (len(y) - half)
    return float(probe.score(x[half:], y[half:])), float(majority)


# ------------------------------------------------------------------------------------------------ LEACE formula
def leace_formula(x: np.ndarray, z: np.ndarray, svd_tol: float = 0.01) -> tuple[np.ndarray, np.ndarray]:
    """The closed form of Belrose et al. (2023), Theorem 4.3, in numpy: r(x) = x - W^+ P_{W Σxz} W (x - E x),
    W = Σxx^{-1/2} (sample covariances, Bessel's correction)."""
    xc, zc = x - x.mean(0), z - z.mean(0)
    sxx = xc.T @ xc / (len(x) - 1)
    sxz = xc.T @ zc / (len(x) - 1)
    lam, vec = np.linalg.eigh(sxx)
    W = vec @ np.diag(lam**-0.5) @ vec.T
    W_pinv = vec @ np.diag(lam**0.5) @ vec.T
    u, s, _ = np.linalg.svd(W @ sxz, full_matrices=False)
    u = u[:, s > svd_tol]
    P = np.eye(x.shape[1]) - W_pinv @ u @ u.T @ W
    return P, x.mean(0)


def test_leace_equals_the_closed_form_formula() -> None:
    x, y, _, _, _ = planted(n=800, d=12)
    rng = np.random.default_rng(1)
    x = x @ rng.normal(size=(12, 12))  # correlated features: whitening matters
    labels = rng.integers(0, 4, len(x))
    x = x + np.eye(4)[labels] @ rng.normal(size=(4, 12))
    z = np.eye(4)[labels]
    expected_P, expected_bias = leace_formula(x, z)
    eraser = LeaceFitter.fit(x, labels, shrinkage=False, constrain_cov_trace=False).eraser
    np.testing.assert_allclose(eraser.P.numpy(), expected_P, atol=1e-9)
    np.testing.assert_allclose(eraser.bias.numpy(), expected_bias, atol=1e-12)
    np.testing.assert_allclose(eraser(x), x - (x - expected_bias) @ (np.eye(12) - expected_P).T, atol=1e-9)
    # the default (shrinkage on) is the same formula with the shrunk covariance
    shrunk = LeaceFitter.fit(x, labels)
    sample = np.cov(x, rowvar=False, ddof=0)
    np.testing.assert_allclose(shrunk.sigma_xx.numpy(), shrinkage_formula(sample, len(x)), rtol=1e-10)


def shrinkage_formula(S: np.ndarray, n: int) -> np.ndarray:
    """Optimal linear shrinkage toward tr(S)/p I (concept-erasure's estimator) written out in numpy."""
    p = S.shape[0]
    tr = np.trace(S)
    s0 = tr**2 / p
    eps = np.finfo(np.float64).eps
    alpha = 1 - (tr * tr * s0 / n + eps) / (np.sum(S * S) * s0 - s0 * s0 + eps)
    beta = (1 - alpha) * (s0 + eps) / (s0 + eps)
    return alpha * S + beta * tr / p * np.eye(p)


def test_shrinkage_matches_formula_and_keeps_the_trace() -> None:
    rng = np.random.default_rng(0)
    S = np.cov(rng.normal(size=(30, 10)), rowvar=False)
    out = optimal_linear_shrinkage(torch.from_numpy(S), 30).numpy()
    np.testing.assert_allclose(out, shrinkage_formula(S, 30), rtol=1e-12)
    assert np.trace(out) == pytest.approx(np.trace(S))


def test_streamed_fit_equals_one_shot_fit() -> None:
    x, y, _, _, _ = planted(n=1000)
    whole = LeaceFitter.fit(x, y, n_classes=2).eraser
    fitter = LeaceFitter(x.shape[1], 2)
    for xb, yb in zip(np.array_split(x, 7), np.array_split(y, 7), strict=True):
        fitter.update(xb, yb)
    np.testing.assert_allclose(fitter.eraser.P.numpy(), whole.P.numpy(), atol=1e-10)
    np.testing.assert_allclose(fitter.eraser.bias.numpy(), whole.bias.numpy(), atol=1e-12)


def test_leace_removes_exactly_the_planted_concept() -> None:
    x, y, y2, v, w = planted()
    before, _ = held_out_accuracy(x, y)
    before2, _ = held_out_accuracy(x, y2)
    assert before > 0.9 and before2 > 0.9
    erased = LeaceEraser.fit(x, y)(x)
    assert np.abs(cross_covariance(erased, y)).max() < 1e-10
    after, majority = held_out_accuracy(erased, y)
    assert abs(after - majority) <= 0.01 + 0.02  # chance, up to the held-out half's sampling noise
    after2, _ = held_out_accuracy(erased, y2)
    assert abs(after2 - before2) < 0.01  # the orthogonal concept is untouched
    np.testing.assert_allclose((erased - x) @ w, 0, atol=0.15)  # w barely moves (sampling noise only)
    assert np.abs((erased - x) @ v).mean() > 1.0  # v carried the concept and is what changed


def test_leace_eraser_works_on_tensors_arrays_and_dtypes() -> None:
    x, y, _, _, _ = planted(n=400, d=8)
    eraser = LeaceEraser.fit(x, y)
    t = torch.from_numpy(x).float().reshape(20, 20, 8)  # [batch, pos, d]
    out = eraser(t)
    assert out.dtype == torch.float32 and out.shape == t.shape
    np.testing.assert_allclose(out.reshape(-1, 8).numpy(), eraser(x), atol=1e-5)
    assert eraser(x.astype(np.float32)).dtype == np.float32
    with pytest.raises(ValueError, match="width 8"):
        eraser(np.zeros((3, 5)))


def test_concept_matrix_shapes_and_errors() -> None:
    assert concept_matrix(np.array([0, 2, 1]), 3).shape == (3, 3)
    assert concept_matrix(np.array([0.5, 1.0]), 2).shape == (2, 1)
    with pytest.raises(ValueError, match="rows"):
        concept_matrix(np.array([0, 1]), 3)
    with pytest.raises(ValueError, match=">= 0"):
        concept_matrix(np.array([-1, 1]), 2)


def test_orth_method_is_an_orthogonal_projection() -> None:
    x, y, _, v, _ = planted(n=1500)
    P = LeaceFitter.fit(x, y, method="orth").eraser.P.numpy()
    np.testing.assert_allclose(P, P.T, atol=1e-12)
    np.testing.assert_allclose(P @ P, P, atol=1e-12)
    assert np.linalg.matrix_rank(np.eye(len(P)) - P) == 1
    assert abs(np.abs(np.linalg.eigh(np.eye(len(P)) - P)[1][:, -1] @ v)) > 0.99


# ------------------------------------------------------------------------------------------------ INLP
@pytest.mark.parametrize("iterations", [1, 3, 5])
def test_inlp_projection_has_the_rank_of_its_iterations(iterations: int) -> None:
    x, y, _, _, _ = planted(n=800)
    inlp = INLP("svm", n_iterations=iterations).fit(x, y)
    assert inlp.rank == iterations  # binary concept: one direction per classifier
    P = inlp.P.numpy()
    np.testing.assert_allclose(P @ P, P, atol=1e-10)
    np.testing.assert_allclose(P, P.T, atol=1e-10)
    assert len(inlp.steps) == iterations


def test_inlp_multiclass_removes_k_directions_per_iteration() -> None:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, 900)
    x = rng.normal(size=(900, 12)) + np.eye(3)[labels] @ rng.normal(size=(3, 12)) * 3
    inlp = INLP("svm", n_iterations=2).fit(x, labels)
    assert inlp.rank == 6  # one-vs-rest: 3 weight rows per classifier


def test_inlp_first_classifier_finds_the_concept_and_amnesic_rule_stops_at_majority() -> None:
    x, y, _, _, _ = planted(n=2000)
    for classifier in ("sgd-log", "svm"):
        inlp = INLP(classifier, n_iterations=20, stop_at_majority=True).fit(x, y)
        assert inlp.steps[0].dev_accuracy > 0.9
        assert inlp.steps[-1].dev_accuracy - inlp.majority <= inlp.tolerance
        assert all(s.dev_accuracy - inlp.majority > inlp.tolerance for s in inlp.steps[:-1])
        assert inlp.rank == len(inlp.steps) < 20
    after, majority = held_out_accuracy(inlp(x), y)  # the SVM's directions: a fresh probe is at chance
    assert after - majority < 0.03
    with pytest.raises(ValueError, match="unknown classifier"):
        INLP("tree").fit(x, y)


# ------------------------------------------------------------------------------------------------ mean projection
def test_mean_projection_equalises_class_means_with_rank_k_minus_1() -> None:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, 1000)
    x = rng.normal(size=(1000, 10)) + np.eye(4)[labels] @ rng.normal(size=(4, 10)) * 2
    mp = MeanProjection().fit(x, labels)
    assert mp.rank == 3
    out = mp(x)
    means = np.stack([out[labels == c].mean(0) for c in range(4)])
    np.testing.assert_allclose(means - means.mean(0), 0, atol=1e-10)
    np.testing.assert_allclose(out.mean(0), x.mean(0), atol=1e-10)  # affine: the overall mean stays


def test_random_subspace_control_is_an_orthogonal_projection_of_the_given_rank() -> None:
    ctrl = RandomSubspaceEraser(16, 3, seed=1)
    P = ctrl.P.numpy()
    assert ctrl.rank == 3
    np.testing.assert_allclose(P @ P, P, atol=1e-12)
    np.testing.assert_allclose(P, P.T, atol=1e-12)
    assert not np.allclose(P, RandomSubspaceEraser(16, 3, seed=2).P.numpy())
    assert RandomSubspaceEraser(16, 0).rank == 0


# ------------------------------------------------------------------------------------------------ fit forms
@pytest.mark.parametrize(
    "cls, options",
    [(LeaceEraser, {"method": "orth"}), (INLP, {"classifier": "svm", "n_iterations": 2}),
     (MeanProjection, {"affine": False})],
)
def test_every_eraser_fits_in_both_forms(cls, options) -> None:
    """concept-erasure's ``Eraser.fit(x, z)`` (a new fitted eraser) and scikit-learn's ``eraser.fit(x, z)`` (fits
    that object, returns it) give the same map, options included, and an unfitted eraser refuses to erase."""
    x, y, _, _, _ = planted(n=600)
    fit_options = {k: v for k, v in options.items() if k == "method"}  # LEACE's options are fit's (LeaceFitter's)
    init_options = {k: v for k, v in options.items() if k not in fit_options}
    by_class = cls.fit(x, y, **options)
    blank = cls(**init_options)
    with pytest.raises(RuntimeError, match="not fitted"):
        blank(x)
    by_instance = blank.fit(x, y, **fit_options)
    assert type(by_class) is cls and by_instance is blank and by_class is not blank
    np.testing.assert_array_equal(by_class.P.numpy(), by_instance.P.numpy())
    np.testing.assert_array_equal(by_class(x), by_instance(x))
    assert by_class.rank == (2 if cls is INLP else 1)
    if cls is LeaceEraser:  # orth: an orthogonal projection, which the default (whitened) LEACE is not here
        np.testing.assert_allclose(by_class.P.numpy(), by_class.P.numpy().T, atol=1e-12)
    else:
        assert all(getattr(by_class, k) == v for k, v in init_options.items())
    refit = by_instance.fit(x[:300], 1 - y[:300], **fit_options)  # refitting replaces the old fit
    assert refit is by_instance and not np.array_equal(refit.P.numpy(), by_class.P.numpy())


def test_inlp_stops_at_a_classifier_under_min_accuracy() -> None:
    """debias.py's ``min_accuracy``: the planted concept is found at iteration 0 (accuracy > 0.9), and the next
    classifiers sit at chance; with ``min_accuracy=0.8`` the first under it is not projected out, and no more run."""
    x, y, _, _, _ = planted(n=2000)
    free = INLP("svm", n_iterations=4).fit(x, y)
    assert free.steps[0].dev_accuracy > 0.9 and free.steps[1].dev_accuracy < 0.8 and free.rank == 4
    gated = INLP("svm", n_iterations=4, min_accuracy=0.8).fit(x, y)
    assert [s.projected for s in gated.steps] == [True, False]
    assert [s.dev_accuracy for s in gated.steps] == [s.dev_accuracy for s in free.steps[:2]]
    assert gated.rank == 1 and len(gated.weights) == 1
    np.testing.assert_array_equal(gated.P.numpy(), INLP("svm", n_iterations=1).fit(x, y).P.numpy())
    with pytest.raises(ValueError, match="min_accuracy"):
        INLP(min_accuracy=1.5)


# ------------------------------------------------------------------------------------------------ hooks
class ReadsFirstHalf(HookedModule):
    """A constructed two-stage model: ``hook_mid`` carries x [batch, pos, d]; the next stage reads only the first
    d/2 features (``W`` is zero on the rest), then ``hook_out``."""

    def __init__(self, d: int = 8) -> None:
        super().__init__()
        self.hook_mid, self.hook_out = HookPoint(), HookPoint()
        g = torch.Generator().manual_seed(0)
        W = torch.randn(d, d, generator=g, dtype=torch.float64)
        W[:, d // 2:] = 0
        self.W = torch.nn.Parameter(W, requires_grad=False)
        self.setup_hooks()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.hook_out(torch.tanh(self.hook_mid(x) @ self.W.T))


def test_erasing_a_concept_the_model_never_reads_changes_nothing_downstream() -> None:
    rng = np.random.default_rng(0)
    n, d = 600, 8
    y = rng.integers(0, 2, n)
    base = rng.normal(size=(n, d))
    yc = y - y.mean()
    base[:, : d // 2] -= np.outer(yc, yc @ base[:, : d // 2]) / (yc @ yc)  # the read half: no sample covariance with y
    unused = base.copy()
    unused[:, d // 2:] += 3.0 * y[:, None] * rng.normal(size=d // 2)  # concept only in the unread half
    used = base + 3.0 * y[:, None] * rng.normal(size=d)  # concept in every feature
    model = ReadsFirstHalf(d)
    for data, changes in ((unused, False), (used, True)):
        x = torch.from_numpy(data).reshape(30, 20, d)
        eraser = LeaceFitter.fit(data, y, method="orth").eraser
        clean = model(x)
        with model.hooks(eraser.hook(model, "hook_mid")):
            erased = model(x)
        moved = float((erased - clean).abs().max())
        if changes:
            assert moved > 0.1
        else:
            assert moved < 1e-12


def test_hook_erases_at_the_site_and_checks_names(tiny_config) -> None:
    from bertscope import models

    model = models.Encoder(tiny_config).eval()
    ids = torch.randint(5, 100, (3, 7))
    site = "blocks.0.hook_resid_post"
    _, cache = model.run_with_cache(ids, names_filter=site)
    acts = cache[site].reshape(-1, cache[site].shape[-1]).double()
    labels = np.arange(len(acts)) % 2
    eraser = LeaceEraser.fit(acts, labels)
    seen = {}
    with model.hooks(eraser.hook(model, site) + [(site, lambda t, hook: seen.setdefault("x", t))]):
        model(ids)
    torch.testing.assert_close(seen["x"], eraser(cache[site]), atol=1e-5, rtol=1e-5)
    first = eraser.hook(model, site, positions=lambda t: (torch.arange(t.shape[1]) == 0).expand(t.shape[0], -1))
    with model.hooks(first + [(site, lambda t, hook: seen.__setitem__("y", t))]):
        model(ids)
    torch.testing.assert_close(seen["y"][:, 1:], cache[site][:, 1:])
    with pytest.raises(KeyError):
        eraser.hook(model, "blocks.0.hook_typo")
