"""The explorer's latent view in real headless Chromium (the explorer's browser fixture): a planted latent that
fires on "cat" colours exactly the "cat" tokens, the value shows on hover, the legend's scale is the largest
value, switching latents recolours, and a dictionary folder named with markup stays text."""

from __future__ import annotations

import numpy as np
import pytest
from bertscope.experiments import explorer
from test_explorer_browser import browser, by_css, choose, open_page, problems  # noqa: F401
from test_explorer_latents import TEXTS, planted

MARKUP = "d<img src=x onerror=window.__pwned=1>"


@pytest.fixture(scope="module")
def latent_page(tiny_config, tokenizer, tmp_path_factory):
    from bertscope import models

    model = models.random_encoder(tiny_config, seed=3, tokenizer=tokenizer)
    root = tmp_path_factory.mktemp("latent_view")
    folder, value = planted(model, root / MARKUP)
    view = explorer.explore(model, TEXTS, dictionary=folder, latents=[1, 0])
    return view.save(root / "latents.html"), view, value


def backgrounds(driver) -> list[tuple[str, str, float]]:
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('#bs-lt-tokens .bs-lt')).map(function (e) {"
        " return [e.textContent, getComputedStyle(e).backgroundColor, Number(e.dataset.value)]; })")


def test_latent_view_colours_exactly_the_planted_token(browser, latent_page):  # noqa: F811
    path, view, value = latent_page
    open_page(browser, path)
    assert problems(browser) == []
    assert by_css(browser, "#bs-latentview").is_displayed()
    for s in range(len(TEXTS)):
        choose(browser, "bs-sentence", str(s))
        rows = backgrounds(browser)
        assert [r[0] for r in rows] == view.payload["sentences"][s]["tokens"]
        coloured = [r[1] not in ("rgba(0, 0, 0, 0)", "transparent") for r in rows]
        assert coloured == [r[0] == "cat" for r in rows]
        assert any(coloured)
        np.testing.assert_allclose([r[2] for r in rows if r[0] == "cat"], value, rtol=1e-3)
    # the largest value is full colour; the legend states it
    assert all(r[1] == "rgb(230, 97, 1)" for r in rows if r[0] == "cat")
    assert by_css(browser, "#bs-lt-max").text == f"{value:.3f}"
    assert not browser.execute_script("return window.__pwned")
    assert MARKUP in by_css(browser, "#bs-lt-where").text  # the folder's name, as text


def test_hover_shows_the_value_and_switching_latents_recolours(browser, latent_page):  # noqa: F811
    from selenium.webdriver.common.action_chains import ActionChains

    path, _, value = latent_page
    open_page(browser, path)
    cat = next(e for e in browser.find_elements("css selector", "#bs-lt-tokens .bs-lt") if e.text == "cat")
    ActionChains(browser).move_to_element(cat).perform()
    hover = by_css(browser, "#bs-hover").text
    assert hover.startswith("latent 1 at 'cat'") and f"{value:.3f}" in hover
    assert cat.get_attribute("title") == f"cat: {value:.3f}"
    choose(browser, "bs-latent", "1")  # latent 0 never fires
    assert all(r[1] in ("rgba(0, 0, 0, 0)", "transparent") for r in backgrounds(browser))
    assert "does not fire" in by_css(browser, "#bs-lt-max").text
    assert browser.execute_script("return window.bertscopeExplorer.latent.id") == 0


def test_pages_without_a_dictionary_hide_the_latent_view(browser, tiny_config, tokenizer, tmp_path):  # noqa: F811
    from bertscope import models

    model = models.random_encoder(tiny_config, seed=3, tokenizer=tokenizer)
    path = explorer.explore(model, TEXTS[:1]).save(tmp_path / "plain.html")
    open_page(browser, path)
    assert not by_css(browser, "#bs-latentview").is_displayed()
    assert problems(browser) == []
