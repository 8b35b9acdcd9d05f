"""The ``bertscope`` CLI end to end on a tiny random BERT: info, run (with a fake experiment plugged into
the registry), reruns and interruptions, manifests, the report page, and one-line errors."""

from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
import json
import sys
import time
import types
from importlib import metadata
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from bertscope.experiments import cli, registry
from bertscope.experiments.context import Context

MAX_SENTENCES = "12"


def bertscope(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run the CLI in-process; returns (exit status, stdout, stderr)."""
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


# ------------------------------------------------------------------------------------------- fake experiment


@dataclasses.dataclass(frozen=True)
class FakeSettings:
    """The fake experiment's settings: ``scale`` multiplies the lengths step (so it changes that step only)."""

    scale: int = 1


class FakeExperiment:
    """A known-answer experiment: every attention row sums to 1, so each (layer, head) value is 1.

    It uses the framework's helpers (encode, progress, step, note, save_figure) and counts its calls so
    tests can see what a rerun recomputes. ``interrupt_after_step`` / ``fail`` simulate Ctrl-C and a bug.
    """

    def __init__(self, name: str = "fake") -> None:
        self.module = types.ModuleType(f"fake_experiment_{name}")
        self.module.NAME = name
        self.module.DIRNAME = name.replace("-", "_")
        self.module.SUMMARY_TABLES = ["per_layer"]
        self.module.Settings = FakeSettings
        self.module.run = self.run
        self.module.plot = self.plot
        self.runs = 0
        self.step_computations = 0
        self.lengths_computations = 0
        self.interrupt_after_step = False
        self.fail = False

    def run(self, ctx: Context, settings: FakeSettings | None = None) -> pd.DataFrame:
        self.runs += 1
        settings = ctx.use_settings(settings)
        sums = ctx.step("row_sums", lambda: self._row_sums(ctx))
        lengths = ctx.step_arrays("lengths", lambda: self._lengths(ctx, settings.scale), scale=settings.scale)
        assert lengths["n_words"].tolist() == [settings.scale * len(s.words) for s in ctx.corpus]
        if self.interrupt_after_step:
            raise KeyboardInterrupt
        if self.fail:
            raise ValueError("planted bug")
        ctx.note("n_sentences_used", len(ctx.corpus))
        per_layer = sums.groupby("layer", as_index=False)["value"].mean()
        ctx.write_table(per_layer, "per_layer")
        return sums

    def _lengths(self, ctx: Context, scale: int) -> dict[str, np.ndarray]:
        self.step_computations += 1
        self.lengths_computations += 1
        return {"n_words": np.array([scale * len(s.words) for s in ctx.corpus])}

    def _row_sums(self, ctx: Context) -> pd.DataFrame:
        self.step_computations += 1
        rows = []
        for batch in ctx.progress(ctx.encode(), desc="batches"):
            _, cache = ctx.model.run_with_cache(
                batch.input_ids, attention_mask=batch.attention_mask, names_filter="blocks.*.attn.hook_pattern"
            )
            real = batch.attention_mask.bool()
            for layer, pattern in enumerate(cache.stack("attn.hook_pattern")):  # [batch, head, q, k]
                sums = pattern.sum(-1)  # [batch, head, q]
                for head in range(sums.shape[1]):
                    rows.append({"layer": layer, "head": head, "value": float(sums[:, head][real].mean())})
        return pd.DataFrame(rows).groupby(["layer", "head"], as_index=False)["value"].mean()

    @staticmethod
    def plot(out_dir: Path) -> list[Path]:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from bertscope.experiments import io

        table = pd.read_parquet(out_dir / "results.parquet")
        fig, ax = plt.subplots(figsize=(3, 2))
        ax.bar(range(len(table)), table["value"])
        return io.save_figure(fig, out_dir / "fig_row_sums")


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeExperiment:
    """Registry = {fake} for the duration of a test."""
    exp = FakeExperiment()
    monkeypatch.setitem(sys.modules, exp.module.__name__, exp.module)
    for name in list(registry.EXPERIMENTS):
        monkeypatch.delitem(registry.EXPERIMENTS, name)
    monkeypatch.setitem(registry.EXPERIMENTS, "fake", exp.module.__name__)
    return exp


def run_args(model: Path, out: Path, *extra: str) -> list[str]:
    return ["run", "all", "--model", str(model), "--max-sentences", MAX_SENTENCES, "--out", str(out),
            "--device", "cpu", "--quiet", *extra]  # fmt: skip


# ----------------------------------------------------------------------------------------------------- info


def test_info_describes_the_tiny_model(capsys: pytest.CaptureFixture[str], tiny_model_dir: Path) -> None:
    from transformers import BertModel

    from bertscope import models

    code, out, err = bertscope(capsys, "info", "--model", tiny_model_dir, "--json")
    assert code == 0, err
    info = json.loads(out)
    assert info["config"]["n_layers"] == 2 and info["config"]["n_heads"] == 4 and info["config"]["d_model"] == 32
    reference = BertModel.from_pretrained(tiny_model_dir)
    assert info["n_parameters"] == sum(p.numel() for p in reference.parameters())
    assert info["weights_sha256"] == hashlib.sha256((tiny_model_dir / "model.safetensors").read_bytes()).hexdigest()
    assert info["hook_names"] == models.load(tiny_model_dir).hook_names()

    code, out, _ = bertscope(capsys, "info", "--model", tiny_model_dir)
    assert code == 0
    assert "layers       2    heads 4    d_model 32" in out
    assert "blocks.{0..1}.attn.hook_pattern" in out
    assert info["weights_sha256"] in out


# ------------------------------------------------------------------------------------------------------ run


def test_run_all_writes_results_figures_manifest_and_report(
    capsys: pytest.CaptureFixture[str], tiny_model_dir: Path, tmp_path: Path, fake: FakeExperiment
) -> None:
    from bertscope.experiments import corpus as corpus_mod

    out = tmp_path / "results"
    code, stdout, err = bertscope(capsys, *run_args(tiny_model_dir, out, "--seed", "3"))
    assert code == 0, err
    assert err == ""  # --quiet: no progress bars, no log lines
    d = out / "fake"

    # the known answer: attention rows sum to 1 for every layer and head
    results = pd.read_parquet(d / "results.parquet")
    assert len(results) == 2 * 4
    assert results["value"].to_numpy() == pytest.approx(1.0, abs=1e-5)
    pd.testing.assert_frame_equal(pd.read_csv(d / "results.csv"), results, check_dtype=False)
    assert (d / "fig_row_sums.png").is_file() and (d / "fig_row_sums.pdf").is_file()

    manifest = json.loads((d / "manifest.json").read_text())
    assert manifest["status"] == "complete"
    assert manifest["model"]["weights_sha256"] == hashlib.sha256(
        (tiny_model_dir / "model.safetensors").read_bytes()
    ).hexdigest()
    expected_corpus = corpus_mod.load_corpus("builtin", max_sentences=int(MAX_SENTENCES), seed=3)
    assert manifest["corpus"]["sha256"] == expected_corpus.sha256
    assert manifest["corpus"]["n_sentences"] == int(MAX_SENTENCES)
    options = dict(manifest["options"])
    assert options.pop("threads") == torch.get_num_threads()  # the number the CLI set (no --threads: its default)
    assert options == {
        "model": str(tiny_model_dir), "corpus": "builtin", "max_sentences": 12, "max_length": 128,
        "batch_size": 32, "device": "cpu", "dtype": "float32", "seed": 3, "out": str(out), "force": False,
        "quiet": True, "keep_steps": False, "settings": {}, "activations": None,
    }  # fmt: skip
    assert manifest["seed"] == 3 and manifest["device"]["device"] == "cpu" and manifest["dtype"] == "float32"
    assert manifest["packages"]["torch"] == metadata.version("torch")
    assert manifest["started_at"] <= manifest["finished_at"]
    assert manifest["notes"]["n_sentences_used"] == 12 and manifest["notes"]["n_truncated"] == 0
    listed = {o["path"]: o["sha256"] for o in manifest["outputs"]}
    assert set(listed) == {"results.parquet", "results.csv", "per_layer.parquet", "per_layer.csv",
                           "fig_row_sums.png", "fig_row_sums.pdf"}  # fmt: skip
    assert listed["results.csv"] == hashlib.sha256((d / "results.csv").read_bytes()).hexdigest()
    assert "git" in manifest  # None without a commit, else {"commit", "dirty"}

    # the report: figure embedded byte for byte, the summary table, the manifest
    page = (out / "index.html").read_text()
    assert base64.b64encode((d / "fig_row_sums.png").read_bytes()).decode() in page
    assert "<h4>per_layer</h4>" in page and manifest["model"]["weights_sha256"] in page
    assert "http://" not in page and "https://" not in page and "<script" not in page  # opens offline
    assert not list(out.rglob("*.partial"))


def test_rerun_skips_finished_work_unless_forced_or_changed(
    capsys: pytest.CaptureFixture[str], tiny_model_dir: Path, tmp_path: Path, fake: FakeExperiment
) -> None:
    out = tmp_path / "results"
    source = tmp_path / "fake_exp.py"
    source.write_text("# version 1\n")
    fake.module.__file__ = str(source)
    assert bertscope(capsys, *run_args(tiny_model_dir, out))[0] == 0
    results = out / "fake" / "results.parquet"
    stamp = results.stat().st_mtime_ns
    assert fake.runs == 1

    code, stdout, _ = bertscope(capsys, *run_args(tiny_model_dir, out))
    assert code == 0 and fake.runs == 1 and "skipped (already complete" in stdout
    assert results.stat().st_mtime_ns == stamp

    source.write_text("# version 2\n")  # same settings, edited code: still skipped, but said so
    code, stdout, _ = bertscope(capsys, *run_args(tiny_model_dir, out))
    assert code == 0 and fake.runs == 1 and "its code changed since" in stdout

    assert bertscope(capsys, *run_args(tiny_model_dir, out, "--force"))[0] == 0
    assert fake.runs == 2 and fake.step_computations == 4  # --force also discards cached steps

    assert bertscope(capsys, *run_args(tiny_model_dir, out, "--seed", "1"))[0] == 0
    assert fake.runs == 3  # a different seed is a different run


def test_interrupted_run_keeps_no_results_and_resumes_from_its_steps(
    capsys: pytest.CaptureFixture[str], tiny_model_dir: Path, tmp_path: Path, fake: FakeExperiment
) -> None:
    out = tmp_path / "results"
    fake.interrupt_after_step = True
    code, _, err = bertscope(capsys, *run_args(tiny_model_dir, out))
    assert code == 130 and "rerun the same command to resume" in err
    d = out / "fake"
    assert json.loads((d / "manifest.json").read_text())["status"] == "interrupted"
    assert not (d / "results.parquet").exists() and not list(out.rglob("*.partial"))
    assert len(list((d / "steps").glob("row_sums-*.parquet"))) == 1
    assert len(list((d / "steps").glob("lengths-*.npz"))) == 1
    assert fake.step_computations == 2

    fake.interrupt_after_step = False
    assert bertscope(capsys, *run_args(tiny_model_dir, out))[0] == 0
    assert fake.step_computations == 2  # the finished steps were reused, not recomputed
    assert json.loads((d / "manifest.json").read_text())["status"] == "complete"


@pytest.fixture
def two_experiments(monkeypatch: pytest.MonkeyPatch, fake: FakeExperiment):
    """Registry = {fake (built in memory), pipeline-fake (a module a fresh process can import)}."""
    import pipeline_experiment

    monkeypatch.setitem(registry.EXPERIMENTS, "pipeline-fake", pipeline_experiment.__name__)
    return fake, pipeline_experiment


def test_run_all_draws_figures_in_another_process_and_completes_manifests_only_after(
    capsys: pytest.CaptureFixture[str], tiny_model_dir: Path, tmp_path: Path, two_experiments
) -> None:
    import os

    from bertscope.experiments.options import RunOptions, prepare_inputs
    from bertscope.experiments.runner import FigurePipeline, run_experiment

    fake, module = two_experiments
    out = tmp_path / "results"
    code, stdout, err = bertscope(capsys, *run_args(tiny_model_dir, out))
    assert code == 0, err
    d = out / "pipeline_fake"
    manifest = json.loads((d / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["figures"] == ["fig_words.png", "fig_words.pdf"]
    assert {o["path"] for o in manifest["outputs"]} >= {"fig_words.png", "fig_words.pdf", "drawn_by.txt"}
    assert int((d / "drawn_by.txt").read_text()) != os.getpid()  # drawn by the pipeline's process
    assert json.loads((out / "fake" / "manifest.json").read_text())["status"] == "complete"  # drawn here
    assert "pipeline-fake" in stdout and "complete" in stdout

    # the same figure drawn in this process has the same bytes; until the drawing ends the manifest says so
    options = RunOptions(out=tmp_path / "inline", model=str(tiny_model_dir), max_sentences=int(MAX_SENTENCES),
                         device="cpu", quiet=True)  # fmt: skip
    inputs = prepare_inputs(options)
    inline = run_experiment(module, options, inputs)
    assert inline.status == "complete" and int((inline.out_dir / "drawn_by.txt").read_text()) == os.getpid()
    with FigurePipeline() as figures:
        options = dataclasses.replace(options, out=tmp_path / "piped")
        started = time.perf_counter()
        pending = run_experiment(module, options, inputs, figures=figures)
        assert pending.status == "drawing"
        assert json.loads((pending.out_dir / "manifest.json").read_text())["status"] == "drawing"
        while not (pending.out_dir / "fig_words.pdf").exists() and time.perf_counter() - started < 120:
            time.sleep(0.05)
        time.sleep(1.0)  # the figures are written: waiting now must not count as the experiment's time
        done = figures.finish(pending)
        waited = time.perf_counter() - started
    assert done.status == "complete" and pending.seconds <= done.seconds <= waited - 0.9
    for name in ("fig_words.png", "results.parquet"):
        assert (done.out_dir / name).read_bytes() == (inline.out_dir / name).read_bytes()


def test_a_figure_that_fails_in_the_pipeline_fails_its_experiment(
    tiny_model_dir: Path, tmp_path: Path, two_experiments, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bertscope.experiments.options import RunOptions, prepare_inputs
    from bertscope.experiments.runner import FigurePipeline, run_experiment

    _, module = two_experiments
    monkeypatch.setattr(module, "Settings", functools.partial(module.Settings, fail_plot=True))
    options = RunOptions(out=tmp_path, model=str(tiny_model_dir), max_sentences=4, device="cpu", quiet=True)
    with FigurePipeline() as figures:
        done = figures.finish(run_experiment(module, options, prepare_inputs(options), figures=figures))
    manifest = json.loads((tmp_path / "pipeline_fake" / "manifest.json").read_text())
    assert done.status == "failed" and manifest["status"] == "failed"
    assert "planted drawing bug" in manifest["error"] and "planted drawing bug" in done.error


def test_failing_experiment_is_recorded_and_exit_status_is_1(
    capsys: pytest.CaptureFixture[str], tiny_model_dir: Path, tmp_path: Path, fake: FakeExperiment
) -> None:
    out = tmp_path / "results"
    fake.fail = True
    code, stdout, err = bertscope(capsys, *run_args(tiny_model_dir, out))
    assert code == 1 and "planted bug" in err and "failed" in stdout
    manifest = json.loads((out / "fake" / "manifest.json").read_text())
    assert manifest["status"] == "failed" and "ValueError: planted bug" in manifest["error"]
    assert "failed" in (out / "index.html").read_text()  # the report shows the failure too

    fake.fail = False
    assert bertscope(capsys, *run_args(tiny_model_dir, out))[0] == 0 and fake.runs == 2  # failed is not finished


def test_report_command_and_linked_figures(
    capsys: pytest.CaptureFixture[str], tiny_model_dir: Path, tmp_path: Path, fake: FakeExperiment
) -> None:
    out = tmp_path / "results"
    args = [a for a in run_args(tiny_model_dir, out, "--no-report") if a != "--quiet"]
    code, _, err = bertscope(capsys, *args)
    assert code == 0 and "fake: batches" not in err  # no progress bars when stderr is not a terminal
    assert not (out / "index.html").exists()
    code, stdout, _ = bertscope(capsys, "report", out, "--link-figures")
    assert code == 0 and str(out / "index.html") in stdout
    page = (out / "index.html").read_text()
    assert 'src="fake/fig_row_sums.png"' in page and 'href="fake/fig_row_sums.pdf"' in page


def test_run_writes_the_same_report_as_the_report_command(
    capsys: pytest.CaptureFixture[str], tiny_model_dir: Path, tmp_path: Path, fake: FakeExperiment
) -> None:
    """One report (issue 27.12): `run` wrote one without the explorer section, `report` one with it."""
    out = tmp_path / "results"
    assert bertscope(capsys, *run_args(tiny_model_dir, out))[0] == 0
    by_run = (out / "index.html").read_text()
    assert bertscope(capsys, "report", out)[0] == 0
    by_report = (out / "index.html").read_text()

    def explorer(page: str) -> str:
        assert '<section id="explorer">' in page
        return page.split('<section id="explorer">')[1].split("</section>")[0]

    assert explorer(by_run) == explorer(by_report)
    assert by_run.split("<nav>")[1].split("</nav>")[0] == by_report.split("<nav>")[1].split("</nav>")[0]


# --------------------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["info", "--model", "/no/such/model"], "/no/such/model"),
        (["info", "--model", "./missing_folder"], "missing_folder"),
        (["info", "--dtype", "int7"], "--dtype 'int7'"),
        (["info", "--device", "tpu"], "--device 'tpu'"),
        (["run", "all", "--corpus", "nope.txt", "--max-sentences", "2"], "nope.txt"),
        (["run", "all", "--corpus", "no-such-corpus"], "no-such-corpus"),
        (["run", "all", "--max-length", "100000"], "--max-length 100000"),
        (["report", "/no/such/results"], "/no/such/results"),
        (["run", "all", "--out", __file__], "is a file, not a folder"),
    ],
)
def test_bad_input_is_one_clear_line_with_status_2(
    capsys: pytest.CaptureFixture[str],
    tiny_model_dir: Path,
    fake: FakeExperiment,
    tmp_path: Path,
    args: list[str],
    needle: str,
) -> None:
    if args[0] == "run":
        args = [*args, "--model", str(tiny_model_dir)]
        args += [] if "--out" in args else ["--out", str(tmp_path / "r")]
    code, out, err = bertscope(capsys, *args)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bertscope: error:") and needle in lines[0], err
    assert "Traceback" not in err and fake.runs == 0


def test_cuda_requested_without_cuda_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    code, _, err = bertscope(capsys, "info", "--device", "cuda")
    assert code == 2 and err.count("\n") == 1 and "--device cuda: CUDA is not available" in err


def test_unknown_experiment_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["run", "ghost"])
    assert exit_info.value.code == 2 and "invalid choice: 'ghost'" in capsys.readouterr().err
    with pytest.raises(cli.UsageError, match="unknown experiment 'ghost'"):
        registry.load_experiment("ghost")


def test_resumed_run_with_changed_settings_recomputes_the_affected_steps(
    capsys: pytest.CaptureFixture[str], tiny_model_dir: Path, tmp_path: Path, fake: FakeExperiment, monkeypatch
) -> None:
    out = tmp_path / "results"
    fake.interrupt_after_step = True
    assert bertscope(capsys, *run_args(tiny_model_dir, out))[0] == 130
    assert fake.step_computations == 2 and fake.lengths_computations == 1
    fake.interrupt_after_step = False
    monkeypatch.setattr(fake.module, "Settings", lambda: FakeSettings(scale=3))  # other settings, then resume
    assert bertscope(capsys, *run_args(tiny_model_dir, out, "--keep-steps", "yes"))[0] == 0
    assert fake.lengths_computations == 2  # the step that depends on the settings was recomputed (and checked)
    manifest = json.loads((out / "fake" / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["settings"] == {"scale": 3}
    steps = out / "fake" / "steps"
    assert len(list(steps.glob("lengths-*.npz"))) == 1  # the stale cache entry is gone


def test_step_cache_key_follows_the_code(tmp_path: Path) -> None:
    from bertscope.experiments.options import Inputs, RunOptions

    inputs = Inputs(None, None, torch.device("cpu"), torch.float32, {"weights_sha256": "w"}, {"sha256": "c"})
    options = RunOptions(out=tmp_path / "nothing_yet")
    a = Context("fake", options, inputs, tmp_path / "nothing_yet" / "fake", settings=FakeSettings(), code_sha256="1")
    b = Context("fake", options, inputs, tmp_path / "nothing_yet" / "fake", settings=FakeSettings(), code_sha256="2")
    c = Context("fake", options, inputs, tmp_path / "nothing_yet" / "fake", settings=FakeSettings(2), code_sha256="1")
    assert not (tmp_path / "nothing_yet").exists()  # constructing a context touches nothing on disk
    assert len({a.step_key("s"), b.step_key("s"), c.step_key("s"), a.step_key("s", probe=1)}) == 4
    assert a.step_key("s") == Context("fake", options, inputs, tmp_path, settings=FakeSettings(),
                                      code_sha256="1").step_key("s")  # fmt: skip


def test_report_of_an_empty_folder_says_what_to_do(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = bertscope(capsys, "report", tmp_path)
    assert code == 2 and "bertscope run all" in err


def test_every_command_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ([], ["info"], ["capture"], ["run"], ["report"]):
        with pytest.raises(SystemExit) as exc:
            cli.main([*command, "--help"])
        assert exc.value.code == 0
        assert "usage: bertscope" in capsys.readouterr().out


def test_group_hook_names_collapses_layers() -> None:
    names = ["embed.hook_out", "blocks.0.hook_resid_post", "blocks.1.hook_resid_post", "blocks.3.attn.hook_q"]
    assert cli.group_hook_names(names) == ["embed.hook_out", "blocks.{0..1}.hook_resid_post", "blocks.3.attn.hook_q"]


def test_cli_robustness_one_line_exit_2_nothing_written(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                         tiny_model_dir: Path) -> None:
    """Issue 13: bad input exits 2 with one line and writes nothing; --version; info | head ends quietly."""
    import shutil
    import subprocess
    import sys

    out = tmp_path / "o"
    code, _, err = bertscope(capsys, "run", "same-token", "--max-length", "2", "--out", out)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--max-length 2" in err and not out.exists()
    no_tok = tmp_path / "no_tokenizer"
    no_tok.mkdir()
    for f in ("config.json", "model.safetensors"):
        shutil.copy(tiny_model_dir / f, no_tok / f)
    code, _, err = bertscope(capsys, "run", "same-token", "--model", no_tok, "--out", out)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "no tokenizer" in err and not out.exists()
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.startswith("bertscope ")
    help_text = cli.build_parser(["run", "heads", "--help"])._subparsers._group_actions[0].choices["run"].description
    assert help_text.startswith("heads: ")
    proc = subprocess.Popen([sys.executable, "-c", "from bertscope.experiments.cli import main; main(['info', "
                             f"'--model', {str(tiny_model_dir)!r}, '--json'])"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.read(5)
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    proc.wait()
    assert "BrokenPipeError" not in stderr and "Traceback" not in stderr


def test_help_states_run_time_only_when_recorded(tmp_path):
    from bertscope.experiments import registry

    missing = tmp_path / "none.json"
    assert registry.measured_seconds(missing) == {}
    assert "took about" not in registry.help_text("heads", times=missing)
    record = tmp_path / "run_times.json"
    record.write_text(json.dumps({"measured": "2026-01-02", "machine": "2 CPU cores, x86_64",
                                  "experiments": {"heads": {"seconds": 61.4, "status": "complete"}}}))
    text = registry.help_text("heads", times=record)
    assert text.startswith(registry.HELP["heads"])
    assert "took about 61 s (2 CPU cores, x86_64, measured 2026-01-02; load not recorded" in text
    assert "took about" not in registry.help_text("positions", times=record)
    record.write_text(json.dumps({"measured": "2026-01-02", "machine": "2 CPU cores, x86_64", "load_before": [0.3],
                                  "experiments": {"heads": {"seconds": 61.4, "status": "complete"}}}))
    text = registry.help_text("heads", times=record)  # the load the time assumes, and that more load slows it
    assert "(2 CPU cores, x86_64, measured 2026-01-02; load average 0.3, nothing else running: slower under " \
           "other load)" in text
    record.write_text("{not json")
    assert registry.measured_seconds(record) == {}
