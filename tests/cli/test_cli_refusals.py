"""Inputs an experiment cannot use (issue 27 items 2 and 3): asked for alone, the experiment refuses up front
with one line and exit 2 and writes nothing; in ``run all`` it is skipped with one line saying why and the rest
finish with exit 0. One framework exception carries every such refusal (`registry.CannotRun`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from bertscope.experiments import cli, registry
from bertscope.experiments.options import Inputs, RunOptions, prepare_inputs
from bertscope.experiments.registry import CannotRun
from bertscope.experiments.runner import run_experiment
from test_cli import FakeExperiment, bertscope


@pytest.fixture
def plain_text(tmp_path: Path) -> Path:
    path = tmp_path / "my.txt"
    path.write_text("The cat sat on the mat.\nA dog ran home quickly.\nBirds sing.\nIt rained all day.\n"
                    "We left early.\nShe reads books.\nThey walked to the old station together.\n")  # fmt: skip
    return path


def _args(model: Path, corpus: Path, out: Path, name: str = "all") -> list[str]:
    return ["run", name, "--model", str(model), "--corpus", str(corpus), "--out", str(out), "--device", "cpu",
            "--quiet", "--no-report"]  # fmt: skip


def test_structure_alone_on_a_corpus_without_trees_refuses_up_front_and_writes_nothing(
    capsys: pytest.CaptureFixture[str], tiny_model_dir: Path, plain_text: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    code, stdout, err = bertscope(capsys, *_args(tiny_model_dir, plain_text, out, "structure"))
    assert code == 2
    assert err.strip().splitlines() == [
        "bertscope: error: structure: needs gold dependency trees, and corpus 'my' has none; use --corpus "
        "builtin or a .conllu file"]  # fmt: skip
    assert "Traceback" not in err + stdout
    assert not out.exists()  # no failed manifest, no folder


def test_run_all_skips_what_the_corpus_cannot_feed_and_finishes_the_rest(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path, plain_text: Path,
    tmp_path: Path,
) -> None:  # fmt: skip
    """Registry = {fake (runs on any text), structure (needs trees)}: exit 0, one line for structure."""
    fake = FakeExperiment()
    monkeypatch.setitem(sys.modules, fake.module.__name__, fake.module)
    for name in list(registry.EXPERIMENTS):
        if name != "structure":
            monkeypatch.delitem(registry.EXPERIMENTS, name)
    monkeypatch.setitem(registry.EXPERIMENTS, "fake", fake.module.__name__)
    out = tmp_path / "out"
    code, stdout, err = bertscope(capsys, *_args(tiny_model_dir, plain_text, out))
    assert code == 0, err
    assert "Traceback" not in err + stdout
    assert [line for line in err.splitlines() if "structure" in line] == [
        "bertscope: skipped structure: needs gold dependency trees, and corpus 'my' has none; use --corpus "
        "builtin or a .conllu file"]  # fmt: skip
    assert "structure    skipped: needs gold dependency trees" in stdout
    assert fake.runs == 1 and (out / "fake" / "manifest.json").is_file()
    assert not (out / "structure").exists()


def test_positions_on_a_small_corpus_refuses_up_front_naming_options_that_exist(
    capsys: pytest.CaptureFixture[str], tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Before: a traceback from deep in the run ("fewer than 2 windows of 32; use ... a smaller window length",
    which no option sets). Now: one line, exit 2, before any work; the options it names exist."""
    small = tmp_path / "small.txt"
    small.write_text("The cat sat on the mat.\nA dog ran home.\n")
    out = tmp_path / "out"
    code, stdout, err = bertscope(capsys, *_args(tiny_model_dir, small, out, "positions"))
    assert code == 2
    (line,) = err.strip().splitlines()
    assert line.startswith("bertscope: error: positions: needs at least 48 word pieces of text")
    assert "corpus 'small' has" in line and "--corpus" in line and "--max-sentences" in line
    parser_help = cli.build_parser().parse_args(["run", "positions"])  # the options it names exist
    assert hasattr(parser_help, "corpus") and hasattr(parser_help, "max_sentences")
    assert not out.exists()


def test_same_token_needs_four_sentences_and_says_so_before_any_forward(
    capsys: pytest.CaptureFixture[str], tiny_model_dir: Path, tmp_path: Path
) -> None:
    small = tmp_path / "three.txt"
    small.write_text("The cat sat.\nA dog ran.\nBirds sing.\n")
    out = tmp_path / "out"
    code, _, err = bertscope(capsys, *_args(tiny_model_dir, small, out, "same-token"))
    assert code == 2 and "same-token: needs at least 4 sentences" in err and "--max-sentences" in err
    assert not out.exists()


def test_a_refusal_found_inside_run_is_said_the_same_way_and_leaves_no_manifest(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """An experiment that finds the problem only while running raises the same `CannotRun`: status
    ``refused``, the one-line reason, no manifest left behind."""
    fake = FakeExperiment()

    def run(ctx, settings=None):
        raise CannotRun("needs something this corpus lacks; use --corpus builtin")

    fake.module.run = run
    options = RunOptions(model=str(tiny_model_dir), max_sentences=4, out=tmp_path / "out", quiet=True)
    inputs: Inputs = prepare_inputs(options)
    result = run_experiment(fake.module, options, inputs)
    assert result.status == "refused" and result.error == "needs something this corpus lacks; use --corpus builtin"
    assert not (tmp_path / "out" / "fake" / "manifest.json").exists()


def test_positions_plan_matches_the_windows_it_cuts() -> None:
    """`plan_windows` halves the window for a short stream, keeps the default one for a long stream, and
    refuses (None) a stream too short even for windows of 4."""
    from bertscope.experiments.positions import Settings
    from bertscope.experiments.positions.experiment import plan_windows

    s = Settings()
    assert plan_windows(100_000, s) == (32, 176, 48)
    assert plan_windows(60, s) == (4, 15, 6)
    assert plan_windows(47, s) is None


def test_plain_text_run_all_skips_structure_and_erasure_up_front_and_exits_0(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path, plain_text: Path,
    tmp_path: Path,
) -> None:  # fmt: skip
    """Issue 39 item 2: erasure on plain text ended in a traceback (`nothing to encode`) with a failed manifest,
    so ``run all --corpus my.txt`` exited 1. Now erasure checks up front like structure: both are skipped with one
    line each, no folder of theirs is written, and the run exits 0. (The fake experiment stands in for the six
    that run on any text; `run all` of all eight on plain text takes minutes.)"""
    fake = FakeExperiment()
    monkeypatch.setitem(sys.modules, fake.module.__name__, fake.module)
    for name in list(registry.EXPERIMENTS):
        if name not in ("structure", "erasure"):
            monkeypatch.delitem(registry.EXPERIMENTS, name)
    monkeypatch.setitem(registry.EXPERIMENTS, "fake", fake.module.__name__)
    out = tmp_path / "out"
    code, stdout, err = bertscope(capsys, *_args(tiny_model_dir, plain_text, out))
    assert code == 0, err
    assert "Traceback" not in err + stdout
    assert [line for line in err.splitlines() if "erasure" in line] == [
        "bertscope: skipped erasure: needs sentences with gold dependency trees and UPOS (6 at least), and --corpus "
        "'my' has no gold dependency trees and UPOS; use --corpus builtin or a .conllu file"]  # fmt: skip
    assert "erasure      skipped: needs sentences with gold dependency trees" in stdout
    assert "structure    skipped: needs gold dependency trees" in stdout
    assert fake.runs == 1 and not (out / "erasure").exists() and not (out / "structure").exists()


def test_erasure_alone_on_plain_text_refuses_in_one_line(
    capsys: pytest.CaptureFixture[str], tiny_model_dir: Path, plain_text: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    code, stdout, err = bertscope(capsys, *_args(tiny_model_dir, plain_text, out, "erasure"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "erasure: needs sentences with gold" in err
    assert "Traceback" not in err + stdout and not out.exists()


def _url_corpus(path: Path) -> Path:
    """14 builtin sentences with gold trees and, among them, a one-word sentence that is a long URL (as UD EWT
    test holds): 295 word pieces, more than --max-length 128 leaves room for."""
    import dataclasses

    from bertscope.experiments.corpus import Sentence, load_corpus, write_conllu

    corpus = load_corpus("builtin", max_sentences=14, seed=0)
    url = "https://example.org/" + "/".join(f"segment{i:02d}-with-words" for i in range(40))
    long = Sentence(id="url-1", words=(url,), text=url, upos=("X",), heads=(0,), deprels=("root",))
    return write_conllu(dataclasses.replace(corpus, sentences=[*corpus.sentences[:7], long, *corpus.sentences[7:]]),
                        path)


def test_a_sentence_no_experiment_can_encode_is_skipped_counted_and_said_once(
    capsys: pytest.CaptureFixture[str], tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Issue 39 item 3: a one-word sentence longer than --max-length allows (a URL) ended `run structure` in a
    traceback (`max_length=128 leaves no room for even its first word`). Now it is left out of the corpus every
    command loads, counted, named in one warning line and in the manifest's corpus entry."""
    import json

    corpus = _url_corpus(tmp_path / "url.conllu")
    out = tmp_path / "out"
    code, stdout, err = bertscope(capsys, "run", "structure", "--model", tiny_model_dir, "--corpus", corpus, "--out",
                                  out, "--device", "cpu", "--quiet", "--no-report", "--set", "structure.n_boot=20",
                                  "--set", "structure.random_weights=false", "--set", "structure.ranks=1", "--set",
                                  "structure.max_epochs=2", "--set", "structure.sublayers=false", "--set",
                                  "structure.workers=1")  # fmt: skip
    assert code == 0, err
    assert "Traceback" not in err + stdout
    assert err.strip().splitlines() == [
        "bertscope: warning: --corpus url: skipped 1 of 15 sentence(s) that cannot be encoded at --max-length 128 "
        "(e.g. 'url-1': its first word is 295 word pieces, more than max_length=128 leaves room for); raise "
        "--max-length to keep them"]  # fmt: skip
    manifest = json.loads((out / "structure" / "manifest.json").read_text())
    assert manifest["status"] == "complete"
    assert manifest["corpus"]["n_sentences"] == 14 and manifest["corpus"]["n_skipped_unencodable"] == 1
    assert list(manifest["corpus"]["skipped_unencodable"]) == ["url-1"]


def test_unencodable_names_each_sentence_and_why(tokenizer) -> None:
    from bertscope.experiments.corpus import Sentence, encode, unencodable

    ok = Sentence(id="ok", words=("The", "cat", "sat", "on", "the", "mat"), text="The cat sat on the mat")
    url = Sentence(id="url", words=("http://" + "x-y" * 9,), text="")
    found = unencodable([ok, url], tokenizer, max_length=4)
    assert list(found) == ["url"] and "first word is" in found["url"] and "max_length=4" in found["url"]
    assert unencodable([ok, url], tokenizer, max_length=64) == {}
    with pytest.warns(UserWarning, match="cut at a word boundary"):  # what is left encodes (truncated)
        assert encode([ok], tokenizer, max_length=4).n_sequences == 1
