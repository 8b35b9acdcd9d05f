"""Fonts that cover the text a figure draws (token labels in any script), and one clear warning when none does.

matplotlib draws a character its font lacks as an empty box (and warns once per glyph). ``cover_figure(fig)``,
called by ``io.save_figure`` before a figure is written, finds the characters the figure's texts hold that the
default font lacks and gives those texts a fallback list of installed fonts that have them (preferring the
Noto CJK families, then any installed font, searched once per process, including fonts installed after
matplotlib's font cache was built). When no installed font covers some characters it warns once per process,
naming them and what to install (Debian/Ubuntu: ``apt-get install fonts-noto-cjk``), and the figure is still
written.
"""

from __future__ import annotations

import functools
import unicodedata
import warnings
from collections.abc import Iterable
from typing import Any

#: Families tried first for characters the default font lacks (CJK first: the commonest gap), then every
#: other installed font.
PREFERRED = (
    "Noto Sans CJK JP", "Noto Sans CJK SC", "Noto Sans CJK TC", "Noto Sans CJK KR", "Noto Sans CJK HK",
    "Noto Serif CJK JP", "Source Han Sans", "WenQuanYi Zen Hei", "Droid Sans Fallback", "Noto Sans",
)  # fmt: skip
#: Fonts whose glyphs are placeholders for whole Unicode blocks (matplotlib ships "Last Resort"): they "cover"
#: every character with a box, so they never count.
PLACEHOLDER_FONTS = ("Last Resort",)
INSTALL_HINT = (
    "install a font that covers them (Debian/Ubuntu: `apt-get install fonts-noto-cjk` for Chinese, Japanese and "
    "Korean; other scripts: the matching fonts-noto-* package), then rerun `bertscope run` or call `plot` again"
)


class MissingGlyphWarning(UserWarning):
    """No installed font has some characters a figure draws: they appear as empty boxes."""


_warned: set[str] = set()


def cover_figure(fig: Any) -> list[str]:
    """Give every text of ``fig`` whose characters the default font lacks a fallback list of fonts that have
    them; returns the fallback families used (empty when none were needed). Warns once per process
    (``MissingGlyphWarning``) about characters no installed font covers."""
    from matplotlib.text import Text

    texts = [t for t in fig.findobj(Text) if t.get_text()]
    needed = {c for t in texts for c in t.get_text() if _drawable(c)}
    if not needed:
        return []
    families, uncovered = fallback_families(needed)
    if families:
        for t in texts:
            if any(c in needed and not _in_default(c) for c in t.get_text()):
                t.set_fontfamily([*_as_list(t.get_fontfamily()), *families])
    if uncovered:
        _warn_missing(uncovered)
    return families


def fallback_families(chars: Iterable[str]) -> tuple[list[str], set[str]]:
    """``(families, uncovered)``: installed font families that together cover the characters of ``chars`` the
    default font lacks, in the order to try them, and the characters none covers."""
    missing = {c for c in chars if _drawable(c) and not _in_default(c)}
    families: list[str] = []
    for rescanned in (False, True):
        if not missing:
            break
        if rescanned and not _rescan_system_fonts():
            break
        for family, codepoints in _candidates(rescanned):
            got = {c for c in missing if ord(c) in codepoints}
            if got:
                families.append(family)
                missing -= got
            if not missing:
                break
    return families, missing


def covered_by(family: str, chars: Iterable[str]) -> bool:
    """Whether the installed font ``family`` has a glyph for every character of ``chars``."""
    for name, codepoints in _candidates(True):
        if name == family:
            return all(ord(c) in codepoints for c in chars if _drawable(c))
    return False


def _warn_missing(uncovered: set[str]) -> None:
    scripts = sorted({_script(c) for c in uncovered})
    key = ",".join(scripts)
    if key in _warned:
        return
    _warned.add(key)
    sample = "".join(sorted(uncovered)[:8])
    warnings.warn(
        f"figures: no installed font covers {len(uncovered)} characters of the text ({', '.join(scripts)}; "
        f"e.g. {sample!r}); they are drawn as empty boxes: {INSTALL_HINT}",
        MissingGlyphWarning,
        stacklevel=3,
    )
    warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from font")  # said once, above


def _drawable(c: str) -> bool:
    return not c.isspace() and unicodedata.category(c) not in ("Cc", "Cf", "Zl", "Zp")


def _script(c: str) -> str:
    name = unicodedata.name(c, "UNKNOWN")
    for word in ("CJK", "HIRAGANA", "KATAKANA", "HANGUL", "ARABIC", "HEBREW", "DEVANAGARI", "THAI", "CYRILLIC",
                 "GREEK", "BENGALI", "TAMIL", "ETHIOPIC", "GEORGIAN", "ARMENIAN"):  # fmt: skip
        if word in name:
            return {"CJK": "Chinese/Japanese characters"}.get(word, word.capitalize())
    return name.split(" ")[0].capitalize()


def _as_list(family: Any) -> list[str]:
    return [family] if isinstance(family, str) else list(family)


@functools.cache
def _default_codepoints() -> frozenset[int]:
    from matplotlib import font_manager

    path = font_manager.findfont(font_manager.FontProperties(family=_default_family()), fallback_to_default=True)
    return _charmap(path)


def _default_family() -> str:
    import matplotlib

    family = matplotlib.rcParams["font.family"][0]
    names = matplotlib.rcParams.get(f"font.{family}", [family])
    return names[0] if names else family


def _in_default(c: str) -> bool:
    return ord(c) in _default_codepoints()


def _candidates(rescanned: bool) -> Iterable[tuple[str, frozenset[int]]]:
    """``(family, code points)`` of each installed font family, ``PREFERRED`` first (one file per family),
    each font file read only when reached."""
    for family, path in _family_files(rescanned):
        codepoints = _charmap(path)
        if codepoints:
            yield family, codepoints


@functools.lru_cache(maxsize=2)
def _family_files(rescanned: bool) -> tuple[tuple[str, str], ...]:
    from matplotlib import font_manager

    files: dict[str, str] = {}
    for entry in font_manager.fontManager.ttflist:
        if entry.style == "normal" and entry.name not in files and not entry.name.startswith(PLACEHOLDER_FONTS):
            files[entry.name] = entry.fname
    order = [f for f in PREFERRED if f in files] + sorted(f for f in files if f not in PREFERRED)
    return tuple((f, files[f]) for f in order)


@functools.cache
def _charmap(path: str) -> frozenset[int]:
    from matplotlib.ft2font import FT2Font

    try:
        return frozenset(FT2Font(path).get_charmap())
    except (OSError, RuntimeError, ValueError):  # an unreadable font file is skipped
        return frozenset()


@functools.lru_cache(maxsize=1)
def _rescan_system_fonts() -> bool:
    """Add system fonts matplotlib's cached font list does not know (installed after the cache was built);
    True when any was added."""
    from matplotlib import font_manager

    known = {e.fname for e in font_manager.fontManager.ttflist}
    added = False
    for path in font_manager.findSystemFonts(fontext="ttf") + font_manager.findSystemFonts(fontext="otf"):
        if path not in known:
            try:
                font_manager.fontManager.addfont(path)
                added = True
            except (OSError, RuntimeError, ValueError):
                continue
    return added
