"""Feature browser at the issue's target size: 4 sites x 6,144 latents, 8 top contexts each, over 400 test
sentences of 30 pieces; prints the page's size and the time until it is interactive in headless Chromium.

    python benchmarks/features_browser.py [--latents 6144] [--sites 4] [--out /tmp/feature_browser_bench.html]

Targets (issue 29): under 10 MB, interactive in under 2 s. Needs chromium + chromedriver and selenium.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd
from bertscope.experiments.features import browser as B


def synthetic(n_sites: int, n_latents: int, n_top: int = 8, n_sent: int = 400, length: int = 30, seed: int = 0):
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(3000)]
    tok = pd.DataFrame({"sentence": np.repeat(np.arange(n_sent), length),
                        "position": np.tile(np.arange(length), n_sent),
                        "token": rng.choice(words, n_sent * length)})
    lat, ctx = [], []
    labels = np.array(["position=0", "upos=NOUN", "repeats_earlier", "deprel=nsubj", None], dtype=object)
    for s in range(n_sites):
        site = f"blocks.{s}.hook_resid_post"
        lat.append(pd.DataFrame({"site": site, "latent": np.arange(n_latents),
                                 "density": rng.uniform(0, 0.05, n_latents),
                                 "max_value": rng.uniform(0, 5, n_latents),
                                 "histogram": [" ".join(map(str, rng.integers(0, 200, 12))) for _ in range(n_latents)],
                                 "promoted": "", "label": rng.choice(labels, n_latents),
                                 "test_mcc": rng.uniform(0, 1, n_latents), "labelled": rng.random(n_latents) < 0.2,
                                 "encoder": "trained", "model": "synthetic"}))
        ctx.append(pd.DataFrame({"site": site, "latent": np.repeat(np.arange(n_latents), n_top),
                                 "rank": np.tile(np.arange(n_top), n_latents),
                                 "sentence": rng.integers(0, n_sent, n_latents * n_top),
                                 "position": rng.integers(0, length, n_latents * n_top),
                                 "value": rng.uniform(0, 5, n_latents * n_top).astype(np.float32)}))
    return pd.concat(lat, ignore_index=True), pd.concat(ctx, ignore_index=True), tok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--latents", type=int, default=6144)
    ap.add_argument("--sites", type=int, default=4)
    ap.add_argument("--out", type=Path, default=Path("/tmp/feature_browser_bench.html"))
    args = ap.parse_args()
    t0 = time.perf_counter()
    page = B.render(B.payload(*synthetic(args.sites, args.latents)))
    args.out.write_text(page)
    print(f"{args.sites} sites x {args.latents} latents: {len(page.encode()) / 1e6:.2f} MB, "
          f"built in {time.perf_counter() - t0:.1f} s")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        opts.add_argument(a)
    driver = webdriver.Chrome(service=Service(executable_path="/usr/bin/chromedriver"), options=opts)
    try:
        for run in range(3):
            driver.get(args.out.as_uri())
            while not driver.execute_script("return !!(window.featureBrowser && window.featureBrowser.ready)"):
                time.sleep(0.02)
            ready = driver.execute_script("return window.featureBrowser.readyMs")
            t = driver.execute_script("var t0 = performance.now(); var q = document.getElementById('fb-label');"
                                      "q.value = 'upos'; q.dispatchEvent(new Event('input'));"
                                      "return performance.now() - t0")
            print(f"load {run + 1}: interactive after {ready:.0f} ms (navigation start to ready); "
                  f"a label search took {t:.0f} ms")
    finally:
        driver.quit()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
