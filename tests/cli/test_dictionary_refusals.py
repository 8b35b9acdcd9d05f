"""Issue 39 items 5-10: `sae train` / `sae eval` / `explore --dictionary` refuse bad options and foreign dictionaries
in one line (exit 2, nothing written, before any work), honour --eval-corpus, say when scores are in-sample, refuse to
replace a finished folder with other settings, write files 0644, and name a train folder's site sub-folders."""

from __future__ import annotations

import json
import os
import stat

import pytest
import transformers
from bertscope.experiments.cli import main
from helpers import save_tiny_bert

SITE = "blocks.0.hook_resid_post"
TRAIN = ["--site", SITE, "--k", "4", "--width", "2x", "--tokens", "1k", "--train-batch", "128", "--buffer", "512",
         "--max-sentences", "40", "--no-controls"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Tiny models: ``tiny`` (masked LM, seed 0), ``other`` (the same shapes, seed 1: another model of equal width),
    ``wide`` (hidden 48), ``plain`` (no masked-LM head)."""
    root = tmp_path_factory.mktemp("refusal_models")
    out = {}
    for name, cls, kw in (("tiny", transformers.BertForMaskedLM, {}), ("other", transformers.BertForMaskedLM,
                                                                        {"seed": 1}),
                          ("wide", transformers.BertForMaskedLM, {"hidden_size": 48}),
                          ("plain", transformers.BertModel, {})):
        save_tiny_bert(root / name, cls, **kw)
        out[name] = root / name
    return out


@pytest.fixture(scope="module")
def trained(models, tmp_path_factory):
    out = tmp_path_factory.mktemp("trained") / "sae"
    assert main(["sae", "train", "--model", str(models["tiny"]), "--out", str(out), "--quiet", *TRAIN]) == 0
    return out


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("extra,message", [
    (["--lr", "-1"], "--lr must be > 0"),
    (["--lr", "nan"], "--lr must be a finite number"),
    (["--lr", "0"], "--lr must be > 0"),
    (["--buffer", "10"], "--buffer 10 must hold at least two training batches"),
    (["--arch", "relu", "--l1", "-3"], "--l1 must be >= 0"),
    (["--arch", "jumprelu", "--l0", "inf"], "--l0 must be a finite number"),
    (["--e2e-steps", "2", "--e2e-lr", "-1"], "--e2e-lr must be > 0"),
    (["--e2e-steps", "2", "--e2e-lambda", "nan"], "--e2e-lambda (the FVU's mse_coefficient) must be a finite number"),
    (["--kind", "transcoder", "--arch", "topk"], "SAELens's format has no topk transcoder"),
    (["--tokens", "100"], "fewer than one training batch"),
])
def test_bad_train_options_are_refused_in_one_line_before_the_model_loads(models, tmp_path, capsys, monkeypatch,
                                                                         extra, message):
    import bertscope.experiments.options as options

    def no_model(*a, **k):
        raise AssertionError("the model was loaded before the options were checked")

    monkeypatch.setattr(options, "prepare_inputs", no_model)
    out = tmp_path / "sae"
    rc = main(["sae", "train", "--model", str(models["tiny"]), "--out", str(out), "--quiet", *TRAIN, *extra])
    err = _one_line(capsys)
    assert rc == 2 and message in err, err
    assert not out.exists()


@pytest.mark.parametrize("model,extra,message", [
    ("other", [], "was trained on another model"),
    ("wide", [], "is 32 wide; this model's is 48"),
    ("plain", ["--objective", "mlm"], "has no masked-LM head"),
])
def test_eval_refuses_a_foreign_dictionary_or_a_missing_head_in_one_line(models, trained, tmp_path, capsys, model,
                                                                         extra, message):
    ev = tmp_path / "eval"
    rc = main(["sae", "eval", str(trained), "--model", str(models[model]), "--max-sentences", "10", "--out", str(ev),
               "--quiet", *extra])
    err = _one_line(capsys)
    assert rc == 2 and message in err, err
    assert not ev.exists()


def test_train_records_the_model_weights_and_explore_refuses_another_model(models, trained, tmp_path, capsys):
    from bertscope.models import load

    cfg = json.loads((trained / SITE / "cfg.json").read_text())
    assert cfg["metadata"]["bertscope"]["weights_sha256"] == load(str(models["tiny"])).weights_sha256
    page = tmp_path / "page.html"
    rc = main(["explore", "a small test sentence", "--model", str(models["other"]), "--dictionary",
               str(trained / SITE), "--latent", "0", "--out", str(page)])
    err = _one_line(capsys)
    assert rc == 2 and "was trained on another model" in err, err
    assert not page.exists()


def test_explore_given_the_train_folder_names_its_site_sub_folders(models, trained, tmp_path, capsys):
    page = tmp_path / "page.html"
    rc = main(["explore", "a small test sentence", "--model", str(models["tiny"]), "--dictionary", str(trained),
               "--latent", "0", "--out", str(page)])
    err = _one_line(capsys)
    assert rc == 2 and str(trained / SITE) in err and "sub-folders" in err, err
    assert not page.exists()


def test_saved_files_are_world_readable_like_cfg_json(trained):
    mask = os.umask(0)
    os.umask(mask)
    for name in ("cfg.json", "sae_weights.safetensors"):
        mode = stat.S_IMODE((trained / SITE / name).stat().st_mode)
        assert mode == 0o666 & ~mask, (name, oct(mode))


def test_eval_honours_eval_corpus_and_says_when_scores_are_in_sample(models, trained, tmp_path, capsys):
    held = tmp_path / "held.txt"
    held.write_text("The quiet river ran past the old mill .\nA red kite hung above the green field .\n"
                    "Three small boats waited by the stone harbour wall .\n")
    ev = tmp_path / "eval"
    rc = main(["sae", "eval", str(trained), "--model", str(models["tiny"]), "--eval-corpus", str(held),
               "--out", str(ev), "--quiet", "--objective", "sentence"])
    assert rc == 0
    assert "in-sample" not in capsys.readouterr().err
    notes = json.loads((ev / "manifest.json").read_text())["notes"]
    assert notes["scored_on"] == "--eval-corpus" and notes["sentences"] == 3 and notes["in_sample"] == "no"
    ev2 = tmp_path / "eval2"
    rc = main(["sae", "eval", str(trained), "--model", str(models["tiny"]), "--max-sentences", "10",
               "--out", str(ev2), "--quiet", "--objective", "sentence"])
    assert rc == 0
    assert "in-sample" in capsys.readouterr().err
    manifest = json.loads((ev2 / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["notes"]["in_sample"] == "yes"
    assert {o["path"] for o in manifest["outputs"]} >= {"summary.csv", "evaluation.csv"}


def test_a_finished_folder_is_complete_with_the_same_settings_and_refused_with_others(models, tmp_path, capsys):
    out = tmp_path / "sae"
    # a buffer that holds the corpus: trained in memory for several epochs (cfg.json's metadata.epochs)
    argv = ["sae", "train", "--model", str(models["tiny"]), "--out", str(out), *TRAIN, "--buffer", "65536"]
    assert main(argv) == 0
    said = capsys.readouterr()
    cfg = json.loads((out / SITE / "cfg.json").read_text())
    epochs = cfg["metadata"]["bertscope"]["epochs"]
    assert epochs > 1
    assert f"{epochs:.2f} epochs" in said.out, said.out  # the summary says what cfg.json says
    assert "training 896 tokens (7 batches)" in said.err, said.err  # --tokens 1k: whole batches, said so
    weights = out / SITE / "sae_weights.safetensors"
    before = weights.stat().st_mtime_ns
    assert main(argv) == 0
    assert "already complete" in capsys.readouterr().out
    assert weights.stat().st_mtime_ns == before
    rc = main([*argv, "--lr", "1e-3"])
    err = _one_line(capsys)
    assert rc == 2 and "--force" in err and "other settings" in err, err
    assert weights.stat().st_mtime_ns == before
    assert main([*argv, "--lr", "1e-3", "--force", "--quiet"]) == 0
    assert json.loads((out / "manifest.json").read_text())["settings"]["lr"] == 1e-3
    assert weights.stat().st_mtime_ns != before
