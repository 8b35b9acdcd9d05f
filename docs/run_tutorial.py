"""Run the Python blocks of a Markdown page in order and check (or refresh) the output blocks after them.

    python docs/run_tutorial.py [docs/tutorial.md]            # run; exit 1 if an output differs
    python docs/run_tutorial.py --update [docs/tutorial.md]   # write what the blocks print into the page

Each ```python block may be followed by a ```text block holding what it prints. The blocks share one
namespace. Outputs match when their words are equal and their numbers agree to a small tolerance (the last
digits of a float can move between BLAS builds).
"""

from __future__ import annotations

import contextlib
import io
import math
import re
import sys
from pathlib import Path

DEFAULT = Path(__file__).resolve().parent / "tutorial.md"
_BLOCK = re.compile(r"```python\n(.*?)```\n(?:\n```text\n(.*?)```\n)?", re.S)
_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


def run_blocks(text: str) -> list[tuple[re.Match[str], str]]:
    """Execute every python block; returns (match, printed output) pairs in page order."""
    namespace: dict[str, object] = {"__name__": "__tutorial__"}
    results = []
    for match in _BLOCK.finditer(text):
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            exec(compile(match.group(1), "<tutorial block>", "exec"), namespace)
        results.append((match, buffer.getvalue()))
    return results


def same_output(expected: str, actual: str, rel: float = 2e-2, abs_: float = 2e-3) -> bool:
    """Equal words; numbers equal to ``rel``/``abs_`` tolerance."""
    if _NUMBER.sub("#", expected).split() != _NUMBER.sub("#", actual).split():
        return False
    pairs = zip(_NUMBER.findall(expected), _NUMBER.findall(actual), strict=True)
    return all(math.isclose(float(a), float(b), rel_tol=rel, abs_tol=abs_) for a, b in pairs)


def check(path: Path = DEFAULT) -> list[str]:
    """Run the page; returns a description of every output that differs (empty: all match)."""
    problems = []
    for match, printed in run_blocks(path.read_text()):
        expected = match.group(2)
        if expected is not None and not same_output(expected, printed):
            first = match.group(1).strip().splitlines()[0]
            problems.append(f"block starting {first!r}:\n--- page\n{expected}--- now\n{printed}")
    return problems


def update(path: Path = DEFAULT) -> None:
    """Rewrite the page with what each block prints now."""
    text = path.read_text()
    out, last = [], 0
    for match, printed in run_blocks(text):
        out.append(text[last : match.start()])
        out.append(f"```python\n{match.group(1)}```\n\n```text\n{printed}```\n")
        last = match.end()
    out.append(text[last:])
    path.write_text("".join(out))


def main(argv: list[str]) -> int:
    args = [a for a in argv if a != "--update"]
    path = Path(args[0]) if args else DEFAULT
    if "--update" in argv:
        update(path)
        print(f"updated {path}")
        return 0
    problems = check(path)
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
