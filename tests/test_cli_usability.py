"""Issue 27's command-line items: invisible corpus words (27.4), one --max-length bound (27.7), ``--set`` for
experiment settings (27.6), steps caches and ``bertscope clean`` (27.15), fast usage errors (27.16)."""

from __future__ import annotations

from pathlib import Path

import pytest
from bertscope.experiments import cli


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
