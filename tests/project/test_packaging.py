"""After `pip install .`, `bertscope` is the only new top-level package: the wheel holds nothing else."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
SKIP = shutil.ignore_patterns(".git", ".venv", ".dev", "build", "dist", "*.egg-info", "results", "__pycache__",
                              ".pytest_cache", ".ruff_cache", "api")


def build_wheel(tmp_path: Path) -> Path:
    """Build a wheel from a copy of the source tree (an in-tree build would leave build/ in the checkout)."""
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=SKIP, symlinks=True)
    out = tmp_path / "wheel"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w",
         str(out), str(src)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = out.glob("bertscope-*.whl")
    return wheel


@pytest.mark.slow
def test_wheel_has_only_the_bertscope_namespace(tmp_path):
    wheel = build_wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    dist_info = {t for t in top if t.endswith(".dist-info")}
    assert len(dist_info) == 1
    assert top - dist_info == {"bertscope"}, sorted(top)
    # the subpackages are inside the namespace, with their modules
    for module in ("bertscope/__init__.py", "bertscope/models/encoder.py", "bertscope/models/text.py",
                   "bertscope/hooks/cache.py", "bertscope/probes/evaluate.py", "bertscope/experiments/cli/__init__.py",
                   "bertscope/experiments/capture/__main__.py",
                   "bertscope/experiments/corpus/__init__.py"):
        assert module in names, module
    # every folder of .py files in the wheel is a declared package (a new subpackage must be listed)
    folders = {n.rsplit("/", 1)[0] for n in names if n.endswith(".py")}
    assert all(f"{f}/__init__.py" in names for f in folders), sorted(folders)
    # ... and every package in the source tree made it in (a new subpackage must be added to pyproject's list)
    for sub in ("models", "hooks", "probes", "experiments"):
        for init in (ROOT / sub).rglob("__init__.py"):
            if "__pycache__" not in init.parts:
                assert f"bertscope/{init.relative_to(ROOT).as_posix()}" in names, f"{init} is not packaged"
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "bertscope = bertscope.experiments.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


# pyproject.toml lists every subpackage explicitly: a folder with an __init__.py that is not listed would be
# missing from an installed bertscope (checked fast here, and in the wheel above).
TOP_LEVEL = ("models", "hooks", "probes", "experiments")


def test_every_package_folder_is_listed_in_pyproject() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    listed = set(config["packages"])
    found = {
        "bertscope." + init.parent.relative_to(ROOT).as_posix().replace("/", ".")
        for top in TOP_LEVEL
        for init in (ROOT / top).rglob("__init__.py")
    }
    assert found, "no packages found: wrong repository root?"
    assert found <= listed, f"add to pyproject.toml [tool.setuptools] packages: {sorted(found - listed)}"
    for name in found:  # each must also be mapped to its folder, or setuptools looks under bertscope/
        folder = config["package-dir"].get(name)
        assert folder == name.removeprefix("bertscope.").replace(".", "/"), name
