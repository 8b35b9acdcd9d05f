"""Issue 26.7: the import graph, read from the source (every ``import``, at module level and inside functions,
and the package ``__init__`` files each import runs first): no cycles between modules, the layer order that
``docs/architecture.md``'s layer table states, and no private name imported from another package. Type-only
imports (under ``if TYPE_CHECKING:``) never run and are not read.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"bertscope": "bertscope", "models": "bertscope.models", "hooks": "bertscope.hooks",
            "probes": "bertscope.probes", "experiments": "bertscope.experiments"}  # fmt: skip


def modules(root: Path = ROOT) -> dict[str, Path]:
    """``{dotted module name: file}`` for every module of the installed namespace."""
    out = {}
    for top, name in PACKAGES.items():
        for f in sorted((root / top).rglob("*.py")):
            parts = list(f.relative_to(root / top).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([name, *parts])] = f
    return out


def _type_only(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def _imports(tree: ast.AST):
    """Every import node, at any depth, except those under ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        for child in ast.iter_child_nodes(node):
            if not _type_only(child):
                stack.append(child)


def lazy_names(mods: dict[str, Path]) -> dict[str, dict[str, str]]:
    """``{package: {name: defining module}}`` for the package ``__init__`` files that import names on first use
    (PEP 562): their ``_LAZY = {name: module}`` table, read from the source."""
    out = {}
    for mod, path in mods.items():
        if path.name != "__init__.py":
            continue
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_LAZY" for t in node.targets):
                table = eval(compile(ast.Expression(node.value), str(path), "eval"), {"__name__": mod})  # noqa: S307
                out[mod] = {name: target for name, target in table.items() if target in mods}
    return out


def import_edges(mods: dict[str, Path]) -> list[tuple[str, str, str | None, int]]:
    """``(importer, imported module, imported name or None, line)`` for every bertscope import. ``from X import
    Y`` imports module ``X.Y`` when that is a module (then name None), name ``Y`` of the module that defines it
    when package ``X`` imports it on first use (its ``_LAZY`` table), else name ``Y`` of module ``X``."""
    lazy = lazy_names(mods)
    edges = []
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [(a.name, None) for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    parts = parts[: len(parts) - (node.level - 1)]
                    base = ".".join([*parts, *([base] if base else [])])
                targets = [(base, a.name) for a in node.names]
            for base, name in targets:
                if not base.startswith("bertscope"):
                    continue
                if name is not None and f"{base}.{name}" in mods:
                    target, edge = f"{base}.{name}", (mod, f"{base}.{name}", None, node.lineno)
                elif name in lazy.get(base, {}):
                    target, edge = lazy[base][name], (mod, lazy[base][name], name, node.lineno)
                elif base in mods:
                    target, edge = base, (mod, base, name, node.lineno)
                else:
                    continue
                edges.append(edge)
                edges.extend((mod, parent, None, node.lineno) for parent in parent_packages(target, mod, mods))
    return edges


def parent_packages(target: str, importer: str, mods: dict[str, Path]) -> list[str]:
    """The packages whose ``__init__`` importing ``target`` runs first, for ``importer``: every package above
    ``target`` except those ``importer`` itself lies in (already running when ``importer`` runs). Importing
    ``bertscope.hooks.sites`` from ``bertscope.models.encoder`` runs ``hooks/__init__.py``, so a loop through a
    package ``__init__`` (it imports a module that imports the package back) is a loop of this graph."""
    parts = target.split(".")
    parents = [".".join(parts[:i]) for i in range(1, len(parts))]
    return [p for p in parents if p in mods and importer != p and not importer.startswith(p + ".")]


def cycles(edges) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    graph: dict[str, set[str]] = {}
    for a, b, _, _ in edges:
        if a != b:
            graph.setdefault(a, set()).add(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer_table(doc: Path = ROOT / "docs" / "architecture.md") -> list[list[str]]:
    """The layers, lowest first: per row of the table under ``## Layers``, the path prefixes of its first column
    (``experiments/<name>/`` expands to the packages its second column names)."""
    text = doc.read_text(encoding="utf-8")
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    layers = []
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        paths = re.findall(r"`([^`]+)`", cells[0])
        if any("<name>" in p for p in paths):
            paths = [f"experiments/{p}" for p in re.findall(r"`([a-z_]+/)`", cells[1])]
        layers.append(paths)
    return layers


def layer_of(path: Path, layers: list[list[str]]) -> int:
    """The row whose longest path prefix matches ``path`` (relative to the repository)."""
    rel = path.relative_to(ROOT).as_posix()
    best, best_len = -1, -1
    for i, prefixes in enumerate(layers):
        for p in prefixes:
            if (rel == p or rel.startswith(p if p.endswith("/") else p + "/") or rel == p) and len(p) > best_len:
                best, best_len = i, len(p)
    return best


@pytest.fixture(scope="module")
def graph():
    mods = modules()
    return mods, import_edges(mods)


def test_the_reader_sees_function_level_imports_and_skips_type_only_ones(tmp_path):
    pkg = tmp_path / "hooks"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from bertscope.hooks.b import g\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nfrom . import a\nif TYPE_CHECKING:\n"
                              "    from bertscope.hooks.c import X\n")  # fmt: skip
    (pkg / "c.py").write_text("from bertscope.hooks.a import _private\n")
    mods = {k: v for k, v in modules(tmp_path).items() if k.startswith("bertscope.hooks")}
    edges = import_edges(mods)
    assert ("bertscope.hooks.a", "bertscope.hooks.b", "g", 2) in edges
    assert not any(b == "bertscope.hooks.c" for _, b, _, _ in edges)
    assert cycles(edges) == [["bertscope.hooks.a", "bertscope.hooks.b"]]


def test_the_reader_sees_loops_through_package_inits(tmp_path):
    """``hooks/__init__`` imports ``hooks.a``, which imports ``models.x``, which imports ``hooks.sites``: importing
    ``hooks.sites`` runs ``hooks/__init__`` first, so the three form a loop although no module names another's
    package directly."""
    for top in ("hooks", "models"):
        (tmp_path / top).mkdir()
    (tmp_path / "hooks" / "__init__.py").write_text("from bertscope.hooks.a import f\n")
    (tmp_path / "hooks" / "a.py").write_text("from bertscope.models.x import g\n")
    (tmp_path / "hooks" / "sites.py").write_text("from bertscope.hooks.b import z\n")
    (tmp_path / "hooks" / "b.py").write_text("z = 1\n")
    (tmp_path / "models" / "__init__.py").write_text("")
    (tmp_path / "models" / "x.py").write_text("from bertscope.hooks.sites import h\n")
    edges = import_edges(modules(tmp_path))
    assert ("bertscope.models.x", "bertscope.hooks", None, 1) in edges
    assert ("bertscope.hooks.sites", "bertscope.hooks", None, 1) not in edges  # its own package: runs first anyway
    assert cycles(edges) == [["bertscope.hooks", "bertscope.hooks.a", "bertscope.models.x"]]
    # A lazy __init__ (names imported on first use) breaks the loop; its names still count where they are used.
    (tmp_path / "hooks" / "__init__.py").write_text('_LAZY = {"f": f"{__name__}.a", **dict.fromkeys(("z",), "x")}\n')
    assert cycles(import_edges(modules(tmp_path))) == []
    (tmp_path / "models" / "y.py").write_text("from bertscope.hooks import f\n")
    assert ("bertscope.models.y", "bertscope.hooks.a", "f", 1) in import_edges(modules(tmp_path))


def test_no_import_cycles(graph):
    _, edges = graph
    found = cycles(edges)
    where = {c: [f"{a} -> {b} (line {n})" for a, b, _, n in edges if a in c and b in c] for c in map(tuple, found)}
    assert not found, where


def test_imports_follow_the_documented_layers(graph):
    """A module imports only from its own layer or the layers listed before it in docs/architecture.md."""
    mods, edges = graph
    layers = layer_table()
    assert len(layers) >= 6, layers
    unplaced = sorted(m for m, p in mods.items() if layer_of(p, layers) < 0)
    assert not unplaced, f"modules in no row of the layer table: {unplaced}"
    upward = [f"{a} (layer {layer_of(mods[a], layers)}) -> {b} (layer {layer_of(mods[b], layers)}), line {n}"
              for a, b, _, n in edges if layer_of(mods[b], layers) > layer_of(mods[a], layers)]  # fmt: skip
    assert not upward, upward


def test_no_private_names_across_packages(graph):
    """``_name`` (or a ``_module``) is imported only by modules of its own package (folder)."""
    mods, edges = graph

    def package(m: str) -> str:
        return m if mods[m].name == "__init__.py" else m.rpartition(".")[0]

    bad = []
    for a, b, name, n in edges:
        private_module = any(p.startswith("_") and not p.startswith("__") for p in b.split(".")[1:])
        private_name = name is not None and name.startswith("_") and not name.startswith("__")
        if (private_module or private_name) and package(a) != package(b):
            bad.append(f"{a}:{n} imports {b}{'.' + name if name else ''}")
    assert not bad, bad


def test_one_hook_resolver_serves_capture_and_the_activations_stage(tiny_model_dir):
    """``activations.resolve_sites`` is ``capture.layout.select_hooks`` without the CLI option in its errors."""
    import inspect

    from bertscope.experiments import activations
    from bertscope.experiments.capture.layout import CaptureError, select_hooks

    from bertscope import models

    model = models.load(tiny_model_dir)
    glob = "blocks.*.hook_resid_post, embed.hook_out"
    assert activations.resolve_sites(model, glob) == select_hooks(model, glob) == model.select_hooks(
        ["blocks.*.hook_resid_post", "embed.hook_out"])
    assert "select_hooks(model, sites, option=None)" in inspect.getsource(activations.resolve_sites)
    with pytest.raises(CaptureError) as lib:
        activations.resolve_sites(model, "blocks.9.hook_resid_post")
    with pytest.raises(CaptureError) as cli:
        select_hooks(model, "blocks.9.hook_resid_post")
    assert cli.value.args[0] == "--hooks: " + lib.value.args[0]
    with pytest.raises(CaptureError, match="^no hook given; give a name or glob"):
        activations.resolve_sites(model, " , ")
