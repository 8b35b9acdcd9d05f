"""The report's words: findings (from each experiment's ``findings(out_dir)``), figure captions (its
``CAPTIONS``) and notes as readable text. ``report.py`` lays the page out; this module only renders what the
experiments computed from their saved tables: no result is typed in here.

A ``findings`` that raises, or returns something other than a list of ``Finding``, becomes an error box naming
the experiment; the rest of the report is still written.
"""

from __future__ import annotations

import html
import importlib
import math
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertscope.experiments.findings import CLAIMS, Finding
from bertscope.experiments.registry import EXPERIMENTS

VERDICTS = {True: ("holds", "ok"), False: ("does not hold", "bad"), None: ("mixed / undecided", "warn")}
NOT_MEASURED = "not measured in this run"


@dataclass
class ExperimentWords:
    """What one experiment says about its own results: ``findings`` (possibly empty), ``captions`` (figure
    stem -> caption), ``error`` (why ``findings`` could not be read, or None), ``has_findings`` (whether the
    package defines ``findings`` at all)."""

    name: str
    findings: list[Finding] = field(default_factory=list)
    captions: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    has_findings: bool = False


def experiment_words(name: str, out_dir: Path) -> ExperimentWords:
    """Import the registered experiment ``name`` and call its optional ``findings(out_dir)`` and read its
    optional ``CAPTIONS``; never raises (an error is kept in ``.error``)."""
    words = ExperimentWords(name)
    if name not in EXPERIMENTS:
        return words
    try:
        module = importlib.import_module(EXPERIMENTS[name])
    except Exception as e:  # noqa: BLE001 - a broken package must not take the report down
        words.error = f"the package {EXPERIMENTS[name]} failed to import: {type(e).__name__}: {e}"
        return words
    captions = getattr(module, "CAPTIONS", None)
    if isinstance(captions, dict):
        words.captions = {str(k): str(v) for k, v in captions.items()}
    fn = getattr(module, "findings", None)
    if fn is None:
        return words
    words.has_findings = True
    try:
        found = fn(out_dir)
        if not isinstance(found, list) or not all(isinstance(f, Finding) for f in found):
            raise TypeError(f"findings() must return a list of Finding, got {type(found).__name__}")
        words.findings = found
    except Exception as e:  # noqa: BLE001
        last = traceback.extract_tb(e.__traceback__)[-1:] if e.__traceback__ else []
        where = f" (at {Path(last[0].filename).name}:{last[0].lineno})" if last else ""
        words.error = f"findings() failed: {type(e).__name__}: {e}{where}"
    return words


# ----------------------------------------------------------------------------------------------- findings


#: Below this many sentences a verdict carries a sample-size caveat (the smallest count an experiment used).
SMALL_SAMPLE = 100
#: Findings per experiment repeated at the top of the page, under "Every experiment".
LEADS_PER_EXPERIMENT = 2


@dataclass(frozen=True)
class SampleSize:
    """How many sentences an experiment measured on: ``smallest`` (the fewest any of its measures used, None
    when its manifest does not say) and ``text`` (each count with what it was used for)."""

    smallest: int | None
    text: str


def sample_size(manifest: dict[str, Any]) -> SampleSize:
    """The sentences an experiment used, read from its manifest's ``notes``: ``used`` (what the run measured on,
    `Context.record_used`: its counts, in its unit) when recorded; else (older manifests) ``n_sentences_used``,
    ``n_sentences``, ``n_<what>_sentences``, ``sentences`` / ``sentences_per_corpus`` dicts, a train/dev/test
    ``split``; else the corpus size."""
    notes = manifest.get("notes") or {}
    used = notes.get("used")
    if isinstance(used, dict) and isinstance(used.get("counts"), dict) and used["counts"]:
        parts = {str(k): int(v) for k, v in used["counts"].items() if _is_count(v)}
        if parts:
            unit = str(used.get("unit") or "sentences")
            text = "; ".join(f"{k.replace('_', ' ')} {n:,}" for k, n in parts.items())
            return SampleSize(min(parts.values()), text if unit == "sentences" else f"{unit}: {text}")
    counts: list[tuple[str, int]] = []
    for key in ("n_sentences_used", "n_sentences"):
        if _is_count(notes.get(key)):
            counts.append(("", int(notes[key])))
            break
    for key, value in notes.items():
        if key.startswith("n_") and key.endswith("_sentences") and key != "n_sentences" and _is_count(value):
            counts.append((key[2:-len("_sentences")].replace("_", " "), int(value)))
    for key in ("sentences", "sentences_per_corpus"):
        if isinstance(notes.get(key), dict):
            counts += [(str(k).replace("_", " "), int(v)) for k, v in notes[key].items() if _is_count(v)]
    split = notes.get("split")
    if isinstance(split, dict) and split and all(_is_count(v) for v in split.values()):
        counts.append(("", sum(int(v) for v in split.values())))
        counts += [(str(k), int(v)) for k, v in split.items()]
    if not counts:
        n = (manifest.get("corpus") or {}).get("n_sentences")
        return SampleSize(int(n), f"{int(n):,}") if _is_count(n) else SampleSize(None, "?")
    text = "; ".join(f"{what} {n:,}" if what else f"{n:,}" for what, n in counts)
    return SampleSize(min(n for _, n in counts), text)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def findings_section(words: list[tuple[str, ExperimentWords]], sizes: dict[str, SampleSize] | None = None) -> str:
    """The page-top Findings section: one entry per claim in ``CLAIMS``, answered by the findings whose
    ``claim`` is that key (with their verdicts and, on fewer than ``SMALL_SAMPLE`` sentences, a sample-size
    caveat), or "not measured in this run"; then every experiment's own leading findings; then any error
    boxes. ``words``: (anchor of the experiment's section, its words); ``sizes``: experiment name -> the
    sentences it used (``sample_size``)."""
    sizes = sizes or {}
    parts = ['<section id="findings"><h2>Findings</h2>']
    parts.append('<p class="muted">Each claim of the tutorials, and what this run measured about it; then what '
                 "every experiment found. The sentences are generated by the experiments from their saved "
                 "tables.</p>")
    for key, claim in CLAIMS.items():
        answers = [(anchor, w.name, f) for anchor, w in words for f in w.findings if f.claim == key]
        parts.append(f'<div class="claim" id="claim-{html.escape(key)}"><h3>{html.escape(key)}</h3>'
                     f'<p class="claimtext">{html.escape(claim)}</p>')
        if not answers:
            parts.append(f'<p class="verdict"><span class="badge none">{NOT_MEASURED}</span></p>')
        else:
            parts.append(f'<p class="verdict">{verdict_badge(_overall(a[2] for a in answers))}</p>')
            parts.append(sample_caveat({a[1]: sizes[a[1]] for a in answers if a[1] in sizes}))
            parts.append("<ul>")
            for anchor, name, f in answers:
                parts.append(f"<li>{verdict_badge(f.holds)} {html.escape(f.text)} "
                             f'<a class="muted" href="#{html.escape(anchor)}">({html.escape(name)})</a></li>')
            parts.append("</ul>")
        parts.append("</div>")
    parts.append(_leads(words, sizes))
    parts += [error_box(w) for _, w in words if w.error]
    parts.append("</section>")
    return "\n".join(parts)


def sample_caveat(sizes: dict[str, SampleSize]) -> str:
    """A visible caveat when the experiments behind a verdict used fewer than ``SMALL_SAMPLE`` sentences
    (empty otherwise), naming each one's count."""
    small = {name: s for name, s in sizes.items() if s.smallest is not None and s.smallest < SMALL_SAMPLE}
    if not small:
        return ""
    fewest = min(s.smallest for s in small.values())
    which = "; ".join(f"{name}: {s.text}" for name, s in small.items())
    return (f'<p class="caveat">Sample-size caveat: this verdict rests on as few as {fewest:,} sentences '
            f"({html.escape(which)}), under the {SMALL_SAMPLE} below which intervals are wide and a choice "
            "made on half the sentences is unstable; rerun on more sentences (a larger --max-sentences or "
            "corpus) before relying on it.</p>")


def _leads(words: list[tuple[str, ExperimentWords]], sizes: dict[str, SampleSize]) -> str:
    """Every experiment's first findings that answer no claim (mixing and structure answer none), with the
    sentences it used."""
    items = []
    for anchor, w in words:
        own = [f for f in w.findings if f.claim is None]
        if not own:
            continue
        size = sizes.get(w.name)
        used = f" ({size.text} sentences)" if size is not None and size.smallest is not None else ""
        more = len(own) - LEADS_PER_EXPERIMENT
        tail = f' <span class="muted">{more} more in its section.</span>' if more > 0 else ""
        sentences = " ".join(html.escape(f.text) for f in own[:LEADS_PER_EXPERIMENT])
        items.append(f'<li><a href="#{html.escape(anchor)}"><b>{html.escape(w.name)}</b></a>'
                     f'<span class="muted">{html.escape(used)}</span>: {sentences}{tail}</li>')
    if not items:
        return ""
    return f'<div class="leads" id="every-experiment"><h3>Every experiment</h3><ul>{"".join(items)}</ul></div>'


def experiment_findings(words: ExperimentWords, size: SampleSize | None = None) -> str:
    """The Findings paragraph at the top of one experiment's section (empty when it states none), with the
    sample-size caveat when it gives a verdict on fewer than ``SMALL_SAMPLE`` sentences (``size``)."""
    parts = []
    if words.error:
        parts.append(error_box(words))
    if size is not None and any(f.claim for f in words.findings):
        parts.append(sample_caveat({words.name: size}))
    if words.findings:
        items = "".join(
            f"<li>{verdict_badge(f.holds) + ' ' if f.claim else ''}{html.escape(f.text)}"
            + (f' <span class="muted">(claim: {html.escape(f.claim)})</span>' if f.claim else "")
            + "</li>"
            for f in words.findings
        )
        parts.append(f'<div class="findings"><h3>Findings</h3><ul>{items}</ul></div>')
    elif words.has_findings and not words.error:
        parts.append('<p class="muted">Findings: this experiment stated none for this run.</p>')
    return "\n".join(parts)


def verdict_badge(holds: bool | None) -> str:
    """A coloured badge: holds / does not hold / mixed."""
    label, kind = VERDICTS[holds]
    return f'<span class="badge {kind}">{label}</span>'


def error_box(words: ExperimentWords) -> str:
    """A visible box saying the experiment's findings could not be read, and why."""
    return (f'<div class="errorbox"><strong>{html.escape(words.name)}</strong>: its findings could not be '
            f"read. {html.escape(words.error or '')}</div>")


def _overall(findings) -> bool | None:
    verdicts = {f.holds for f in findings}
    return verdicts.pop() if len(verdicts) == 1 else None


# ----------------------------------------------------------------------------------------------- captions


def figure_caption(stem: str, captions: dict[str, str]) -> str:
    """The caption for the figure ``stem``: the experiment's, or a title derived from the file name with a
    visible "no caption" marker."""
    if stem in captions:
        return f'<span class="caption">{html.escape(captions[stem])}</span>'
    title = html.escape(title_from_stem(stem))
    return f'<span class="caption">{title}</span> <span class="nocaption">no caption</span>'


def title_from_stem(stem: str) -> str:
    """``fig_argmax_offset`` -> ``Argmax offset``."""
    words = [w for w in stem.replace("-", "_").split("_") if w]
    if words and words[0].lower() in ("fig", "figure"):
        words = words[1:]
    text = " ".join(words) or stem
    return text[:1].upper() + text[1:]


# ----------------------------------------------------------------------------------------------- notes


def notes_html(notes: dict[str, Any], settings: dict[str, Any] | None = None) -> str:
    """The manifest's ``notes`` as a bullet list of sentences: ``n_sentences_used: 12`` -> "N sentences used:
    12."; lists of scalars are joined, dicts become nested lists. Each thing is listed once: the settings
    (``settings``, or the notes' own ``settings`` entry) as one line first, and a note that only repeats a
    setting with the same value is left out."""
    notes = dict(notes)
    settings = settings if isinstance(settings, dict) and settings else notes.get("settings")
    if isinstance(notes.get("settings"), dict) and (settings is None or notes["settings"] == settings):
        notes.pop("settings")
    items = []
    if isinstance(settings, dict) and settings:
        notes = {k: v for k, v in notes.items() if not (k in settings and settings[k] == v)}
        items.append(f"<li>Settings: {_inline_dict(settings)}.</li>")
    items += [_note_item(k, v) for k, v in notes.items()]
    return f'<ul class="notes">{"".join(items)}</ul>'


def _note_item(key: Any, value: Any, depth: int = 0) -> str:
    label = html.escape(_humanise(str(key)))
    if isinstance(value, dict) and value and depth < 3:
        inner = "".join(_note_item(k, v, depth + 1) for k, v in value.items())
        return f"<li>{label}:<ul>{inner}</ul></li>"
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value) and depth < 3:
        inner = "".join(f"<li>{_inline_dict(v)}</li>" for v in value[:30])
        more = f"<li>… {len(value) - 30} more</li>" if len(value) > 30 else ""
        return f"<li>{label}:<ul>{inner}{more}</ul></li>"
    text = _value_text(value)
    if isinstance(value, str) and len(value) > 40:  # a sentence the experiment wrote
        end = "" if value.rstrip().endswith((".", "!", "?", ":")) else "."
        return f"<li>{label}: {html.escape(text)}{end}</li>"
    return f"<li>{label}: <b>{html.escape(text)}</b></li>"


def _inline_dict(d: dict) -> str:
    return html.escape("; ".join(f"{_humanise(str(k))} {_value_text(v)}" for k, v in d.items()))


def _value_text(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value):
            return "n/a"
        return f"{value:,.0f}" if value.is_integer() and abs(value) >= 1000 else f"{value:.4g}"
    if value is None:
        return "none"
    if isinstance(value, (list, tuple)):
        shown = ", ".join(_value_text(v) for v in value[:20])
        return shown + (f", … ({len(value)} in all)" if len(value) > 20 else "") if value else "none"
    if isinstance(value, dict):
        return "; ".join(f"{_humanise(str(k))} {_value_text(v)}" for k, v in value.items()) or "none"
    return str(value)


_ACRONYMS = {"ci": "CI", "cls": "[CLS]", "sep": "[SEP]", "mlm": "MLM", "mdl": "MDL", "qk": "QK", "id": "id"}


def _humanise(key: str) -> str:
    words = [_ACRONYMS.get(w.lower(), w) for w in key.replace("_", " ").split()]
    text = " ".join(words)
    return text[:1].upper() + text[1:] if text else key


CSS = """
.claim { border-left: 4px solid #ccc; padding: .2em 1em; margin: .8em 0; }
.claim h3 { margin: .2em 0; } .claimtext { font-style: italic; color: #333; margin: .2em 0; }
.verdict { margin: .3em 0; } .badge.none { background: #e8e8e8; color: #444; }
.findings { background: #f6f9ff; border: 1px solid #d5e2f5; padding: .3em 1em; margin: .6em 0; }
.errorbox { background: #fbd5d5; border: 1px solid #e09a9a; color: #6b0d0d; padding: .5em 1em; margin: .6em 0; }
table.explore td:nth-child(3) { text-align: left; }
.caveat { background: #fff1c2; color: #5a4300; padding: .2em .6em; margin: .3em 0; font-size: 13px; }
.leads li { margin: .3em 0; }
.caption { color: #222; font-size: 13px; } .nocaption { background: #fff1c2; color: #7a5a00; font-size: 11px;
  padding: 0 6px; border-radius: 6px; } ul.notes { margin: .3em 0 1em; }
"""
