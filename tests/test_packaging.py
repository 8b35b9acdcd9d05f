"""pyproject.toml lists every subpackage explicitly: a folder with an __init__.py that is not listed would be
missing from an installed bertscope."""

from __future__ import annotations

import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
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
