"""The explorer page in a real browser: Chromium from the system package manager, driven by selenium.

The session fixture uses the system's ``chromium`` and ``chromedriver``; when they are missing and we are root
on a Debian-like system it installs them with ``apt-get install chromium chromium-driver`` (nothing is
downloaded from anywhere else: selenium-manager runs offline and gets the driver's path). Without a browser
the tests skip and say why. Screenshots of each view go to ``$BERTSCOPE_SCREENSHOTS`` (default: a pytest temp
folder, printed).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from bertscope.experiments import explorer
from bertscope.experiments.explorer import data
from helpers import corpus_texts

XSS = (
    "</script><img src=x onerror=alert(1)> <img src=x onerror=\"window.__pwned=1\"> "
    "<script>window.__pwned=2</script> & \u2028 done"
)
TEXTS = ["The cat sat on the mat because it was tired.", XSS, "Dogs bark."]
DRIVER_PATHS = ("/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver")


# ---------------------------------------------------------------------------------------------- browser
def _find() -> tuple[str, str] | None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver") or next((p for p in DRIVER_PATHS if os.access(p, os.X_OK)), None)
    return (chromium, driver) if chromium and driver else None


def _install() -> str:
    """Install Chromium and its driver with apt-get; returns why not, or "" on success."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "not root, so Chromium cannot be installed (apt-get install chromium chromium-driver)"
    if not shutil.which("apt-get"):
        return "no apt-get to install chromium and chromium-driver with"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "chromium", "chromium-driver"]):
        try:
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as err:
            return f"{' '.join(cmd)} failed: {err}"
        if done.returncode:
            return f"{' '.join(cmd)} failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}"
    return ""


@pytest.fixture(scope="session")
def browser():
    """A headless Chromium (selenium WebDriver) with the console log collected; skips with a reason if none."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[dev]')")
    from selenium.webdriver.chrome.service import Service

    found = _find()
    if found is None:
        why = _install()
        found = _find()
        if found is None:
            pytest.skip(f"no Chromium browser for the explorer tests: {why or 'installed, yet not found on PATH'}")
    chromium, driver_path = found
    os.environ["SE_OFFLINE"] = "true"  # selenium-manager must not download anything
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1000", "--force-device-scale-factor=1"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    yield driver
    driver.quit()


@pytest.fixture(scope="session")
def shots(tmp_path_factory) -> Path:
    """Where screenshots go."""
    folder = Path(os.environ.get("BERTSCOPE_SCREENSHOTS") or tmp_path_factory.mktemp("explorer_screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    print(f"\nexplorer screenshots: {folder}")
    return folder


# ---------------------------------------------------------------------------------------------- pages
@pytest.fixture(scope="module")
def main_page(bundled, tmp_path_factory):
    """Three sentences (one with markup in it, one short: padded in the batch), plus a synthetic mixing map
    "alti" ``[batch, layer, query, key]`` with known values."""
    inputs = bundled.tokenize(TEXTS)
    padded = int(inputs["input_ids"].shape[1])
    alti = torch.rand(len(TEXTS), 6, padded, padded, generator=torch.Generator().manual_seed(0)) ** 4
    alti = alti / alti.sum(-1, keepdim=True)
    view = explorer.explore(bundled, TEXTS, maps={"alti": alti}, labels={"alti": "ALTI (synthetic)"})
    path = view.save(tmp_path_factory.mktemp("explorer") / "main.html")
    return path, view


@pytest.fixture(scope="module")
def markup_page(tmp_path_factory):
    """A page built from arrays whose tokens are markup and script."""
    tokens = ["[CLS]", "</script><img src=x onerror=window.__pwned=1>", "<b>bold</b>", "&amp;", "\u2028", "[SEP]"]
    n = len(tokens)
    sentence = data.SentenceData(XSS, tokens, {"attention": np.full((2, 3, n, n), 1 / n, np.float32)})
    view = explorer.build([sentence], labels={"attention": "<img src=x onerror=window.__pwned=3>"})
    return view.save(tmp_path_factory.mktemp("explorer") / "markup.html"), tokens


def open_page(driver, path: Path, timeout: float = 30.0) -> float:
    """Load ``path`` and wait for the page's ready flag; returns ms from navigation start to ready."""
    driver.get_log("browser")  # drop what earlier pages logged
    driver.get(path.as_uri())
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if driver.execute_script("return !!(window.bertscopeExplorer && window.bertscopeExplorer.ready)"):
            return float(driver.execute_script("return window.bertscopeExplorer.readyMs"))
        message = driver.execute_script(
            "var m = document.getElementById('bs-message'); return m && !m.hidden && m.textContent"
        )
        assert not message, message
        time.sleep(0.05)
    raise AssertionError(f"page not ready after {timeout} s; console: {driver.get_log('browser')}")


def problems(driver) -> list[dict]:
    return [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]


def by_css(driver, selector):
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, selector)


def all_css(driver, selector):
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, selector)


def choose(driver, select_id: str, value: str) -> None:
    from selenium.webdriver.support.ui import Select

    Select(by_css(driver, f"#{select_id}")).select_by_value(value)


def head_view(driver) -> dict:
    return driver.execute_script("return Object.assign({}, document.getElementById('bs-headview').dataset)")


def hover_text(driver) -> str:
    return by_css(driver, "#bs-hover").text


def decoded(view, s: int, method: str) -> np.ndarray:
    sent = view.payload["sentences"][s]
    m = next(m for m in view.payload["methods"] if m["id"] == method)
    n = len(sent["tokens"])
    return data.decode_map(sent["maps"][method], (m["layers"], m["heads"], n, n))


# ---------------------------------------------------------------------------------------------- tests
def test_page_loads_without_console_errors_and_shows_the_tokens(browser, main_page, shots):
    path, view = main_page
    open_page(browser, path)
    assert problems(browser) == []
    tokens = view.payload["sentences"][0]["tokens"]
    assert [e.text for e in all_css(browser, "#bs-queries .bs-tok")] == tokens
    assert [e.text for e in all_css(browser, "#bs-keys .bs-tok")] == tokens
    assert tokens[:4] == ["[CLS]", "the", "cat", "sat"]
    assert len(all_css(browser, "#bs-grid .bs-thumb")) == 6 * 12
    browser.save_screenshot(str(shots / "01_page.png"))


def test_clicking_a_thumbnail_opens_it_in_the_head_view(browser, main_page, shots):
    path, _ = main_page
    open_page(browser, path)
    before = browser.execute_script("return document.getElementById('bs-hv-canvas').toDataURL()")
    assert head_view(browser)["layer"] == "0" and head_view(browser)["heads"] == ",".join(map(str, range(12)))
    by_css(browser, '.bs-thumb[data-layer="3"][data-head="5"]').click()
    state = head_view(browser)
    assert (state["layer"], state["heads"]) == ("3", "5")
    assert by_css(browser, "#bs-layer").get_attribute("value") == "3"
    assert "bs-active" in by_css(browser, '.bs-thumb[data-layer="3"][data-head="5"]').get_attribute("class")
    assert browser.execute_script("return document.getElementById('bs-hv-canvas').toDataURL()") != before
    # The pixels: every drawn pixel now has head 5's colour (and there are many of them).
    colours = browser.execute_script(
        """
        var c = document.getElementById('bs-hv-canvas');
        var d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        var swatch = document.querySelector('.bs-swatch[data-head="5"]');
        var sw = getComputedStyle(swatch).backgroundColor.match(/\\d+/g).map(Number);
        var drawn = 0, same = 0;
        for (var p = 0; p < d.length; p += 4) {
          if (d[p + 3] < 40) continue;
          drawn++;
          if (Math.abs(d[p] - sw[0]) + Math.abs(d[p + 1] - sw[1]) + Math.abs(d[p + 2] - sw[2]) < 30) same++;
        }
        return [drawn, same];
        """
    )
    assert colours[0] > 500 and colours[1] / colours[0] > 0.95, colours
    by_css(browser, "#bs-headview").screenshot(str(shots / "02_head_view_layer3_head5.png"))
    by_css(browser, "#bs-modelview").screenshot(str(shots / "03_model_view.png"))
    assert problems(browser) == []


def test_selected_tokens_sum_their_rows_and_hover_shows_the_value(browser, main_page, shots):
    from selenium.webdriver.common.action_chains import ActionChains

    path, view = main_page
    open_page(browser, path)
    by_css(browser, '.bs-thumb[data-layer="2"][data-head="7"]').click()
    by_css(browser, '#bs-queries .bs-tok[data-i="2"]').click()  # 'cat'
    by_css(browser, '#bs-queries .bs-tok[data-i="3"]').click()  # 'sat'
    assert head_view(browser)["rows"] == "2,3"
    ActionChains(browser).move_to_element(by_css(browser, '#bs-keys .bs-tok[data-i="1"]')).perform()
    pattern = decoded(view, 0, "attention")  # what the page holds
    want = pattern[2, 7, 2, 1] + pattern[2, 7, 3, 1]
    text = hover_text(browser)
    assert "'cat' + 'sat' -> 'the' (key 1)" in text and f"H7 {want:.3f}" in text, text
    by_css(browser, "#bs-headview").screenshot(str(shots / "04_head_view_two_tokens_selected.png"))
    # A thumbnail's hover: the value at the cell under the mouse.
    thumb = by_css(browser, '.bs-thumb[data-layer="1"][data-head="2"]')
    ActionChains(browser).move_to_element_with_offset(thumb, -10, 15).perform()
    match = re.search(r"\((\d+)\) -> .* \((\d+)\) = (-?[\d.]+)", hover_text(browser))
    assert match, hover_text(browser)
    i, j, value = int(match.group(1)), int(match.group(2)), float(match.group(3))
    assert i > j  # below the diagonal: mouse was left of and below the centre
    assert value == pytest.approx(pattern[1, 2, i, j], abs=5e-4)
    assert problems(browser) == []


def test_query_key_view_recomputes_the_attention(browser, main_page, bundled, shots):
    from selenium.webdriver.common.action_chains import ActionChains

    path, view = main_page
    open_page(browser, path)
    by_css(browser, '.bs-thumb[data-layer="4"][data-head="9"]').click()
    by_css(browser, '#bs-queries .bs-tok[data-i="5"]').click()  # 'the' (second)
    qk = browser.execute_script("return window.bertscopeExplorer.qk")
    assert (qk["query"], qk["layer"], qk["head"]) == (5, 4, 9)
    inputs = bundled.tokenize([TEXTS[0]])
    _, cache = bundled.run_with_cache(**inputs, names_filter=lambda n: n.startswith("blocks.4.attn."))
    q, k = cache["blocks.4.attn.hook_q"][0, :, 9], cache["blocks.4.attn.hook_k"][0, :, 9]
    dots = (k @ q[5] / q.shape[-1] ** 0.5).numpy()
    np.testing.assert_allclose(qk["dots"], dots, atol=0.05 * max(1.0, float(np.abs(dots).max())))
    np.testing.assert_allclose(qk["softmax"], cache["blocks.4.attn.hook_pattern"][0, 9, 5].numpy(), atol=0.01)
    canvas = by_css(browser, "#bs-qk-canvas")
    width = canvas.size["width"]
    # Hover the softmax column of key 1: the value and the stored attention appear.
    x = 110 + 2 * (32 * 8 + 14) + 70 + 20 - width / 2
    y = 2 * 16 + 6 + 16 * 1 + 8 - canvas.size["height"] / 2
    ActionChains(browser).move_to_element_with_offset(canvas, int(x), int(y)).perform()
    assert "-> key 'the': q\u00b7k/\u221ad = " in hover_text(browser) and "softmax = " in hover_text(browser)
    by_css(browser, "#bs-qkview").screenshot(str(shots / "05_query_key_view.png"))
    assert problems(browser) == []


def test_menu_switches_to_a_mixing_method(browser, main_page, shots):
    path, view = main_page
    open_page(browser, path)
    options = [o.text for o in all_css(browser, "#bs-method option")]
    assert options == ["attention", "ALTI (synthetic)"]
    choose(browser, "bs-method", "1")
    browser.execute_script("return 0")
    deadline = time.monotonic() + 10
    while head_view(browser).get("method") != "alti" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert head_view(browser)["method"] == "alti" and head_view(browser)["heads"] == "0"
    assert len(all_css(browser, "#bs-grid .bs-thumb")) == 6
    row = browser.execute_async_script(
        "var done = arguments[arguments.length - 1]; window.bertscopeExplorer.mapRow(0, 'alti', 2, 0, 3).then(done);"
    )
    np.testing.assert_allclose(row, decoded(view, 0, "alti")[2, 0, 3], atol=1e-5)  # JS decodes what Python wrote
    choose(browser, "bs-layer", "2")
    by_css(browser, "#bs-root").screenshot(str(shots / "06_mixing_method_view.png"))
    assert problems(browser) == []


def test_padding_is_never_drawn(browser, main_page):
    path, view = main_page
    open_page(browser, path)
    choose(browser, "bs-sentence", "2")
    deadline = time.monotonic() + 10
    while by_css(browser, "#bs-text").text != "Dogs bark." and time.monotonic() < deadline:
        time.sleep(0.05)
    tokens = [e.text for e in all_css(browser, "#bs-queries .bs-tok")]
    assert tokens == ["[CLS]", "dogs", "bark", ".", "[SEP]"]
    assert browser.execute_script("return document.getElementById('bs-hv-canvas').style.height") == f"{16 * 5}px"
    assert len(view.payload["sentences"][2]["tokens"]) == 5  # the padded batch is longer
    assert problems(browser) == []


def test_markup_in_the_data_shows_as_text_and_never_runs(browser, main_page, markup_page, shots):
    path, _ = main_page
    open_page(browser, path)
    choose(browser, "bs-sentence", "1")
    deadline = time.monotonic() + 10
    while "onerror" not in by_css(browser, "#bs-text").text and time.monotonic() < deadline:
        time.sleep(0.05)
    shown = browser.execute_script("return document.getElementById('bs-text').textContent")
    assert shown == XSS
    assert "</script>" in by_css(browser, "#bs-sentence").text
    by_css(browser, "#bs-root").screenshot(str(shots / "07_markup_sentence.png"))
    assert browser.execute_script("return typeof window.__pwned") == "undefined"
    assert browser.execute_script("return document.querySelectorAll('img, b, iframe').length") == 0
    assert problems(browser) == []

    markup_path, tokens = markup_page
    open_page(browser, markup_path)
    assert browser.execute_script(
        "return Array.from(document.querySelectorAll('#bs-queries .bs-tok')).map(e => e.textContent)"
    ) == tokens
    assert by_css(browser, "#bs-method option").text == "<img src=x onerror=window.__pwned=3>"
    assert browser.execute_script("return typeof window.__pwned") == "undefined"
    assert browser.execute_script("return document.querySelectorAll('img, b, iframe').length") == 0
    by_css(browser, "#bs-headview").screenshot(str(shots / "08_markup_tokens.png"))
    assert problems(browser) == []


@pytest.mark.slow
def test_a_512_token_page_is_interactive_within_2_s(browser, bundled, tmp_path, shots):
    text = corpus_texts(bundled.tokenizer, 1, 512, seed=1)[0]
    view = explorer.explore(bundled, [text])
    n = len(view.payload["sentences"][0]["tokens"])
    assert 500 <= n <= 512
    path = view.save(tmp_path / "long.html")
    ready_ms = open_page(browser, path)
    timings = browser.execute_script("return window.bertscopeExplorer.timings")
    thumb = by_css(browser, '.bs-thumb[data-layer="5"][data-head="3"]')
    start = time.perf_counter()
    thumb.click()
    while head_view(browser)["layer"] != "5":
        assert time.perf_counter() - start < 10
    round_trip_ms = (time.perf_counter() - start) * 1000
    click_ms = browser.execute_script("return window.bertscopeExplorer.lastClickMs")
    # Until the next frame is on screen: canvas drawing is rasterised then, and that is what a user waits for.
    paint = None
    while paint is None and time.perf_counter() - start < 15:
        paint = browser.execute_script("return window.bertscopeExplorer.lastClickPaintMs")
    ready_paint = browser.execute_script("return window.bertscopeExplorer.readyPaintMs")
    print(
        f"\n512-token page ({n} tokens, {path.stat().st_size / 1e6:.1f} MB): ready {ready_ms:.0f} ms after "
        f"navigation start ({ {k: round(v) for k, v in timings.items()} }; first frame at {ready_paint:.0f} ms); "
        f"thumbnail click -> all views redrawn in {click_ms:.0f} ms in the page, next frame after {paint} ms "
        f"({round_trip_ms:.0f} ms through WebDriver)"
    )
    browser.save_screenshot(str(shots / "09_512_tokens.png"))
    assert problems(browser) == []
    assert ready_ms <= 2000 and ready_paint <= 2000
    assert click_ms <= 500 and paint is not None and paint <= 1000


def test_menu_shows_real_mixing_methods_matching_the_library(browser, bundled, tmp_path, shots):
    """``explore(mixing=...)`` computes ``hooks.contributions``; the page's menu offers them, and a row the page
    decodes equals the library's numbers (up to the page's uint8 code) over the sentence's real tokens."""
    from bertscope.hooks import contributions

    texts = ["The cat sat on the mat because it was tired.", "Dogs bark."]  # the second is padded in the batch
    view = explorer.explore(bundled, texts, mixing="alti,attention_norm")
    path = view.save(tmp_path / "mixing.html")
    open_page(browser, path)
    options = [o.text for o in all_css(browser, "#bs-method option")]
    assert options == ["attention", explorer.MIXING_LABELS["alti"], explorer.MIXING_LABELS["attention_norm"]]
    choose(browser, "bs-method", "1")
    deadline = time.monotonic() + 10
    while head_view(browser).get("method") != "alti" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert head_view(browser)["method"] == "alti"
    inputs = bundled.tokenize(texts)
    real = inputs["attention_mask"][1].bool()
    for method in ("alti", "attention_norm"):
        full = contributions(bundled, inputs, method)[1, 3][real][:, real].numpy()  # sentence 1, layer 3
        row = browser.execute_async_script(
            "var done = arguments[arguments.length - 1];"
            f"window.bertscopeExplorer.mapRow(1, '{method}', 3, 0, 2).then(done);"
        )
        # the page's uint8 code: a 1/255 step for maps within [0, 1] (alti), else the map's own range
        step = 1 / 255 if method == "alti" else float(full.max() - full.min()) / 255
        np.testing.assert_allclose(row, full[2], atol=0.51 * step + 1e-6)
    by_css(browser, "#bs-root").screenshot(str(shots / "07_real_alti.png"))
    assert problems(browser) == []


def test_report_tables_fit_the_page_width(browser, tmp_path):
    """The report (issue 27.11): a 32-column table once ran 3,600 px past a 1,200 px page; every table now ends
    inside the page's body."""
    import json as _json

    import pandas as pd
    from bertscope.experiments.report import build_report

    d = tmp_path / "results" / "wide"
    d.mkdir(parents=True)
    (d / "manifest.json").write_text(_json.dumps({"experiment": "wide", "status": "complete",
                                                  "summary_tables": ["wide"]}))  # fmt: skip
    wide = pd.DataFrame({f"heldout_accuracy_high_{i}": [0.123456 * i, 1.5] for i in range(30)})
    wide["model"] = "bundled:/a/very/long/local/path/to/the/model/folder/with/many/parts"
    wide.to_csv(d / "wide.csv", index=False)
    browser.get(build_report(tmp_path / "results").as_uri())
    overflow = browser.execute_script(
        "var right = document.body.getBoundingClientRect().right;"
        "return Array.from(document.querySelectorAll('table')).map(function (t) {"
        "  return Math.round(t.getBoundingClientRect().right - right); }).filter(function (x) { return x > 1; });"
    )
    assert overflow == []


# ---------------------------------------------------------------------------------------------- in Chromium
def _mass(att: np.ndarray, segs: list[int], layer: int, src: int, dst: int) -> float:
    """Mean over heads and over the queries of segment ``src`` of their attention on segment ``dst``."""
    s = np.asarray(segs)
    return float(att[layer][:, s == src][:, :, s == dst].sum(-1).mean())


def test_sentence_pair_view_in_the_browser(browser, bundled, tmp_path):
    """Pairs: tokens marked by segment; the summary's A->B and B->A masses are the decoded map's; the segment
    filter leaves only lines from the chosen segment's queries; a single sentence hides the control."""
    texts, pairs = ["The cat sat on the mat.", "Dogs bark."], ["It was very tired.", "Cats do not."]
    view = explorer.explore(bundled, texts, pairs=pairs, qk=False)
    path = view.save(tmp_path / "pairs.html")
    open_page(browser, path)
    assert problems(browser) == []
    segs = view.payload["sentences"][0]["segments"]
    classes = [e.get_attribute("class") for e in all_css(browser, "#bs-queries .bs-tok")]
    assert [("bs-seg-b" in c) for c in classes] == [bool(x) for x in segs]
    assert [("bs-seg-a" in c) for c in classes] == [not x for x in segs]
    assert by_css(browser, "#bs-seg-box").is_displayed()
    att = decoded(view, 0, "attention")
    state = head_view(browser)
    assert float(state["segAb"]) == pytest.approx(_mass(att, segs, 0, 0, 1), abs=1e-4)
    assert float(state["segBa"]) == pytest.approx(_mass(att, segs, 0, 1, 0), abs=1e-4)
    assert "segment A is" in by_css(browser, "#bs-seg-summary").text
    choose(browser, "bs-layer", "4")
    state = head_view(browser)
    assert float(state["segAb"]) == pytest.approx(_mass(att, segs, 4, 0, 1), abs=1e-4)

    def drawn_rows() -> list[int]:  # which token rows have line pixels at the query (left) edge of the canvas
        return browser.execute_script(
            """
            var c = document.getElementById('bs-hv-canvas'), ctx = c.getContext('2d');
            var dpr = c.width / c.clientWidth, d = ctx.getImageData(Math.round(3 * dpr), 0, 1, c.height).data;
            var rows = {};
            for (var y = 0; y < c.height; y++) if (d[4 * y + 3] > 0) rows[Math.floor(y / dpr / 16)] = 1;
            return Object.keys(rows).map(Number).sort(function (a, b) { return a - b; });
            """
        )

    n_a = segs.count(0)
    assert set(drawn_rows()) == set(range(len(segs)))  # all pairs: lines leave every query
    choose(browser, "bs-segments", "AB")
    assert head_view(browser)["seg"] == "AB"
    assert drawn_rows() and max(drawn_rows()) < n_a  # only queries of A draw
    choose(browser, "bs-segments", "BA")
    assert drawn_rows() and min(drawn_rows()) >= n_a
    # a sentence without a pair hides the control
    single = explorer.explore(bundled, "The cat sat on the mat.", qk=False).save(tmp_path / "single.html")
    open_page(browser, single)
    assert not by_css(browser, "#bs-seg-box").is_displayed()
    assert not by_css(browser, "#bs-seg-summary").is_displayed()
    assert problems(browser) == []
