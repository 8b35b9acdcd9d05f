"""Dictionaries spliced into encoders: an identity dictionary changes nothing (sentence embeddings, masked-LM
loss and KL, classifier logits), ablations do, controls are what they say, token classes are right."""

from __future__ import annotations

import pytest
import torch
import transformers
from bertscope.probes.dictionary import (
    collect_activations,
    evaluate_dictionary,
    fraction_recovered,
    identity_dictionary,
    neuron_topk_dictionary,
    pca_topk_dictionary,
    splice_fidelity,
    spliced_embeddings,
    token_classes,
)
from helpers import save_tiny_bert

import bertscope

TEXTS = ["The cat sat on the mat.", "Dogs bark loudly at strangers!", "An unbelievably long word appears.",
         "She reads books.", "Rain, snow and wind arrived together."]


@pytest.fixture(scope="module")
def bundled():
    return bertscope.load()


@pytest.fixture(scope="module")
def tiny_mlm(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_mlm")
    save_tiny_bert(folder, transformers.BertForMaskedLM)
    return bertscope.load(folder)


def _values(table, condition, metric):
    return float(table[(table.condition == condition) & (table.metric == metric)]["value"].iloc[0])


def test_identity_dictionary_changes_nothing_in_a_sentence_embedding_model(bundled):
    site = "blocks.3.hook_resid_post"
    table = splice_fidelity(bundled, identity_dictionary(384, site=site), TEXTS, objective="sentence")
    assert _values(table, "dictionary", "embedding_cosine") == pytest.approx(1.0, abs=1e-6)
    assert _values(table, "dictionary", "similarity_spearman") == pytest.approx(1.0)
    assert _values(table, "zero_ablation", "fraction_recovered") == pytest.approx(1.0, abs=1e-5)
    assert _values(table, "zero", "embedding_cosine") < 0.99  # the ablation does change the embedding
    assert set(table.condition) >= {"clean", "dictionary", "zero", "mean", "zero_ablation", "mean_ablation"}


def test_identity_dictionary_changes_nothing_in_a_masked_lm(tiny_mlm):
    site = "blocks.0.hook_resid_post"
    table = splice_fidelity(tiny_mlm, identity_dictionary(32, site=site), TEXTS * 3, objective="mlm", seed=3)
    assert _values(table, "dictionary", "ce") == pytest.approx(_values(table, "clean", "ce"), abs=1e-6)
    assert _values(table, "dictionary", "kl") == pytest.approx(0.0, abs=1e-9)
    assert _values(table, "zero", "kl") > 0
    assert _values(table, "clean", "n_masked") > 0
    again = splice_fidelity(tiny_mlm, identity_dictionary(32, site=site), TEXTS * 3, objective="mlm", seed=3)
    assert again.equals(table)  # the masked positions are fixed by the seed


def test_classifier_objective_and_transcoder_splice(tiny_mlm):
    torch.manual_seed(0)
    head_w = torch.randn(32, 3)

    def head(hidden):
        return hidden[:, 0] @ head_w

    site = "blocks.1.hook_resid_mid"
    table = splice_fidelity(tiny_mlm, identity_dictionary(32, site=site), TEXTS, objective="classifier", head=head)
    assert _values(table, "dictionary", "kl") == pytest.approx(0.0, abs=1e-9)
    assert _values(table, "dictionary", "accuracy") == 1.0  # agreement with the clean prediction


def test_spliced_embeddings_are_the_per_sentence_values_splice_fidelity_averages(bundled):
    site = "blocks.3.hook_resid_post"
    x = torch.cat([b.acts[site] for b in collect_activations(bundled, TEXTS * 4, [site])])
    d = pca_topk_dictionary(x, 8, site=site)  # a lossy dictionary: the splice changes the embedding
    emb = spliced_embeddings(bundled, d, TEXTS, batch_size=2)
    assert set(emb) == {"clean", "dictionary", "zero", "mean"}
    assert all(e.shape == (len(TEXTS), 384) and e.dtype == torch.float64 for e in emb.values())
    clean = bertscope.similarity.embed(bundled, TEXTS)[("blocks.5.hook_resid_post", "mean")].double()
    torch.testing.assert_close(emb["clean"], clean, atol=1e-5, rtol=1e-5)  # bertscope.similarity's embedding
    cos = {c: torch.nn.functional.cosine_similarity(e, emb["clean"], dim=-1) for c, e in emb.items()}
    assert float(cos["dictionary"].min()) < 0.9999
    table = splice_fidelity(bundled, d, TEXTS, objective="sentence")
    for c in ("dictionary", "zero", "mean"):
        assert float(cos[c].mean()) == pytest.approx(_values(table, c, "embedding_cosine"), abs=1e-6)
    loss = {c: float((1 - cos[c]).mean()) for c in ("dictionary", "mean")}
    assert 1 - loss["dictionary"] / loss["mean"] == pytest.approx(
        _values(table, "mean_ablation", "fraction_recovered"), abs=1e-5)
    only = spliced_embeddings(bundled, identity_dictionary(384, site=site), TEXTS[:2], conditions=("dictionary",))
    torch.testing.assert_close(only["dictionary"], emb["clean"][:2], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="conditions are"):
        spliced_embeddings(bundled, d, TEXTS, conditions=("spliced",))


def test_fraction_recovered_formula():
    assert fraction_recovered(clean=1.0, spliced_loss=1.5, ablated=3.0) == pytest.approx(0.75)
    assert fraction_recovered(clean=1.0, spliced_loss=3.0, ablated=3.0) == 0.0


def test_token_classes_and_collected_rows(bundled):
    batch = bundled.tokenize(["An unbelievably long word, here.", "Hi"])
    classes = token_classes(bundled, batch["input_ids"], batch["attention_mask"])
    pieces = bundled.to_str_tokens("An unbelievably long word, here.")
    row = dict(zip(pieces, classes[0][: len(pieces)], strict=True))
    assert row["[CLS]"] == "special" and row["[SEP]"] == "special" and row[","] == "punct" and row["long"] == "word"
    assert any(p.startswith("##") and row[p] == "continuation" for p in pieces)
    assert classes[1][-1] == "pad"
    batches = list(collect_activations(bundled, TEXTS, ["blocks.3.hook_resid_post"], batch_size=2))
    n_real = sum(len(bundled.to_str_tokens(t)) for t in TEXTS)
    assert sum(b.n_rows for b in batches) == n_real  # every real token, never padding
    with pytest.raises(KeyError, match="no hook"):
        next(collect_activations(bundled, TEXTS, ["blocks.9.hook_resid_post"]))


def test_controls_are_exact_at_full_rank_and_keep_k_components():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(500, 6, generator=g) @ torch.randn(6, 6, generator=g)
    for make in (pca_topk_dictionary, neuron_topk_dictionary):
        full, two = make(x, 6), make(x, 2)
        with torch.no_grad():
            torch.testing.assert_close(full(x), x, atol=1e-4, rtol=1e-4)
            assert torch.equal((two.encode(x) > 0).sum(-1), torch.full((500,), 2))
    # neurons: the two coordinates of x - mean largest in magnitude, exactly
    neu = neuron_topk_dictionary(x, 2)
    centred = x - x.mean(0)
    keep = centred.abs().topk(2, dim=-1).indices
    expected = x.mean(0) + torch.zeros_like(x).scatter(-1, keep, centred.gather(-1, keep))
    with torch.no_grad():
        torch.testing.assert_close(neu(x), expected, atol=1e-5, rtol=1e-5)


def test_evaluate_dictionary_reports_every_class_and_fidelity(bundled):
    site = "blocks.3.hook_resid_post"
    table = evaluate_dictionary(bundled, identity_dictionary(384, site=site), TEXTS)
    rec = table[table.section == "reconstruction"]
    assert {"all", "word", "punct", "continuation"} <= set(rec.token_class)
    assert "special" not in set(rec.token_class)  # left out by default
    ev = rec[(rec.metric == "explained_variance") & (rec.token_class == "all")]["value"].iloc[0]
    assert ev == pytest.approx(1.0, abs=1e-6)
    assert (table.section == "fidelity").any()
