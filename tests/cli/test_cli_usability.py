"""Issue 27's command-line items: invisible corpus words (27.4), one --max-length bound (27.7), ``--set`` for
experiment settings (27.6), steps caches and ``bertscope clean`` (27.15), fast usage errors (27.16)."""

from __future__ import annotations

from pathlib import Path

import pytest
from bertscope.experiments import cli
from test_cli import fake as fake  # noqa: F401 (the fake experiment's fixture)
from test_cli import run_args


def bertscope(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    """Run the CLI in-process; returns (exit status, stdout, stderr)."""
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def test_zero_width_corpus_line_is_one_line_exit_2_nothing_written(capsys, tmp_path: Path, tiny_model_dir: Path):
    """27.4: `printf 'ok line\\n\\u200b\\u200b\\n' > zw.txt; bertscope run mixing --corpus zw.txt` ended in a
    traceback inside the experiment; now the reader stops it with file:line before anything is written."""
    corpus = tmp_path / "zw.txt"
    corpus.write_text("ok line\n\u200b\u200b\n", encoding="utf-8")
    out = tmp_path / "o"
    code, _, err = bertscope(capsys, "run", "mixing", "--corpus", corpus, "--model", tiny_model_dir, "--out", out)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and f"{corpus}:2:" in err and "invisible" in err
    assert not out.exists()


@pytest.mark.parametrize("command", ["run", "capture"])
def test_max_length_has_one_bound_and_one_message(capsys, tmp_path: Path, tiny_model_dir: Path, command: str):
    """27.7: `--max-length 0` said "must be >= 1", then `--max-length 1` said "must be >= 2" and 2 a third thing;
    every value below the model's minimum now gets the same sentence with the same bound."""
    messages = set()
    for value in ("-1", "0", "1", "2"):
        out = tmp_path / f"o{value}"
        extra = ["--hooks", "embed.hook_out"] if command == "capture" else ["same-token"]
        code, _, err = bertscope(capsys, command, *extra, "--model", tiny_model_dir, "--max-length", value,
                                 "--out", out)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert f"--max-length {value} is too small" in err and not out.exists()
        messages.add(err.replace(f"--max-length {value} ", "--max-length N "))
    assert len(messages) == 1, messages
    assert "at least 3" in messages.pop()


def test_explore_max_length_uses_the_same_bound(capsys, tmp_path: Path, tiny_model_dir: Path):
    """27.7 for `bertscope explore`: the same sentence as `run` for values below the model's minimum."""
    for value in ("0", "2"):
        code, _, err = bertscope(capsys, "explore", "a text", "--model", tiny_model_dir, "--max-length", value,
                                 "--out", tmp_path / "e.html")
        assert code == 2 and f"--max-length {value} is too small" in err and "at least 3" in err, err


# ------------------------------------------------------------------------------------------ --set (27.6)


def test_set_changes_a_setting_records_it_and_is_part_of_what_a_rerun_matches(capsys, tmp_path, tiny_model_dir,
                                                                               fake):
    """27.6: `--set NAME.FIELD=VALUE` reaches the experiment typed, is recorded in the manifest (settings and
    options) and in the fingerprint and step keys: the same --set skips, another one (or none) recomputes."""
    import json

    out = tmp_path / "out"
    keep = ("--keep-steps", "yes")
    assert cli.main(run_args(tiny_model_dir, out, "--set", "fake.scale=3", *keep)) == 0  # run() asserts lengths * 3
    manifest = json.loads((out / "fake" / "manifest.json").read_text())
    assert manifest["settings"]["scale"] == 3 and manifest["options"]["settings"] == {"fake": {"scale": 3}}
    assert manifest["fingerprint"]["settings"] == {"scale": 3}
    steps_with_3 = {p.name for p in (out / "fake" / "steps").iterdir()}
    capsys.readouterr()
    assert cli.main(run_args(tiny_model_dir, out, "--set", "fake.scale=3")) == 0
    assert "skipped" in capsys.readouterr().out and fake.runs == 1
    assert cli.main(run_args(tiny_model_dir, out, *keep)) == 0  # back to the default: recomputed, not skipped
    assert fake.runs == 2
    manifest = json.loads((out / "fake" / "manifest.json").read_text())
    assert manifest["settings"]["scale"] == 1 and "settings" not in manifest["fingerprint"]
    assert {p.name for p in (out / "fake" / "steps").iterdir()}.isdisjoint(steps_with_3 - {
        p for p in steps_with_3 if p.startswith("row_sums")})  # the scaled step has another key


@pytest.mark.parametrize(("item", "said"), [
    ("fake.nope=1", "fake has no setting 'nope'"),
    ("fake.scal=1", "did you mean fake.scale"),
    ("fake.scale=abc", "expected int, got 'abc'"),
    ("fake.scale=1.5", "expected int"),
    ("nothere.scale=1", "unknown experiment 'nothere'"),
    ("fakescale=1", "expected NAME.FIELD=VALUE"),
    ("fake.scale", "expected NAME.FIELD=VALUE"),
])
def test_bad_set_is_one_line_exit_2_nothing_written(capsys, tmp_path, tiny_model_dir, fake, item, said):
    out = tmp_path / "out"
    code, _, err = bertscope(capsys, *run_args(tiny_model_dir, out, "--set", item))
    assert code == 2 and len(err.strip().splitlines()) == 1 and said in err, err
    assert not out.exists() and fake.runs == 0


def test_set_values_are_rejected_by_the_experiments_own_checks_before_the_model_loads(capsys, tmp_path,
                                                                                     monkeypatch):
    from bertscope.experiments import options

    def no_model(*a, **k):
        raise AssertionError("the model was loaded before --set was checked")

    monkeypatch.setattr(options, "prepare_inputs", no_model)
    for item, said in [("positions.window_len=2", "window_len must be >= 4"),
                       ("structure.sublayers=resid_post", "sublayers must be"),
                       ("heads.syntax_min_arcs=5", "does not run heads")]:
        code, _, err = bertscope(capsys, "run", "positions" if "positions" in item else "structure", "--set", item,
                                 "--out", tmp_path / "o")
        assert code == 2 and len(err.strip().splitlines()) == 1 and said in err, err
    assert not (tmp_path / "o").exists()


def test_set_types_follow_the_annotations():
    from bertscope.experiments.settings import coerce

    assert coerce("5", int) == 5 and coerce("0.5", float) == 0.5 and coerce("1e-3", float) == 1e-3
    assert coerce("none", int | None) is None and coerce("4", int | None) == 4
    assert coerce("true", bool) is True and coerce("no", bool) is False
    assert coerce("attention,alti", tuple[str, ...]) == ("attention", "alti")
    assert coerce("1e-3, 0.1", tuple[float, ...]) == (1e-3, 0.1) and coerce("", tuple[int, ...]) == ()
    assert coerce("false", bool | tuple[str, ...]) is False
    assert coerce("attn_out,resid_mid", bool | tuple[str, ...]) == ("attn_out", "resid_mid")
    with pytest.raises(ValueError, match="expected int or none"):
        coerce("x", int | None)
    with pytest.raises(ValueError, match="expected comma-separated int"):
        coerce("1,b", tuple[int, ...])


@pytest.mark.parametrize("name", ["same-token", "heads", "positions", "mixing", "structure"])
def test_run_name_help_lists_every_setting_with_its_default_and_meaning(capsys, name):
    """27.6: `bertscope run NAME --help` lists each Settings field with its default and a meaning (read from the
    field's comment; every field has one)."""
    import dataclasses

    from bertscope.experiments.registry import load_experiment
    from bertscope.experiments.settings import describe_settings

    settings_cls = type(load_experiment(name).Settings())
    described = describe_settings(settings_cls)
    assert [d.name for d in described] == [f.name for f in dataclasses.fields(settings_cls)]
    assert [d.name for d in described if not d.meaning] == []
    with pytest.raises(SystemExit):
        cli.main(["run", name, "--help"])
    text = capsys.readouterr().out
    for d in described:
        default = ",".join(map(str, d.default)) if isinstance(d.default, tuple) else str(d.default)
        assert f"{name}.{d.name}={default}" in text


# ------------------------------------------------------------------------------- steps caches (27.15)


def test_steps_are_dropped_once_complete_unless_kept_and_clean_drops_them(capsys, tmp_path, tiny_model_dir, fake):
    """27.15: results/ grew by every experiment's steps/ cache, which a complete run never reads again. Now it is
    deleted when the experiment completes (--keep-steps yes keeps it), and `bertscope clean OUT` deletes what is
    left (an interrupted run's steps, *.partial files) and leaves tables, figures and manifests."""
    out = tmp_path / "out"
    assert cli.main(run_args(tiny_model_dir, out)) == 0
    d = out / "fake"
    assert (d / "manifest.json").is_file() and (d / "results.parquet").is_file() and not (d / "steps").exists()

    kept = tmp_path / "kept"
    assert cli.main(run_args(tiny_model_dir, kept, "--keep-steps", "yes")) == 0
    steps = sorted(p.name for p in (kept / "fake" / "steps").iterdir())
    assert len(steps) == 2
    (kept / "fake" / "x.csv.partial").write_text("half")
    capsys.readouterr()
    code, said, _ = bertscope(capsys, "clean", kept, "--dry-run")
    assert code == 0 and "3 file(s)" in said and "would free" in said and (kept / "fake" / "steps").is_dir()
    outputs_before = sorted(p.name for p in (kept / "fake").iterdir() if p.is_file() and "partial" not in p.name)
    code, said, _ = bertscope(capsys, "clean", kept)
    assert code == 0 and "3 file(s)" in said and not (kept / "fake" / "steps").exists()
    assert sorted(p.name for p in (kept / "fake").iterdir()) == outputs_before
    code, said, _ = bertscope(capsys, "run", "all", "--model", tiny_model_dir, "--max-sentences", "12", "--out", kept,
                              "--device", "cpu", "--quiet")  # still complete: skipped, nothing recomputed
    assert code == 0 and "skipped" in said and fake.runs == 2


def test_clean_leaves_a_running_experiment_alone_and_refuses_a_missing_folder(capsys, tmp_path):
    import json

    running = tmp_path / "r" / "heads"
    (running / "steps").mkdir(parents=True)
    (running / "steps" / "a.npz").write_bytes(b"x" * 10)
    (running / "manifest.json").write_text(json.dumps({"experiment": "heads", "status": "running"}))
    code, said, _ = bertscope(capsys, "clean", tmp_path / "r")
    assert code == 0 and "heads" in said and "kept" in said and (running / "steps" / "a.npz").is_file()
    code, _, err = bertscope(capsys, "clean", tmp_path / "nope")
    assert code == 2 and "not a folder" in err


# --------------------------------------------------------------------------- fast usage errors (27.16)


@pytest.mark.parametrize("args", [
    ["run", "heads", "--max-sentences", "0"],
    ["run", "nope"],
    ["run", "heads", "--corpus", "no/such/file.txt"],
    ["run", "heads", "--device", "tpu"],
    ["run", "heads", "--set", "heads"],
    ["run", "heads", "--set", "positions.window_len=8"],
    ["capture", "--hooks", "x", "--corpus", "nope"],
    ["report", "/no/such/folder"],
    ["clean", "/no/such/folder"],
])
def test_usage_errors_answer_before_torch_is_imported(args, tmp_path):
    """27.16: every CLI error cost 1.4-4.5 s because `import bertscope` imported torch before the arguments were
    looked at. These usage errors now exit 2 with torch never imported (the time is the interpreter's)."""
    import subprocess
    import sys

    code = ("import sys\nfrom bertscope.experiments.cli import main\n"
            f"try:\n    status = main({args!r})\nexcept SystemExit as e:\n    status = e.code\n"
            "print(status, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.stdout.split() == ["2", "False"], (done.stdout, done.stderr)
    assert len(done.stderr.strip().splitlines()) <= 1 or done.stderr.startswith("usage:"), done.stderr


def test_corpus_spellings_match_the_corpus_package():
    from bertscope.experiments import corpus
    from bertscope.experiments.options import CORPUS_SPELLINGS

    assert CORPUS_SPELLINGS == corpus.CORPUS_NAMES
