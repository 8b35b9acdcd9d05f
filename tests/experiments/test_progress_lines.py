"""Issue 27.14: long steps report progress in finer units than batches, in a terminal (tqdm) and, as periodic
lines, in a log file."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from bertscope.experiments import cli, context
from bertscope.experiments.context import LineProgress


def test_line_progress_writes_counts_elapsed_and_what_is_left():
    out = io.StringIO()
    bar = LineProgress(None, "[mixing] costly", total=4, every=0, file=out)
    for _ in range(4):
        bar.update(1)
    bar.close()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("[mixing] costly: 1/4 (25%), 0s elapsed, about ")
    assert lines[3].startswith("[mixing] costly: 4/4 (100%)") and lines[-1].endswith("done")
    assert list(LineProgress(range(3), "x", every=3600, file=out)) == [0, 1, 2]  # short loops stay silent
    assert len(out.getvalue().splitlines()) == len(lines)


def test_mixing_costly_pass_reports_each_stage_in_a_log(tiny_model_dir: Path, tmp_path: Path, capsys, monkeypatch):
    """`bertscope run mixing --corpus long.txt --max-length 512` on two sentences printed nothing for 7.5 minutes:
    its bar counted batches and there was one. Now the costly pass counts five stages per batch, and a log file
    (stderr not a terminal) gets lines as they finish."""
    from bertscope.experiments.mixing import plots

    monkeypatch.setattr(plots, "FORMATS", ("png",))
    monkeypatch.setattr(context, "LOG_EVERY_S", 0.0)  # every update is "long enough" here
    corpus = tmp_path / "two.txt"
    corpus.write_text("The cat sat on the mat while the dog slept .\nDogs bark at night .\n")
    code = cli.main(["run", "mixing", "--model", str(tiny_model_dir), "--corpus", str(corpus), "--out",
                     str(tmp_path / "o"), "--device", "cpu", "--no-report", "--set", "mixing.n_boot=10"])
    err = capsys.readouterr().err
    assert code == 0, err
    stages = [line for line in err.splitlines() if "costly methods and faithfulness" in line]
    assert [line.split(": ")[1].split(" ")[0] for line in stages[:5]] == ["1/5", "2/5", "3/5", "4/5", "5/5"], err


@pytest.mark.parametrize("quiet", [True, False])
def test_quiet_runs_print_no_progress(quiet, capsys, monkeypatch):
    from bertscope.experiments.options import RunOptions

    monkeypatch.setattr(context, "LOG_EVERY_S", 0.0)
    ctx = context.Context.__new__(context.Context)
    ctx.name, ctx.options = "x", RunOptions(quiet=quiet)
    bar = ctx.progress(None, "work", total=2)
    bar.update(2)
    bar.close()
    assert ("work: 2/2" in capsys.readouterr().err) is not quiet


def test_heads_importance_pass_counts_every_long_step(tiny_config, tokenizer):
    """The heads experiment's importance step ran its gradient pass and its three pruning passes (the largest
    cost of a run) with no progress at all after the ablation bar: now each reports, item by item, to its total."""
    import numpy as np
    from bertscope.experiments import corpus as corpus_mod
    from bertscope.experiments.heads import experiment as heads_experiment
    from bertscope.experiments.heads import passes

    from bertscope import models

    model = models.random_encoder(tiny_config, seed=0, tokenizer=tokenizer)
    corpus = corpus_mod.load_corpus("builtin", max_sentences=6)
    batches = list(corpus_mod.encode(corpus, tokenizer, batch_size=4).batches)
    settings = heads_experiment.Settings(pruning_points=2, pruning_random_orders=2, methods=("zero",), workers=1)
    seen: dict[str, list[int]] = {}

    def progress(it, desc, total):
        seen[desc] = [0, total]
        for item in it:
            seen[desc][0] += 1
            yield item

    passes.importance_pass(model, batches, settings, seed=0, rng=np.random.default_rng(0), progress=progress)
    assert set(seen) == {"ablation", "gradient importance (batches)", "pruning curves, 2 random orders",
                         "pruning curves, chosen orders on half 1 of 2", "pruning curves, chosen orders on half 2 of 2"}
    assert all(done == total > 0 for done, total in seen.values()), seen
    assert seen["pruning curves, 2 random orders"] == [6, 6] and seen["gradient importance (batches)"] == [2, 2]


def test_structure_word_vectors_report_each_batch(tiny_config, tokenizer):
    """structure's word-vector pass (a forward over every chosen sentence, for the trained and the re-initialised
    model) printed nothing; it now takes a progress wrapper, which the experiment gives (one unit per batch)."""
    from bertscope.experiments import corpus as corpus_mod
    from bertscope.experiments.structure import data as structure_data

    from bertscope import models

    model = models.random_encoder(tiny_config, seed=0, tokenizer=tokenizer)
    sentences = list(corpus_mod.load_corpus("builtin", max_sentences=5))
    encoded = corpus_mod.encode(sentences, tokenizer, batch_size=2)
    counted = []

    def progress(it):
        for batch in it:
            counted.append(len(batch.sentence_index))
            yield batch

    structure_data.collect(model, encoded, ["blocks.0.hook_resid_post"], [len(s) for s in sentences],
                           corpus=sentences, progress=progress)
    assert counted == [2, 2, 1]
