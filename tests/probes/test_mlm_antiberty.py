"""Real masked-LM weights: AntiBERTy (``antiberty==0.1.3``, a protein BERT 8 x 512). Skipped, saying why, when the
package is not installed (``pip install antiberty==0.1.3``)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from bertscope.models import load
from bertscope.probes.lens import fit_tuned_lens, lens_metrics, masked_streams, pll_loop, token_pll
from mlm_fixtures import antiberty_folder, antibody_variants

pytestmark = pytest.mark.skipif(importlib.util.find_spec("antiberty") is None,
                                reason="antiberty is not installed (pip install antiberty==0.1.3)")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return antiberty_folder(tmp_path_factory.mktemp("antiberty"))


@pytest.fixture(scope="module")
def antiberty(folder):
    return load(folder)


def _short(n: int, seed: int, length: int = 40) -> list[str]:
    """``n`` antibody variants cut to their first ``length`` residues (keeps the test quick)."""
    return [" ".join(s.split()[:length]) for s in antibody_variants(n, seed=seed)]


@pytest.mark.slow
def test_pll_of_antibodies_equals_brute_force(folder):
    """In float64 (in float32 a peaky real head's log-probabilities differ between batched and single-row kernels
    by float32 rounding, about 2e-7 relative: 1.9e-6 on a log-probability of -9 was seen)."""
    antiberty = load(folder, dtype=torch.float64)
    sequences = _short(3, seed=5, length=24)
    for method in ("original", "within_word_l2r"):
        reference = pll_loop(antiberty, sequences, method)
        got = token_pll(antiberty, sequences, method, batch_size=16)
        np.testing.assert_allclose(got["logprob"], reference["logprob"], rtol=0, atol=1e-6)
    assert reference["logprob"].mean() > np.log(1 / 20)  # the real head beats chance over 20 amino acids


@pytest.mark.slow
def test_lens_accuracy_rises_and_tuned_lens_beats_logit_lens(antiberty):
    """Reported, not assumed: on held-out variants the logit lens' masked accuracy is higher at the last stream than
    at the embeddings, and the tuned lens' KL to the final distribution is below the logit lens' at every stream
    before the last."""
    train = masked_streams(antiberty, _short(60, seed=0), seed=0)
    test = masked_streams(antiberty, _short(30, seed=1), seed=1)
    lens, _ = fit_tuned_lens(antiberty, train, epochs=20, lr=1e-3)
    logit = lens_metrics(antiberty, test, n_boot=100).pivot(index="stream", columns="measure", values="value")
    tuned = lens_metrics(antiberty, test, lens, n_boot=100).pivot(index="stream", columns="measure", values="value")
    assert logit["masked_accuracy"].iloc[-1] > logit["masked_accuracy"].iloc[0]
    assert (tuned["kl_to_final"].iloc[:-1] < logit["kl_to_final"].iloc[:-1]).all(), (logit, tuned)
