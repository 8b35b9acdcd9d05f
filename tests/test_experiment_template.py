"""Every registered experiment follows the one template written down in docs/architecture.md ("The experiment
template"): file roles, where ``plot`` and ``CAPTIONS`` live, summary table names, the run context only in
``run``, one job service, one exception for inputs an experiment cannot use."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest
from bertscope.experiments import registry

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {name: importlib.import_module(path) for name, path in registry.EXPERIMENTS.items()}


@pytest.mark.parametrize("name", list(registry.EXPERIMENTS))
def test_file_roles_plot_captions_and_summary_names(name: str) -> None:
    pkg = PACKAGES[name]
    base = pkg.__name__
    assert pkg.run.__module__ == f"{base}.experiment" and pkg.Settings.__module__ == f"{base}.experiment"
    assert pkg.plot.__module__ == f"{base}.plots"  # figures are drawn in plots.py, from the saved tables
    findings = importlib.import_module(f"{base}.findings")
    assert pkg.CAPTIONS is findings.CAPTIONS and pkg.findings is findings.findings  # captions beside findings
    assert all("." not in t for t in pkg.SUMMARY_TABLES), pkg.SUMMARY_TABLES  # table names, no suffix
    if hasattr(pkg, "check"):
        assert list(inspect.signature(pkg.check).parameters) == ["inputs", "settings"]
    assert "settings" in inspect.signature(pkg.run).parameters


def _experiment_dirs() -> list[Path]:
    return [ROOT / "experiments" / p.__name__.rsplit(".", 1)[-1] for p in PACKAGES.values()]


def test_the_run_context_stays_in_run() -> None:
    """No module of an experiment but ``experiment.py`` names the context or its step-cache methods."""
    offenders = []
    for d in _experiment_dirs():
        for f in sorted(d.glob("*.py")):
            if f.name in ("experiment.py", "__init__.py"):
                continue
            for node in ast.walk(ast.parse(f.read_text())):
                if isinstance(node, ast.arg) and node.arg == "ctx":
                    offenders.append(f"{f.relative_to(ROOT)}: argument ctx")
                if isinstance(node, ast.Attribute) and node.attr in ("step", "step_arrays", "step_path", "note") \
                        and isinstance(node.value, ast.Name) and node.value.id == "ctx":  # fmt: skip
                    offenders.append(f"{f.relative_to(ROOT)}: ctx.{node.attr}")
    assert not offenders, offenders


def test_one_worker_mechanism_and_no_usage_error_inside_experiments() -> None:
    """Workers only through the job service (no joblib, no process pool of an experiment's own) and usage
    problems only as `registry.CannotRun` (never the CLI's UsageError from inside an experiment)."""
    offenders = []
    for d in _experiment_dirs():
        for f in sorted(d.glob("*.py")):
            text = f.read_text()
            for word in ("joblib", "ProcessPoolExecutor", "multiprocessing", "UsageError"):
                if word in text:
                    offenders.append(f"{f.relative_to(ROOT)}: {word}")
    assert not offenders, offenders


def test_no_experiment_reads_back_a_table_it_wrote() -> None:
    """``run`` returns its results table and the framework writes it; no experiment's ``run`` module reads a
    table back (structure wrote ``results`` and read it again before)."""
    offenders = []
    for d in _experiment_dirs():
        for node in ast.walk(ast.parse((d / "experiment.py").read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in ("read_parquet", "read_csv"):  # fmt: skip
                offenders.append(f"{d.relative_to(ROOT)}/experiment.py:{node.lineno}")
    assert not offenders, offenders
