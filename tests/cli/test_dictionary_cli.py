"""`bertscope sae train` / `sae eval` on a tiny masked LM: folders in SAELens's format, controls, evaluation
tables, and one-line exit-2 errors that write nothing."""

from __future__ import annotations

import json

import pytest
import transformers
from bertscope.experiments.cli import main
from bertscope.probes.dictionary import load_dictionary
from helpers import save_tiny_bert

SMALL = ["--train-batch", "128", "--buffer", "512", "--max-sentences", "40", "--quiet"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_mlm_cli")
    save_tiny_bert(folder, transformers.BertForMaskedLM)
    return folder


def test_train_then_eval(tiny, tmp_path, capsys):
    out = tmp_path / "sae"
    rc = main(["sae", "train", "--model", str(tiny), "--site", "blocks.0.hook_resid_post", "--arch", "topk",
               "--k", "4", "--width", "2x", "--tokens", "1k", "--out", str(out), *SMALL])
    assert rc == 0
    d = load_dictionary(out / "blocks.0.hook_resid_post")
    assert d.config.d_sae == 64 and d.config.k == 4 and d.config.metadata["tokens_trained"] == 1000 // 128 * 128
    assert json.loads((out / "blocks.0.hook_resid_post" / "cfg.json").read_text())["architecture"] == "topk"
    assert (out / "controls" / "pca-blocks.0.hook_resid_post" / "cfg.json").exists()
    assert not (out / "checkpoint.pt").exists()
    ev = tmp_path / "eval"
    rc = main(["sae", "eval", str(out), "--model", str(tiny), "--max-sentences", "10", "--seed", "1",
               "--out", str(ev), "--quiet"])
    assert rc == 0
    import pandas as pd

    summary = pd.read_csv(ev / "summary.csv")
    assert set(summary.dictionary) == {"blocks.0.hook_resid_post", "controls/pca-blocks.0.hook_resid_post",
                                       "controls/neurons-blocks.0.hook_resid_post"}
    assert (summary.l0 == 4).all()
    table = pd.read_parquet(ev / "evaluation.parquet")
    assert {"reconstruction", "fidelity"} == set(table.section)


@pytest.mark.parametrize("extra,message", [
    (["--site", "blocks.7.hook_resid_post"], "no site"),
    (["--site", "blocks.0.hook_resid_post", "--k", "64", "--width", "2x"], "must be smaller than the width"),
    (["--site", "blocks.0.hook_resid_post", "--tokens", "100"], "fewer than one training batch"),
    (["--site", "blocks.0.hook_resid_post", "--max-sentences", "2"], "usable tokens"),
    (["--site", "blocks.0.hook_resid_post", "--activations", "NOWHERE"], "--activations"),
])
def test_train_errors_are_one_line_and_write_nothing(tiny, tmp_path, capsys, extra, message):
    out = tmp_path / "sae"
    rc = main(["sae", "train", "--model", str(tiny), "--out", str(out), "--train-batch", "128", "--quiet", *extra])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and message in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def test_eval_of_a_folder_that_is_not_a_dictionary(tiny, tmp_path, capsys):
    (tmp_path / "junk").mkdir()
    rc = main(["sae", "eval", str(tmp_path / "junk"), "--model", str(tiny), "--out", str(tmp_path / "e")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "is not a dictionary" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "e").exists()


def test_ctrl_c_keeps_the_last_checkpoint_and_a_rerun_resumes(tiny, tmp_path, monkeypatch, capsys):
    import bertscope.experiments.dictionary as sae_module

    out = tmp_path / "sae"
    argv = ["sae", "train", "--model", str(tiny), "--site", "blocks.0.hook_resid_post", "--k", "4", "--width", "2x",
            "--tokens", "1k", "--checkpoint-every", "256", "--no-controls", "--out", str(out), *SMALL]
    real_save = sae_module.save_dictionary

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(sae_module, "save_dictionary", interrupted)
    assert main(argv) == 130
    assert (out / "checkpoint.pt").exists() and not (out / "blocks.0.hook_resid_post").exists()
    monkeypatch.setattr(sae_module, "save_dictionary", real_save)
    assert main(argv) == 0
    assert load_dictionary(out / "blocks.0.hook_resid_post").config.metadata["tokens_trained"] == 896
    assert not (out / "checkpoint.pt").exists()


def test_sae_commands_have_help(capsys):
    for command in (["sae"], ["sae", "train"], ["sae", "eval"]):
        with pytest.raises(SystemExit) as exc:
            main([*command, "--help"])
        assert exc.value.code == 0
        assert "usage: bertscope sae" in capsys.readouterr().out


def test_train_from_a_capture_folder_reads_the_captured_sentences(tiny, tmp_path, capsys):
    cap = tmp_path / "cap"
    assert main(["capture", "--model", str(tiny), "--hooks", "blocks.0.hook_resid_post", "--max-sentences", "40",
                 "--out", str(cap), "--quiet"]) == 0
    out = tmp_path / "sae"
    # no --corpus: the default corpus's sentences that the capture holds (its 40), at the capture's max length
    rc = main(["sae", "train", "--model", str(tiny), "--site", "blocks.0.hook_resid_post", "--activations", str(cap),
               "--k", "4", "--width", "2x", "--tokens", "1k", "--out", str(out), "--train-batch", "128",
               "--buffer", "512", "--quiet", "--no-controls"])
    assert rc == 0, capsys.readouterr().err
    assert load_dictionary(out / "blocks.0.hook_resid_post").config.metadata["tokens_trained"] == 896
    bad = tmp_path / "bad"
    rc = main(["sae", "train", "--model", str(tiny), "--site", "blocks.0.hook_resid_post", "--activations", str(cap),
               "--corpus", "repeated-random", "--out", str(bad), "--train-batch", "128", "--quiet"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "holds none of the sentences" in err and len(err.splitlines()) == 1, err
    assert not bad.exists()
    rc = main(["sae", "train", "--model", str(tiny), "--site", "blocks.0.hook_mlp_out", "--activations", str(cap),
               "--out", str(bad), "--train-batch", "128", "--quiet"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "the capture holds blocks.0.hook_resid_post" in err and len(err.splitlines()) == 1, err
    assert not bad.exists()


def test_transcoder_from_a_block_name_reads_the_mlp_input_and_predicts_its_output(tiny, tmp_path):
    out = tmp_path / "tc"
    rc = main(["sae", "train", "--model", str(tiny), "--site", "blocks.0", "--kind", "transcoder", "--arch", "relu",
               "--width", "2x", "--tokens", "512", "--out", str(out), *SMALL, "--no-controls"])
    assert rc == 0
    d = load_dictionary(out / "blocks.0.hook_resid_mid")
    assert d.config.kind == "transcoder"
    assert (d.config.site, d.config.site_out) == ("blocks.0.hook_resid_mid", "blocks.0.hook_mlp_out")
