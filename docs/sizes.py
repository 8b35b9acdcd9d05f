"""Writes the "Size" section of docs/architecture.md from the source: lines per layer, the files over
:data:`MAX_FILE` lines and the functions over :data:`MAX_FUNCTION` lines (and each experiment's ``run``).

    python docs/sizes.py          # rewrite the block between the markers in docs/architecture.md
    python docs/sizes.py --check  # exit 1 when the block is not what the source gives now

Nothing in the block is typed by hand: rerun it after a change that moves lines between layers.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "architecture.md"
START, END = "<!-- sizes:start (docs/sizes.py writes this block) -->", "<!-- sizes:end -->"
LAYERS = ("hooks", "models", "probes", "experiments")
MAX_FILE, MAX_FUNCTION = 400, 60


def _files(root: Path, layer: str) -> list[Path]:
    return sorted(p for p in (root / layer).rglob("*.py") if "__pycache__" not in p.parts)


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def _functions(path: Path) -> list[tuple[str, int]]:
    """``(qualified name, lines)`` of every function and method in ``path``."""
    out: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((prefix + child.name, child.end_lineno - child.lineno + 1))
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")

    visit(ast.parse(path.read_text(encoding="utf-8")), "")
    return out


def render(root: Path = ROOT) -> str:
    """The block's markdown (without the markers)."""
    rows, big_files, big_functions, runs = [], [], [], []
    for layer in LAYERS:
        files = _files(root, layer)
        total = sum(_lines(f) for f in files)
        detail = ""
        if layer == "experiments":
            rels = [f.relative_to(root / layer).parts for f in files]
            packages = {r[0] for r in rels if len(r) > 1}
            parts = {p: sum(_lines(f) for f in files if f.relative_to(root / layer).parts[0] == p)
                     for p in sorted(packages)}  # fmt: skip
            framework = total - sum(parts.values())
            detail = f"framework modules {framework:,}; " + ", ".join(f"`{p}/` {n:,}" for p, n in parts.items())
        else:
            subs = {f.relative_to(root / layer).parts[0] for f in files if len(f.relative_to(root / layer).parts) > 1}
            detail = ", ".join(f"`{s}/` {sum(_lines(f) for f in files if f.relative_to(root / layer).parts[0] == s):,}"
                               for s in sorted(subs))  # fmt: skip
        rows.append(f"| `{layer}/` | {len(files)} | {total:,} | {detail} |")
        for f in files:
            rel = f.relative_to(root).as_posix()
            if _lines(f) > MAX_FILE:
                big_files.append(f"`{rel}` ({_lines(f)})")
            for name, n in _functions(f):
                if n > MAX_FUNCTION:
                    big_functions.append(f"`{rel}:{name}` ({n})")
                if layer == "experiments" and f.name == "experiment.py" and name == "run":
                    runs.append(f"{f.parent.name} {n}")
    return "\n".join([
        "| layer | files | lines | of which |",
        "| --- | --- | --- | --- |",
        *rows,
        "",
        f"Files over {MAX_FILE} lines: " + (", ".join(big_files) or "none") + ".",
        "",
        f"Functions over {MAX_FUNCTION} lines: " + (", ".join(big_functions) or "none") + ".",
        "",
        "Each experiment's `run`, in lines: " + ", ".join(runs) + ".",
    ])  # fmt: skip


def block(text: str) -> str:
    """The current block of ``text`` (between the markers); ``ValueError`` when the markers are missing."""
    if START not in text or END not in text:
        raise ValueError(f"{PAGE.name} lacks the markers {START!r} ... {END!r}")
    return text.split(START, 1)[1].split(END, 1)[0].strip("\n")


def main(argv: list[str] | None = None) -> int:
    """Rewrite the block (or, with ``--check``, return 1 when it is stale)."""
    argv = sys.argv[1:] if argv is None else argv
    text = PAGE.read_text(encoding="utf-8")
    current, fresh = block(text), render()
    if "--check" in argv:
        if current != fresh:
            print(f"{PAGE}: the Size block is stale; run python docs/sizes.py", file=sys.stderr)
            return 1
        return 0
    head, rest = text.split(START, 1)
    PAGE.write_text(f"{head}{START}\n{fresh}\n{END}{rest.split(END, 1)[1]}", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
