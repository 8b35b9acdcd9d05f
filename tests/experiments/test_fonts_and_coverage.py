"""Non-Latin text (issue 27.8): figures draw CJK token labels with a font that has them, or warn once saying
what to install; a corpus that is mostly [UNK] for the model's vocabulary is flagged with its share and a
model that covers the script."""

from __future__ import annotations

import warnings
from pathlib import Path

import matplotlib
import pytest
from bertscope.experiments import fonts, io
from bertscope.experiments.corpus import coverage

matplotlib.use("Agg")

CJK = "猫が座った 東京"
ETHIOPIC = ["ኢትዮጵያ ሀገር ናት", "ሰላም ለዓለም"]


def _figure(text: str):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(3, 2))
    ax.set_title(f"{text} cat")
    ax.set_xticks([0, 1], text.split()[:2])
    return fig


def _save(fig, base: Path) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert io.save_figure(fig, base, formats=("png", "pdf"))
    return caught


def test_cjk_labels_are_drawn_with_a_font_that_has_them(tmp_path: Path):
    families, uncovered = fonts.fallback_families(set(CJK))
    if uncovered:
        pytest.skip("no installed font covers CJK (Debian: apt-get install fonts-noto-cjk; .ci/run installs it)")
    fig = _figure(CJK)
    title = fig.axes[0].title
    caught = _save(fig, tmp_path / "cjk")
    assert not [w for w in caught if "missing from font" in str(w.message)]  # were one warning per glyph
    assert not [w for w in caught if issubclass(w.category, fonts.MissingGlyphWarning)]
    assert any(fonts.covered_by(f, CJK) for f in title.get_fontfamily())
    assert (tmp_path / "cjk.png").stat().st_size > 0 and (tmp_path / "cjk.pdf").stat().st_size > 0


def test_latin_text_keeps_the_default_font(tmp_path: Path):
    fig = _figure("The cat sat")
    before = list(fig.axes[0].title.get_fontfamily())
    assert fonts.cover_figure(fig) == [] and list(fig.axes[0].title.get_fontfamily()) == before
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_without_a_covering_font_one_warning_says_what_to_install(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(fonts, "_family_files", lambda rescanned: ())  # no font has anything
    monkeypatch.setattr(fonts, "_rescan_system_fonts", lambda: False)
    monkeypatch.setattr(fonts, "_warned", set())
    caught = _save(_figure(CJK), tmp_path / "a") + _save(_figure(CJK), tmp_path / "b")
    ours = [w for w in caught if issubclass(w.category, fonts.MissingGlyphWarning)]
    assert len(ours) == 1  # once per process, not once per glyph and figure
    assert "apt-get install fonts-noto-cjk" in str(ours[0].message)
    assert "Chinese/Japanese characters" in str(ours[0].message) and "Hiragana" in str(ours[0].message)
    assert (tmp_path / "a.png").is_file() and (tmp_path / "b.png").is_file()  # the figures are still written


# ------------------------------------------------------------------------------------------------ [UNK]


def test_unk_share_counts_the_unknown_pieces(tokenizer):
    share, pieces, scripts = coverage.unk_share(tokenizer, ETHIOPIC)
    expected = [i for w in " ".join(ETHIOPIC).split() for i in tokenizer(w, add_special_tokens=False)["input_ids"]]
    assert pieces == len(expected) and share == pytest.approx(expected.count(tokenizer.unk_token_id) / len(expected))
    assert share == 1.0 and set(scripts) == {"ETHIOPIC"}
    assert coverage.unk_share(tokenizer, ["The cat sat on the mat."])[0] == 0.0


def test_a_mostly_unknown_corpus_is_flagged_with_its_share_and_a_model_that_covers_it(tokenizer):
    message = coverage.unk_warning(tokenizer, ETHIOPIC, "minilm")
    assert message.startswith("100% of the corpus's 5 word pieces are [UNK] for minilm's vocabulary")
    assert "Ethiopic" in message and "bert-base-multilingual-cased" in message
    assert coverage.unk_warning(tokenizer, ["The cat sat on the mat and the dog barked ."]) is None
    # one unknown word among many known ones stays under the threshold
    assert coverage.unk_warning(tokenizer, ["ሰላም and the cat sat on the mat"]) is None


def test_prepare_inputs_warns_about_a_mostly_unknown_corpus(tmp_path: Path, tiny_model_dir: Path):
    from bertscope.experiments.options import RunOptions, prepare_inputs

    path = tmp_path / "am.txt"
    path.write_text("\n".join(ETHIOPIC) + "\n", encoding="utf-8")
    with pytest.warns(coverage.UnknownTokensWarning, match=r"100% of the corpus's .* \[UNK\]"):
        prepare_inputs(RunOptions(model=str(tiny_model_dir), corpus=str(path), device="cpu", out=tmp_path / "o"))
