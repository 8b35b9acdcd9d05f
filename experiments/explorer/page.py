"""The explorer page: one self-contained HTML document (styles, script and data inlined; nothing fetched).

The data travels as JSON inside ``<script type="application/json">``; ``<``, ``>``, ``&`` and U+2028/U+2029
are written as ``\\uXXXX`` escapes, so no text from a corpus can close that element or open markup. The page's
script reads it with ``JSON.parse`` and puts every string into the DOM with ``textContent`` (or draws it on a
canvas), never as HTML.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
from importlib import resources

FORMAT = "bertscope-explorer/1"
_ASSETS = ("explorer.html", "explorer.css", "explorer.js")
_JSON_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def asset(name: str) -> str:
    """The text of one packaged asset (``explorer.html``, ``explorer.css`` or ``explorer.js``)."""
    if name not in _ASSETS:
        raise ValueError(f"unknown explorer asset {name!r}")
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def script_json(obj) -> str:
    """JSON that is safe inside ``<script type="application/json">``: no ``<``, ``>``, ``&``, U+2028/2029."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return re.sub("[<>&\u2028\u2029]", lambda m: _JSON_ESCAPES[m.group(0)], text)


def render(payload: dict, title: str = "bertscope explorer") -> str:
    """The whole HTML document for ``payload`` (see ``Explorer`` for its format)."""
    script, style = asset("explorer.js"), asset("explorer.css")
    for name, text in (("explorer.js", script), ("explorer.css", style)):
        if re.search(r"</(script|style)", text, re.IGNORECASE):  # would end the inline element early
            raise RuntimeError(f"{name} must not contain a closing script/style tag")
    # The page's only allowed script is this one (by hash): markup that somehow got in could not run script.
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    parts = {
        "title": html.escape(title),
        "style": style,
        "script": script,
        "script_hash": f"'sha256-{digest}'",
        "data": script_json(payload),
    }
    # One pass: text substituted for a placeholder is never scanned again.
    return re.sub(r"\{\{(\w+)\}\}", lambda m: parts[m.group(1)], asset("explorer.html"))


def iframe(document: str, height: int = 860) -> str:
    """``document`` in an ``<iframe srcdoc>`` (for Jupyter: isolates its ids, styles and script)."""
    return (
        f'<iframe srcdoc="{html.escape(document, quote=True)}" style="width:100%;height:{int(height)}px;'
        'border:1px solid #ddd" sandbox="allow-scripts" title="bertscope explorer"></iframe>'
    )
