"""Build the API reference (HTML) from the docstrings, offline, with pdoc.

    python docs/build_api.py [OUT]        # default OUT: docs/api/ (open OUT/index.html)

Documents ``bertscope`` and its subpackages (models, hooks, probes, experiments). Nothing is fetched from the
network: pdoc renders from the imported modules, and math/mermaid (the only features that load scripts from a
CDN) stay off.
"""

from __future__ import annotations

import sys
from pathlib import Path

MODULES = ("bertscope", "bertscope.models", "bertscope.hooks", "bertscope.probes", "bertscope.experiments")
DEFAULT_OUT = Path(__file__).resolve().parent / "api"


def build(out: Path = DEFAULT_OUT) -> Path:
    """Write the HTML reference into ``out``; returns the path of its ``index.html``."""
    import pdoc
    import pdoc.render

    pdoc.render.configure(docformat="markdown", math=False, mermaid=False, show_source=True,
                          footer_text="bertscope API reference")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    pdoc.pdoc(*MODULES, output_directory=out)
    return out / "index.html"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        import pdoc  # noqa: F401
    except ImportError:
        print("pdoc is not installed: pip install -e '.[dev]' (or pip install pdoc)", file=sys.stderr)
        return 2
    index = build(Path(args[0]) if args else DEFAULT_OUT)
    print(f"API reference written to {index}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
