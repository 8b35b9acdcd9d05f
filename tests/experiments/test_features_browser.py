"""The feature browser in a real headless Chromium (the explorer's browser fixture): it renders latents from the
saved tables, searches by label and by token, and text from a corpus cannot run script."""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
import pytest
from bertscope.experiments.features import browser as B
from test_explorer_browser import browser  # noqa: F401  (the session's Chromium fixture)

XSS = "</script><img src=x onerror=window.__pwned=1>"


def tables() -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    tokens = pd.DataFrame({"sentence": [0] * 5 + [1] * 4, "position": [0, 1, 2, 3, 4, 0, 1, 2, 3],
                           "token": ["[CLS]", "the", "cat", "the", "[SEP]", "[CLS]", XSS, "<b>dog</b>", "[SEP]"]})
    latents = pd.DataFrame({"site": "blocks.0.hook_resid_post", "latent": [0, 1, 2, 3],
                            "density": [0.1, 0.2, 0.0, 0.05],
                            "max_value": [2.0, 1.0, 0.0, 3.0], "histogram": ["1 2 3", "0 1 0", "0 0 0", "4 0 1"],
                            "promoted": ["", "", "", XSS],
                            "label": ["repeats_earlier", "position=1", None, "upos=NOUN"],
                            "test_mcc": [0.9, 0.6, float("nan"), 0.2], "labelled": [True, True, False, False],
                            "encoder": "trained", "model": "tiny <model>"})
    contexts = pd.DataFrame({"site": "blocks.0.hook_resid_post", "latent": [0, 1, 1, 3], "rank": [0, 0, 1, 0],
                             "sentence": [0, 0, 1, 1], "position": [3, 1, 1, 2], "value": [2.0, 1.0, 0.5, 3.0]})
    return latents, contexts, tokens


def open_page(driver, path: Path, timeout: float = 30.0) -> float:
    driver.get(path.as_uri())
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if driver.execute_script("return !!(window.featureBrowser && window.featureBrowser.ready)"):
            return float(driver.execute_script("return window.featureBrowser.readyMs"))
        time.sleep(0.05)
    raise AssertionError(f"page not ready after {timeout} s; console: {driver.get_log('browser')}")


def cards(driver) -> list[str]:
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('.fb-card')).map(c => c.getAttribute('data-latent'))")


def test_feature_browser_lists_searches_and_escapes(browser, tmp_path: Path) -> None:  # noqa: F811
    page = B.render(B.payload(*tables()))
    assert "http://" not in page and "https://" not in page and XSS not in page
    path = tmp_path / "fb.html"
    path.write_text(page)
    open_page(browser, path)
    assert cards(browser) == ["0", "1", "3"]  # alive latents, best test MCC first; the dead one is not listed
    assert not browser.execute_script("return window.__pwned")
    assert XSS in browser.execute_script("return document.body.textContent")  # shown as text
    highlighted = browser.execute_script(
        "return Array.from(document.querySelectorAll('[data-latent=\"0\"] .fb-hi')).map(e => e.textContent)")
    assert highlighted == ["the"]
    browser.execute_script("var q = document.getElementById('fb-label'); q.value = 'position';"
                           "q.dispatchEvent(new Event('input'))")
    assert cards(browser) == ["1"]
    browser.execute_script("var q = document.getElementById('fb-label'); q.value = '';"
                           "q.dispatchEvent(new Event('input'));"
                           "var t = document.getElementById('fb-token'); t.value = '<b>dog</b>';"
                           "t.dispatchEvent(new Event('input'))")
    assert cards(browser) == ["3"]
    severe = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, severe


def test_payload_is_compact_and_complete() -> None:
    data = B.payload(*tables())
    site = data["sites"][0]
    assert site["ctx_start"] == [0, 1, 3, 3, 4] and site["ctx_value"] == [2.0, 1.0, 0.5, 3.0]
    assert data["tokens"][1][1] == XSS and site["label"][2] is None


@pytest.mark.parametrize("name", ["browser_latents", "browser_contexts", "browser_tokens"])
def test_write_browser_needs_every_table(tmp_path: Path, name: str) -> None:
    for n, t in zip(["browser_latents", "browser_contexts", "browser_tokens"], tables(), strict=True):
        if n != name:
            t.to_parquet(tmp_path / f"{n}.parquet")
    assert B.write_browser(tmp_path) == []


def test_each_latent_gives_the_explore_command_that_colours_by_it(browser, tmp_path: Path) -> None:  # noqa: F811
    latents, contexts, tokens = tables()
    folder = "my results/features/dictionaries/blocks.0.hook_resid_post<b>"
    page = B.render(B.payload(latents.assign(dictionary=folder), contexts, tokens))
    path = tmp_path / "fb.html"
    path.write_text(page)
    open_page(browser, path)
    commands = browser.execute_script(
        "return Array.from(document.querySelectorAll('.fb-card')).map(c => "
        "[c.getAttribute('data-latent'), c.querySelector('.fb-explore code').textContent])")
    quoted = "'my results/features/dictionaries/blocks.0.hook_resid_post<b>'"  # shell-quoted, shown as text
    assert commands == [[i, f'bertscope explore "YOUR TEXT" --dictionary {quoted} --latent {i}'] for i in "013"]
    assert browser.execute_script("return document.querySelectorAll('.fb-card b').length") == 3  # headers only
    # Without a dictionary column (older tables) no command is shown.
    path.write_text(B.render(B.payload(*tables())))
    open_page(browser, path)
    assert not browser.execute_script("return document.querySelector('.fb-explore')")
