"""Every registered experiment follows the one template written down in docs/architecture.md ("The experiment
template"): file roles, the computation modules' role names, ``run`` as a short plan, one ``plot`` signature, the
optional members documented, where ``plot`` and ``CAPTIONS`` live, summary table names, the run context only in
``run``, one job service, one exception for inputs an experiment cannot use."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest
from bertscope.experiments import registry

ROOT = Path(__file__).resolve().parents[2]
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


ARCHITECTURE = (ROOT / "docs" / "architecture.md").read_text()
MAX_RUN_LINES = 40


@pytest.mark.parametrize("name", list(registry.EXPERIMENTS))
def test_computation_modules_have_the_role_names(name: str) -> None:
    """``data.py`` and ``measures.py`` in every experiment; a retired name (``collect``, ``passes``, ``design``,
    ``compute``, ...) is only an alias module giving the very module of its new name."""
    pkg = PACKAGES[name]
    folder = Path(pkg.__file__).parent
    for role in ("data", "measures"):
        assert (folder / f"{role}.py").is_file(), f"{name} has no {role}.py"
    for old in registry.RETIRED_MODULES:
        path = folder / f"{old}.py"
        if path.is_file():
            text = path.read_text()
            assert "sys.modules[__name__]" in text and len(text.splitlines()) <= 10, f"{path} is not an alias module"
            alias = importlib.import_module(f"{pkg.__name__}.{old}")
            assert alias.__name__.rsplit(".", 1)[-1].split("_")[0] in registry.ROLE_MODULES, alias


def test_the_roles_are_stated_in_the_docs() -> None:
    for role in registry.ROLE_MODULES:
        assert f"| `{role}.py`" in ARCHITECTURE, role
    for old in registry.RETIRED_MODULES:
        assert f"{old}.py`" in ARCHITECTURE, old


@pytest.mark.parametrize("name", list(registry.EXPERIMENTS))
def test_run_reads_as_a_short_plan(name: str) -> None:
    lines, _ = inspect.getsourcelines(PACKAGES[name].run)
    assert len(lines) <= MAX_RUN_LINES, f"{name}: run is {len(lines)} lines (at most {MAX_RUN_LINES})"


@pytest.mark.parametrize("name", list(registry.EXPERIMENTS))
def test_one_plot_signature(name: str) -> None:
    params = inspect.signature(PACKAGES[name].plot).parameters
    assert list(params) == ["out_dir", "formats"], f"{name}: plot{inspect.signature(PACKAGES[name].plot)}"
    assert params["formats"].default is None


#: The signature each optional member has when an experiment defines it (parameter names, in order, of callables).
OPTIONAL_SIGNATURES = {
    "findings": ["out_dir"],
    "check": ["inputs", "settings"],
    "check_settings": ["model", "settings"],
    "activation_sites": ["model"],
    "check_capture": ["source", "inputs", "options", "settings"],
    "capture_inputs": ["inputs", "options", "settings"],
}


def test_every_optional_member_is_documented() -> None:
    """Each member of ``registry.OPTIONAL_MEMBERS`` has a row in the architecture page's table and a line in the
    protocol's docstring, and the page names the run-values class."""
    assert set(OPTIONAL_SIGNATURES) | {"CAPTIONS", "NO_ACTIVATIONS", "PAIRS"} == set(registry.OPTIONAL_MEMBERS)
    doc = registry.Experiment.__doc__ or ""
    for member in registry.OPTIONAL_MEMBERS:
        assert f"| `{member}" in ARCHITECTURE, f"docs/architecture.md has no row for {member}"
        assert f"``{member}" in doc, f"registry.Experiment's docstring does not describe {member}"
    assert "ctx.run_values(" in ARCHITECTURE


@pytest.mark.parametrize("name", list(registry.EXPERIMENTS))
def test_optional_members_have_the_documented_signature(name: str) -> None:
    pkg = PACKAGES[name]
    for member, params in OPTIONAL_SIGNATURES.items():
        if hasattr(pkg, member):
            got = list(inspect.signature(getattr(pkg, member)).parameters)
            assert got[: len(params)] == params, f"{name}.{member}{got}"
    if hasattr(pkg, "NO_ACTIVATIONS"):
        assert isinstance(pkg.NO_ACTIVATIONS, str) and pkg.NO_ACTIVATIONS
    if hasattr(pkg, "CAPTIONS"):
        assert isinstance(pkg.CAPTIONS, dict)


def test_one_run_values_class_built_by_the_context() -> None:
    from bertscope.experiments import context
    from bertscope.experiments.erasure import steps as erasure_steps
    from bertscope.experiments.features import steps as features_steps

    assert erasure_steps.RunValues is features_steps.RunValues is context.RunValues
    names = {n for n in dir(context.Context) if not n.startswith("_")}
    assert "run_values" in names


def test_package_docstrings_list_every_family_and_experiment() -> None:
    import bertscope
    from bertscope import experiments, models

    for module in (bertscope, experiments):
        for name in registry.EXPERIMENTS:
            assert f"``{name}``" in (module.__doc__ or ""), f"{module.__name__}'s docstring lacks {name}"
    for module in (bertscope, models):
        for model_type in models.FAMILIES:
            assert f"``{model_type}``" in (module.__doc__ or ""), f"{module.__name__}'s docstring lacks {model_type}"
