"""Issue 27.14 (mixing): value zeroing's per-layer loop and leave-one-out report progress in fine units, in a
terminal (tqdm, through ``ctx.progress``) and as periodic lines in a log file; before, a long sentence sat silent
inside one stage of the costly pass for minutes."""

from __future__ import annotations

import io
from pathlib import Path

from bertscope.experiments import cli, context
from bertscope.experiments.context import LineProgress
from bertscope.hooks import mixing

from bertscope import models


def test_value_zeroing_and_loo_advance_a_bar_per_layer_and_group(tiny_model_dir: Path):
    model = models.load(tiny_model_dir).eval()
    inputs = model.tokenize(["the cat sat on the mat while the dog slept.", "dogs bark"])
    b, n = inputs["input_ids"].shape
    log = io.StringIO()
    bars: list[LineProgress] = []

    def factory(desc: str, total: int) -> LineProgress:
        bars.append(LineProgress(None, f"[mixing] {desc}", total, every=0, file=log))
        return bars[-1]

    chunk = 2 * b * n  # two zeroed (or left-out) positions per group
    mixing.per_layer_contributions(model, inputs, ["value_zeroing"], chunk_tokens=chunk, progress=factory)
    groups = -(-n // 2)
    (bar,) = bars
    assert bar.total == bar.n == model.config.n_layers * groups
    lines = [line for line in log.getvalue().splitlines() if "value zeroing" in line]
    assert lines[0].startswith(f"[mixing] value zeroing (layers x groups of zeroed tokens): 1/{bar.total} ")
    assert len(lines) >= bar.total  # a line per step here (every=0), and the closing one

    bars.clear()
    mixing.contributions(model, inputs, "loo", chunk_tokens=chunk, progress=factory)
    assert [(x.desc, x.n, x.total) for x in bars] == [("[mixing] leave-one-out (groups of left-out tokens)", groups,
                                                       groups)]  # fmt: skip


def test_the_mixing_log_shows_value_zeroing_steps(tiny_model_dir: Path, tmp_path: Path, capsys, monkeypatch):
    """`bertscope run mixing` into a log file: value zeroing's steps appear as lines of their own."""
    from bertscope.experiments.mixing import plots

    monkeypatch.setattr(plots, "FORMATS", ("png",))
    monkeypatch.setattr(context, "LOG_EVERY_S", 0.0)
    corpus = tmp_path / "one.txt"
    corpus.write_text("The cat sat on the mat while the dog slept .\n")
    code = cli.main(["run", "mixing", "--model", str(tiny_model_dir), "--corpus", str(corpus), "--out",
                     str(tmp_path / "o"), "--device", "cpu", "--no-report", "--set", "mixing.n_boot=10",
                     "--set", "mixing.ig_steps=2", "--set", "mixing.n_examples=0"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 0, err
    zeroing = [line for line in err.splitlines() if "value zeroing (layers x groups" in line]
    loo = [line for line in err.splitlines() if "leave-one-out (groups" in line]
    assert zeroing and loo, err
    assert zeroing[0].split(": ")[1].startswith("1/"), zeroing
