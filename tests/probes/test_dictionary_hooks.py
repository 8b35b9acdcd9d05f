"""A spliced dictionary's activations are hook points under SAELens's names (issue 40 item 10):
``run_with_cache`` inside ``spliced`` returns ``<site>.hook_sae_acts_post`` / ``hook_sae_recons`` /
``hook_sae_input``, equal to the dictionary applied to the clean site; a hook on the latents steers the model; the
names are gone after the block."""

from __future__ import annotations

import pytest
import torch
from bertscope.probes.dictionary import Dictionary, DictionaryConfig, spliced
from helpers import save_tiny_bert

import bertscope

SITE = "blocks.0.hook_resid_post"
TEXTS = ["The cat sat on the mat.", "Dogs bark loudly at strangers!"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    save_tiny_bert(folder)
    return bertscope.load(folder).eval()


def _dictionary(d: int) -> Dictionary:
    torch.manual_seed(0)
    dic = Dictionary(DictionaryConfig(d_in=d, d_sae=4 * d, arch="topk", k=4, site=SITE))
    dic.init_weights(torch.Generator().manual_seed(1))
    return dic


@torch.no_grad()
def test_latents_are_hook_points_with_saelens_names(tiny):
    d = _dictionary(tiny.config.d_model)
    _, clean = tiny.run_with_cache(TEXTS, names_filter=[SITE])
    with spliced(tiny, d):
        _, cache = tiny.run_with_cache(TEXTS, names_filter=lambda n: n.startswith(SITE))
    x = clean[SITE]
    names = [n for n in cache.keys() if n.startswith(SITE)]
    assert names == [SITE, f"{SITE}.hook_sae_input", f"{SITE}.hook_sae_acts_post", f"{SITE}.hook_sae_recons"]
    torch.testing.assert_close(cache[f"{SITE}.hook_sae_input"], x)
    acts = cache[f"{SITE}.hook_sae_acts_post"]
    assert acts.shape == (*x.shape[:2], d.config.d_sae)
    torch.testing.assert_close(acts, d.encode(x))
    assert int((acts[0, 0] != 0).sum()) == 4  # TopK k = 4: four latents fire per token
    torch.testing.assert_close(cache[f"{SITE}.hook_sae_recons"], d(x))
    torch.testing.assert_close(cache[SITE], d(x))  # the model reads the reconstruction downstream
    assert not any(n.startswith(f"{SITE}.hook_sae") for n in tiny.hook_names())  # gone after the block


@torch.no_grad()
def test_a_hook_on_the_latents_edits_what_the_model_reads(tiny):
    d = _dictionary(tiny.config.d_model)
    _, clean = tiny.run_with_cache(TEXTS, names_filter=[SITE])
    acts = d.encode(clean[SITE])
    top = int(acts.flatten(0, 1).abs().sum(0).argmax())  # the latent that carries most

    def ablate(t, hook):
        t = t.clone()
        t[..., top] = 0
        return t

    with spliced(tiny, d):
        _, cache = tiny.run_with_cache(TEXTS, names_filter=[SITE], fwd_hooks=[(f"{SITE}.hook_sae_acts_post", ablate)])
    edited = acts.clone()
    edited[..., top] = 0
    torch.testing.assert_close(cache[SITE], d.decode(edited, clean[SITE]))
    assert not torch.allclose(cache[SITE], d(clean[SITE]))


def test_splicing_one_site_twice_is_refused(tiny):
    d = _dictionary(tiny.config.d_model)
    with spliced(tiny, d), pytest.raises(ValueError, match="already a hook point"):
        with spliced(tiny, d):
            pass
    assert f"{SITE}.hook_sae_acts_post" not in tiny.hook_names()
