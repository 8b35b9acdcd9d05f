"""End-to-end fine-tuning of dictionaries (probes/dictionary/e2e.py, Braun et al. 2024): an exactly reconstructing
dictionary has zero loss and is left unchanged, fine-tuning lowers the spliced objective on held-out sentences,
unit-norm decoders keep their row norms, runs are deterministic, the config records the fine-tune through the
SAELens format, and bad input is refused (library and CLI)."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from bertscope.experiments.cli import main
from bertscope.probes.dictionary import (
    DictionaryConfig,
    E2ESettings,
    TrainSettings,
    collect_activations,
    e2e_loss,
    finetune_e2e,
    identity_dictionary,
    load_dictionary,
    save_dictionary,
    train_dictionaries,
)
from bertscope.probes.dictionary.e2e import e2e_terms, power_of_two_scale
from helpers import corpus_texts, save_tiny_bert

import bertscope

SITE = "blocks.0.hook_resid_post"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_e2e")
    save_tiny_bert(folder, transformers.BertModel, num_hidden_layers=3)
    return bertscope.load(folder)


@pytest.fixture(scope="module")
def tiny_mlm_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_e2e_mlm")
    save_tiny_bert(folder, transformers.BertForMaskedLM)
    return folder


@pytest.fixture(scope="module")
def texts(tiny):
    return corpus_texts(tiny.tokenizer, 200, 12)


@pytest.fixture(scope="module")
def mse_topk(tiny, texts):
    """A TopK SAE trained on MSE at block 0 of the tiny model (the fine-tune's start)."""
    rows = [b.acts[SITE] for b in collect_activations(tiny, texts[:160], [SITE])]
    cfg = DictionaryConfig(d_in=32, d_sae=64, arch="topk", k=4, site=SITE)
    return train_dictionaries(rows, cfg, TrainSettings(tokens=20_000, batch_size=256, lr=3e-3, progress=False))[SITE]


def _same(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_an_exactly_reconstructing_dictionary_has_zero_loss_and_is_not_changed(tiny, texts):
    ident = identity_dictionary(32, site=SITE)
    loss = e2e_loss(tiny, ident, texts[:20], objective="sentence")
    assert loss == {"model": 0.0, "fvu": 0.0, "loss": 0.0}
    tuned = finetune_e2e(tiny, ident, texts[:64], E2ESettings(steps=3, lr=1e-2, progress=False))
    assert _same(ident, tuned)
    assert tuned.config.metadata["e2e"]["first_step"] == {"model": 0.0, "fvu": 0.0, "loss": 0.0}


def test_an_exactly_reconstructing_dictionary_has_zero_mlm_kl_and_is_not_changed(tiny_mlm_folder, texts):
    mlm = bertscope.load(tiny_mlm_folder)
    ident = identity_dictionary(32, site=SITE)
    assert e2e_loss(mlm, ident, texts[:20])["model"] == 0.0  # auto: the MLM objective (the model has a head)
    tuned = finetune_e2e(mlm, ident, texts[:64], E2ESettings(steps=2, lr=1e-2, progress=False))
    assert tuned.config.metadata["e2e"]["objective"] == "mlm"
    assert _same(ident, tuned)


def test_the_sentence_term_is_one_minus_the_cosine_of_pooled_embeddings(tiny, texts, mse_topk):
    batch = tiny.tokenize(texts[:8])
    t = e2e_terms(tiny, mse_topk, batch, objective="sentence", variance=1.0)
    from bertscope.probes.dictionary import splice_fidelity

    table = splice_fidelity(tiny, mse_topk, texts[:8], objective="sentence", batch_size=8)
    cos = table[(table.condition == "dictionary") & (table.metric == "embedding_cosine")]["value"].iloc[0]
    assert float(t["model"].detach()) == pytest.approx(1 - cos, abs=1e-6)


def test_fine_tuning_lowers_the_held_out_spliced_loss_and_keeps_decoder_norms(tiny, texts, mse_topk):
    held = texts[160:]
    before = e2e_loss(tiny, mse_topk, held, objective="sentence")
    settings = E2ESettings(steps=15, lr=2e-3, mse_coefficient=0.1, batch_sentences=16, progress=False)
    tuned = finetune_e2e(tiny, mse_topk, texts[:160], settings)
    after = e2e_loss(tiny, tuned, held, objective="sentence")
    assert after["model"] < before["model"]
    assert after["loss"] < before["loss"]
    torch.testing.assert_close(tuned.W_dec.norm(dim=-1), mse_topk.W_dec.norm(dim=-1), rtol=1e-5, atol=0)
    assert tuned.config.k == mse_topk.config.k and tuned.config.d_sae == mse_topk.config.d_sae
    assert not _same(tuned, mse_topk)
    short = E2ESettings(steps=3, lr=2e-3, batch_sentences=16, progress=False)
    assert _same(finetune_e2e(tiny, mse_topk, texts[:160], short), finetune_e2e(tiny, mse_topk, texts[:160], short))


def test_the_config_records_the_fine_tune_through_the_saelens_format(tiny, texts, mse_topk, tmp_path):
    tuned = finetune_e2e(tiny, mse_topk, texts[:64], E2ESettings(steps=2, mse_coefficient=0.3, progress=False))
    save_dictionary(tuned, tmp_path / "d")
    cfg = json.loads((tmp_path / "d" / "cfg.json").read_text())
    assert cfg["architecture"] == "topk"
    back = load_dictionary(tmp_path / "d")
    rec = back.config.metadata["e2e"]
    assert rec["mse_coefficient"] == 0.3 and rec["steps"] == 2 and rec["objective"] == "sentence"
    assert rec["training_sentences"] == 64 and "Braun" in rec["paper"] and "FVU" in rec["loss"]
    x = torch.randn(10, 32)
    torch.testing.assert_close(back(x), tuned(x))


def test_power_of_two_scale():
    assert power_of_two_scale(16, 1.0) == 4.0
    assert power_of_two_scale(16, 3.0) == 1.0  # sqrt(16) / 3 = 1.33 rounds to 2 ** 0
    assert power_of_two_scale(16, 0.0) == 1.0


@pytest.mark.parametrize("kwargs", [{"mse_coefficient": -1.0}, {"steps": -1}, {"lr": 0.0}, {"objective": "nsp"},
                                    {"batch_sentences": 0}, {"mse_coefficient": float("nan")}])
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        E2ESettings(**kwargs)


def test_bad_inputs_are_refused(tiny, texts, mse_topk):
    with pytest.raises(ValueError, match="masked-LM head"):
        finetune_e2e(tiny, mse_topk, texts[:8], E2ESettings(steps=1, objective="mlm", progress=False))
    with pytest.raises(ValueError, match="training sentences"):
        finetune_e2e(tiny, mse_topk, [], E2ESettings(steps=1, progress=False))
    other = DictionaryConfig(d_in=32, d_sae=64, arch="topk", k=4, site="blocks.9.hook_resid_post")
    from bertscope.probes.dictionary import Dictionary

    with pytest.raises(ValueError, match="lacks"):
        finetune_e2e(tiny, Dictionary(other), texts[:8], E2ESettings(steps=1, progress=False))
    tc = Dictionary(DictionaryConfig(d_in=32, d_sae=64, arch="relu", kind="transcoder", site="blocks.0.hook_resid_mid",
                                     site_out="blocks.0.hook_mlp_out"))
    with pytest.raises(ValueError, match="SAEs"):
        finetune_e2e(tiny, tc, texts[:8], E2ESettings(steps=1, progress=False))


def test_cli_train_with_e2e_steps_records_the_fine_tune(tiny_mlm_folder, tmp_path):
    out = tmp_path / "sae"
    rc = main(["sae", "train", "--model", str(tiny_mlm_folder), "--site", SITE, "--k", "4", "--width", "2x",
               "--tokens", "2k", "--train-batch", "128", "--max-sentences", "60", "--no-controls",
               "--e2e-steps", "2", "--e2e-lambda", "0.5", "--out", str(out), "--quiet"])
    assert rc == 0
    d = load_dictionary(out / SITE)
    rec = d.config.metadata["e2e"]
    assert rec["steps"] == 2 and rec["mse_coefficient"] == 0.5 and rec["objective"] == "mlm"
    assert json.loads((out / "training.json").read_text())["e2e"]["steps"] == 2


@pytest.mark.parametrize("extra, message", [
    (["--e2e-steps", "2", "--e2e-lambda", "-1"], "mse_coefficient"),
    (["--e2e-lambda", "0.5"], "need --e2e-steps"),
    (["--e2e-steps", "2", "--kind", "transcoder", "--arch", "relu", "--site-out", "blocks.0.hook_mlp_out"],
     "transcoder"),
])
def test_cli_bad_e2e_options_are_one_line_and_write_nothing(tiny_mlm_folder, tmp_path, capsys, extra, message):
    out = tmp_path / "sae"
    argv = ["sae", "train", "--model", str(tiny_mlm_folder), "--site", SITE, "--k", "4", "--width", "2x",
            "--tokens", "2k", "--train-batch", "128", "--max-sentences", "60", "--out", str(out), "--quiet", *extra]
    if "--kind" in extra:
        argv[argv.index("--site") + 1] = "blocks.0.hook_resid_mid"
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2 and message in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_fine_tuning_lowers_the_held_out_mlm_kl(tmp_path, texts):
    # weights drawn wider than BERT's 0.02, so the random MLM head's distribution is not nearly uniform (KL ~ 1e-2)
    save_tiny_bert(tmp_path, transformers.BertForMaskedLM, initializer_range=0.2)
    mlm = bertscope.load(tmp_path)
    rows = [b.acts[SITE] for b in collect_activations(mlm, texts[:160], [SITE])]
    cfg = DictionaryConfig(d_in=32, d_sae=64, arch="topk", k=4, site=SITE)
    start = train_dictionaries(rows, cfg, TrainSettings(tokens=20_000, batch_size=256, lr=3e-3, progress=False))[SITE]
    held = texts[160:]
    before = e2e_loss(mlm, start, held, objective="mlm", seed=5)
    tuned = finetune_e2e(mlm, start, texts[:160], E2ESettings(steps=15, lr=2e-3, batch_sentences=16, progress=False))
    after = e2e_loss(mlm, tuned, held, objective="mlm", seed=5)
    assert tuned.config.metadata["e2e"]["objective"] == "mlm"
    assert after["model"] < before["model"]
