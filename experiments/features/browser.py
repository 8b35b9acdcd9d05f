"""The feature browser: one self-contained, offline HTML page built from the features experiment's saved tables
(``browser_latents``, ``browser_contexts``, ``browser_tokens``).

It lists the latents of every site with their label (and test MCC, and what the label means in words:
`labels.meaning`; a "What a label means" section lists every variable and family), density, an activation histogram, the
top-activating test contexts (the token highlighted, with its value) and, where the model has a masked-LM head,
the vocabulary the decoder direction promotes, and the ``bertscope explore`` command that colours a text's tokens
by the latent (where the run saved or loaded its dictionaries); a search box filters by label and another by token
(a latent matches when the token is one of its top contexts' highlighted tokens). The explorer's standards
(`experiments.explorer.page`): data in a ``<script type="application/json">`` with ``<``, ``>``, ``&`` escaped,
text set with ``textContent`` only, a Content-Security-Policy that allows only the page's own script (by hash), no
network reference. Contexts are stored compactly: one token table for the test sentences and, per latent,
(sentence, position, value) triples in flat arrays.
"""

from __future__ import annotations

import base64
import hashlib
import html
import re
import shlex
from pathlib import Path

import numpy as np
import pandas as pd
from bertscope.experiments.explorer.page import script_json
from bertscope.experiments.features.labels import FAMILIES, MEANINGS, meaning

FILENAME = "feature_browser.html"

_SCRIPT = r"""
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("fb-data").textContent);
  var list = document.getElementById("fb-list"), count = document.getElementById("fb-count");
  var qLabel = document.getElementById("fb-label"), qToken = document.getElementById("fb-token");
  var qSite = document.getElementById("fb-site"), more = document.getElementById("fb-more");
  var PAGE = 60, shown = PAGE, matches = [];
  D.sites.forEach(function (s, i) {
    var o = document.createElement("option"); o.value = String(i); o.textContent = s.name; qSite.appendChild(o);
  });
  function el(tag, cls, text) {
    var e = document.createElement(tag); if (cls) e.className = cls; if (text !== undefined) e.textContent = text;
    return e;
  }
  function contextsOf(s, i) {
    var a = s.ctx_start[i], b = s.ctx_start[i + 1], out = [];
    for (var j = a; j < b; j++) out.push([s.ctx_sentence[j], s.ctx_position[j], s.ctx_value[j]]);
    return out;
  }
  function tokenAt(sent, pos) { var t = D.tokens[sent]; return t && pos < t.length ? t[pos] : ""; }
  function filter() {
    var site = D.sites[Number(qSite.value)], lab = qLabel.value.trim().toLowerCase();
    var tok = qToken.value.trim().toLowerCase();
    matches = [];
    for (var i = 0; i < site.density.length; i++) {
      if (site.density[i] <= 0) continue;
      if (lab && (site.label[i] || "").toLowerCase().indexOf(lab) < 0) continue;
      if (tok) {
        var hit = false, c = contextsOf(site, i);
        for (var j = 0; j < c.length && !hit; j++) hit = tokenAt(c[j][0], c[j][1]).toLowerCase() === tok;
        if (!hit) continue;
      }
      matches.push(i);
    }
    matches.sort(function (a, b) { return (site.mcc[b] || -1) - (site.mcc[a] || -1); });
    shown = PAGE; render();
  }
  function card(site, i) {
    var c = el("div", "fb-card"); c.setAttribute("data-latent", String(i));
    var h = el("div", "fb-head");
    h.appendChild(el("b", "", "latent " + i));
    h.appendChild(el("span", "fb-label", site.label[i] ? site.label[i] + " (test MCC " + site.mcc[i].toFixed(2) + ")"
                                                       : "no label"));
    if (site.labelled[i]) h.appendChild(el("span", "fb-badge", "labelled"));
    h.appendChild(el("span", "fb-muted", "density " + (100 * site.density[i]).toFixed(2) + "%"));
    c.appendChild(h);
    if (site.meaning && site.meaning[i]) c.appendChild(el("div", "fb-meaning", "label means: " + site.meaning[i]));
    var hist = el("div", "fb-hist"), counts = site.hist[i].split(" ").map(Number);
    var top = Math.max.apply(null, counts) || 1;
    counts.forEach(function (n) {
      var bar = el("span", "fb-bar"); bar.style.height = (2 + 28 * n / top) + "px"; bar.title = String(n);
      hist.appendChild(bar);
    });
    hist.title = "histogram of non-zero test activations, 0 to " + site.max_value[i].toFixed(2);
    c.appendChild(hist);
    if (site.promoted && site.promoted[i]) c.appendChild(el("div", "fb-promoted", "promotes: " + site.promoted[i]));
    if (site.explore) {
      var cmd = el("div", "fb-explore", "colour your text by it: ");
      cmd.appendChild(el("code", "", site.explore + " --latent " + i));
      c.appendChild(cmd);
    }
    contextsOf(site, i).forEach(function (x) {
      var row = el("div", "fb-ctx"), toks = D.tokens[x[0]] || [];
      row.appendChild(el("span", "fb-val", x[2].toFixed(2)));
      for (var p = Math.max(0, x[1] - 10); p < Math.min(toks.length, x[1] + 6); p++) {
        row.appendChild(el("span", p === x[1] ? "fb-tok fb-hi" : "fb-tok", toks[p]));
      }
      c.appendChild(row);
    });
    return c;
  }
  function render() {
    var site = D.sites[Number(qSite.value)];
    list.textContent = "";
    var frag = document.createDocumentFragment();
    matches.slice(0, shown).forEach(function (i) { frag.appendChild(card(site, i)); });
    list.appendChild(frag);
    count.textContent = matches.length + " latents match (" + Math.min(shown, matches.length) + " shown)";
    more.hidden = shown >= matches.length;
  }
  [qLabel, qToken].forEach(function (q) { q.addEventListener("input", filter); });
  qSite.addEventListener("change", filter);
  more.addEventListener("click", function () { shown += PAGE; render(); });
  document.getElementById("fb-model").textContent = D.model;
  filter();
  document.body.setAttribute("data-ready", "1");
  window.featureBrowser = {ready: true, readyMs: performance.now(), filter: filter};
})();
"""

_STYLE = """
body{font:14px system-ui,sans-serif;margin:1em;color:#222}.fb-muted{color:#777;margin-left:.8em}
.fb-controls label{margin-right:1em}.fb-card{border:1px solid #ddd;border-radius:4px;padding:.4em .6em;margin:.4em 0}
.fb-label{margin-left:.8em}.fb-badge{background:#2a7;color:#fff;border-radius:3px;padding:0 .3em;margin-left:.5em}
.fb-hist{display:flex;align-items:flex-end;height:32px;gap:1px;margin:.3em 0}.fb-bar{width:8px;background:#58a}
.fb-ctx{font-family:monospace;font-size:12px;white-space:nowrap;overflow:hidden}.fb-val{color:#a50;margin-right:.6em}
.fb-tok{margin-right:.25em}.fb-hi{background:#fd6;font-weight:bold}.fb-promoted{font-size:12px;color:#555}
.fb-explore{font-size:12px;color:#555}.fb-explore code{user-select:all}.fb-meaning{font-size:12px;color:#555}
.fb-glossary{font-size:12px;color:#444;margin:.5em 0}.fb-glossary dt{font-family:monospace;margin-top:.2em}
"""

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="{{csp}}">
<title>{{title}}</title>
<style>{{style}}</style>
</head>
<body>
<h1>{{title}}</h1>
<p><span id="fb-model"></span> <span class="fb-muted">labels: the concept with the best MCC on dev sentences; scores,
contexts and histograms: test sentences</span></p>
<details class="fb-glossary"><summary>What a label means</summary>
<p>A label is the known variable a latent best detects (a rule "fires / does not fire" on its activation, chosen
by MCC on dev). Families: {{families}}</p>
<dl>{{glossary}}</dl>
</details>
<div class="fb-controls">
<label>Site <select id="fb-site"></select></label>
<label>Label <input id="fb-label" type="search" placeholder="e.g. position, upos=NOUN"></label>
<label>Token <input id="fb-token" type="search" placeholder="a top context's token"></label>
<span id="fb-count" class="fb-muted"></span>
</div>
<div id="fb-list"></div>
<button type="button" id="fb-more" hidden>show more</button>
<script type="application/json" id="fb-data">{{data}}</script>
<script>{{script}}</script>
</body>
</html>
"""


def payload(latents: pd.DataFrame, contexts: pd.DataFrame, tokens: pd.DataFrame) -> dict:
    """The page's data from the three browser tables (compact: flat context arrays with per-latent offsets)."""
    sents = []
    if len(tokens):
        t = tokens.sort_values(["sentence", "position"])
        n = int(t["sentence"].max()) + 1
        sents = [[] for _ in range(n)]
        for s, g in t.groupby("sentence", sort=True):
            toks = [""] * (int(g["position"].max()) + 1)
            for p, tok in zip(g["position"], g["token"], strict=True):
                toks[int(p)] = str(tok)
            sents[int(s)] = toks
    sites = []
    for site, g in latents.groupby("site", sort=False):
        g = g.sort_values("latent")
        m = int(g["latent"].max()) + 1
        c = contexts[contexts["site"] == site].sort_values(["latent", "rank"])
        start = np.searchsorted(c["latent"].to_numpy(), np.arange(m + 1))
        mcc = g["test_mcc"].astype(float).round(3)
        folder = str(g["dictionary"].iloc[0]) if "dictionary" in g and pd.notna(g["dictionary"].iloc[0]) else ""
        sites.append({
            "name": str(site),
            "explore": explore_command(folder) if folder else "",
            "density": g["density"].astype(float).round(6).tolist(),
            "label": [None if pd.isna(x) else str(x) for x in g["label"]],
            "meaning": [None if pd.isna(x) else meaning(str(x)) for x in g["label"]],
            "mcc": [None if pd.isna(x) else float(x) for x in mcc],
            "labelled": [bool(x) for x in g["labelled"].fillna(False)],
            "hist": g["histogram"].astype(str).tolist(),
            "max_value": g["max_value"].astype(float).round(3).tolist(),
            "promoted": g["promoted"].fillna("").astype(str).tolist() if "promoted" in g else [],
            "ctx_start": start.tolist(),
            "ctx_sentence": c["sentence"].astype(int).tolist(),
            "ctx_position": c["position"].astype(int).tolist(),
            "ctx_value": c["value"].astype(float).round(3).tolist(),
        })
    model = str(latents["model"].iloc[0]) if "model" in latents and len(latents) else ""
    return {"model": model, "sites": sites, "tokens": sents}


def explore_command(folder: str) -> str:
    """The ``bertscope explore`` command (less ``--latent N``) that colours a text's tokens by a latent of the
    dictionary in ``folder`` (shell-quoted)."""
    return f'bertscope explore "YOUR TEXT" --dictionary {shlex.quote(folder)}'


def render(data: dict, title: str = "bertscope feature browser") -> str:
    """The whole HTML document for ``data`` (see `payload`)."""
    if re.search(r"</(script|style)", _SCRIPT + _STYLE, re.IGNORECASE):
        raise RuntimeError("the browser's script or style must not contain a closing tag")
    digest = base64.b64encode(hashlib.sha256(_SCRIPT.encode("utf-8")).digest()).decode("ascii")
    csp = f"default-src 'none'; script-src 'sha256-{digest}'; style-src 'unsafe-inline'"
    glossary = "".join(f"<dt>{html.escape(v)}</dt><dd>{html.escape(MEANINGS[v].format(v='…'))}</dd>"
                       for v in MEANINGS)
    families = "; ".join(f"{html.escape(f)}: {html.escape(', '.join(vs))}" for f, vs in FAMILIES.items())
    parts = {"title": html.escape(title), "style": _STYLE, "script": _SCRIPT, "csp": csp, "data": script_json(data),
             "glossary": glossary, "families": families}
    return re.sub(r"\{\{(\w+)\}\}", lambda m: parts[m.group(1)], _PAGE)


def write_browser(out_dir: Path) -> list[Path]:
    """``feature_browser.html`` from the saved browser tables in ``out_dir`` (nothing when they are absent)."""
    from bertscope.experiments.io import write_text

    out_dir = Path(out_dir)
    tables = {}
    for name in ("browser_latents", "browser_contexts", "browser_tokens"):
        path = out_dir / f"{name}.parquet"
        if not path.is_file():
            return []
        tables[name] = pd.read_parquet(path)
    doc = render(payload(tables["browser_latents"], tables["browser_contexts"], tables["browser_tokens"]))
    target = out_dir / FILENAME
    write_text(target, doc)
    return [target]
