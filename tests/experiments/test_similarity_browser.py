"""The explorer's pair view (``explorer.similarity``) in a real Chromium: hovering a token of one text colours every
token of the other by that token pair's attribution, read back from the page; markup in a text stays text.
Skips, saying why, without Chromium (the session fixture of test_explorer_browser.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from bertscope.experiments.explorer import similarity as pair_view
from test_explorer_browser import browser  # noqa: F401  (the session's Chromium fixture)

XSS = "<img src=x onerror=\"window.__pwned=1\">"
TOKENS_A = ["[CLS]", "the", "cat", XSS, "[SEP]"]
TOKENS_B = ["[CLS]", "a", "cat", "sat", "[SEP]"]


def _matrices() -> tuple[pd.DataFrame, np.ndarray]:
    values = np.arange(len(TOKENS_A) * len(TOKENS_B), dtype=float).reshape(len(TOKENS_A), -1) / 10 - 1.0
    values[2, 2] = 3.0  # cat/cat, the planted largest pair
    rows = [{"pair": 7, "method": "integrated-jacobians", "i": i, "token_a": ta, "j": j, "token_b": tb,
             "value": float(values[i, j]), "score": 0.8, "target": float(values.sum()), "error": 0.0}
            for i, ta in enumerate(TOKENS_A) for j, tb in enumerate(TOKENS_B)]
    rows += [{**r, "method": "occlusion", "value": -r["value"]} for r in rows]
    return pd.DataFrame(rows), values


def _page(tmp_path: Path) -> tuple[Path, np.ndarray]:
    matrices, values = _matrices()
    pairs = pd.DataFrame({"id": [7], "a": [f"the cat {XSS}"], "b": ["a cat sat"], "score": [4.2]})
    path = pair_view.save(matrices, pairs, tmp_path / "pairs.html", title=f"tiny {XSS}")
    return path, values


def _hover(browser, side: str, index: int) -> None:  # noqa: F811
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    el = browser.find_element(By.CSS_SELECTOR, f'#sp-{side} .sp-tok[data-index="{index}"]')
    ActionChains(browser).move_to_element(el).perform()


def _values(browser, side: str) -> list[float]:  # noqa: F811
    from selenium.webdriver.common.by import By

    return [float(e.get_attribute("data-value")) for e in browser.find_elements(By.CSS_SELECTOR,
                                                                                 f"#sp-{side} .sp-tok")]


def test_hover_shows_each_token_pairs_attribution(browser, tmp_path: Path) -> None:  # noqa: F811
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    path, values = _page(tmp_path)
    browser.get(path.as_uri())
    assert [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#sp-a .sp-tok")] == TOKENS_A
    _hover(browser, "a", 2)  # "cat" of text a: its row
    assert np.allclose(_values(browser, "b"), values[2], atol=1e-6)
    hover = browser.find_element(By.ID, "sp-hover").text
    assert "'cat'" in hover and "+3.0000" in hover
    strongest = browser.find_element(By.CSS_SELECTOR, '#sp-b .sp-tok[data-index="2"]')
    assert "rgb(214, 39, 40)" in strongest.get_attribute("style")  # the largest |value|: full red, opaque
    _hover(browser, "b", 3)  # "sat" of text b: its column
    assert np.allclose(_values(browser, "a"), values[:, 3], atol=1e-6)
    Select(browser.find_element(By.ID, "sp-method")).select_by_value("occlusion")
    _hover(browser, "a", 2)
    assert np.allclose(_values(browser, "b"), -values[2], atol=1e-6)
    assert "gold 4.2" in browser.find_element(By.ID, "sp-scores").text


def test_markup_in_a_text_shows_as_text_and_never_runs(browser, tmp_path: Path) -> None:  # noqa: F811
    from selenium.webdriver.common.by import By

    path, _ = _page(tmp_path)
    browser.get(path.as_uri())
    _hover(browser, "a", 3)
    assert browser.execute_script("return window.__pwned === undefined")
    assert not browser.find_elements(By.CSS_SELECTOR, "#sp-root img")
    assert browser.find_element(By.CSS_SELECTOR, '#sp-a .sp-tok[data-index="3"]').text == XSS
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors


def test_payload_keeps_the_matrix_and_marks_special_tokens() -> None:
    matrices, values = _matrices()
    data = pair_view.payload(matrices, title="t")
    (pair,) = data["pairs"]
    assert data["methods"] == ["integrated-jacobians", "occlusion"]
    assert np.allclose(pair["matrices"]["integrated-jacobians"]["values"], values)
    assert pair["matrices"]["integrated-jacobians"]["vmax"] == 3.0
    assert pair["special_a"] == [True, False, False, False, True] and pair["gold"] is None
