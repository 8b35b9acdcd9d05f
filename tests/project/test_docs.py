"""The docs run: the API reference builds offline, the tutorial's outputs are what its code prints, the README
example works from a folder with its own models.py / hooks.py / probes.py, and hooks.md names the API."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"_docs_{name}", DOCS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_api_reference_builds_offline(tmp_path, monkeypatch):
    pytest.importorskip("pdoc")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    index = _load("build_api").build(tmp_path / "api")
    assert index.exists()
    hooks_page = (tmp_path / "api" / "bertscope" / "hooks.html").read_text()
    for name in ("ActivationCache", "accumulated_resid", "decompose_resid", "stack_head_results", "ablate_heads",
                 "patch_heads", "act_name", "run_with_cache", "incl_bwd"):
        assert name in hooks_page, name
    models_page = (tmp_path / "api" / "bertscope" / "models.html").read_text()
    for name in ("to_tokens", "to_str_tokens", "EncoderConfig"):
        assert name in models_page, name
    assert "evaluate" in (tmp_path / "api" / "bertscope" / "probes.html").read_text()
    # nothing in the pages loads a script or a style from elsewhere
    for page in (tmp_path / "api").rglob("*.html"):
        assert not re.search(r"<(script|link)[^>]+(src|href)=\"https?://", page.read_text()), page


def test_tutorial_output_comparison_can_fail():
    same_output = _load("run_tutorial").same_output
    assert same_output("R^2 0.944 [0.927, 0.958]\n", "R^2 0.9441 [0.927, 0.958]\n")
    assert not same_output("R^2 0.944\n", "R^2 0.644\n")
    assert not same_output("L0H2: 1.000\n", "L1H2: 1.000\n")


@pytest.mark.slow
def test_tutorial_prints_what_the_page_shows(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    runner = _load("run_tutorial")
    text = runner.DEFAULT.read_text()
    assert text.count("```python") >= 6 and text.count("```text") >= 6
    assert runner.check() == []


@pytest.mark.slow
def test_words_page_prints_what_it_shows(monkeypatch, tmp_path):
    """docs/words.md (encode, word_pool, word_attention, mlm_logits) runs and prints what the page shows."""
    monkeypatch.chdir(tmp_path)
    runner = _load("run_tutorial")
    page = runner.DEFAULT.parent / "words.md"
    text = page.read_text()
    for name in ("encode(", "word_pool(", "word_attention(", "mlm_logits("):
        assert name in text, name
    assert runner.check(page) == []


def _readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## In Python") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.slow
def test_readme_example_runs_beside_own_models_hooks_probes(tmp_path):
    code = _readme_example()
    assert "import bertscope" in code and "import models" not in code
    for name in ("models", "hooks", "probes", "experiments"):
        (tmp_path / f"{name}.py").write_text(f"raise ImportError('the user\\'s own {name}.py was imported')\n")
    (tmp_path / "example.py").write_text(code)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "['[CLS]', 'the', 'cat'" in proc.stdout
    assert re.search(r"tensor\(0\.\d+\)", proc.stdout)


def test_hooks_doc_is_current():
    text = (DOCS / "hooks.md").read_text()
    for name in ("accumulated_resid", "decompose_resid", "stack_head_results", "incl_bwd", "cache[name, layer]",
                 "patch_heads(model,", "patch_activation(model,", "from bertscope.hooks import"):
        assert name in text, name
    assert "from hooks import" not in text


def _readme_similarity() -> str:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    return textwrap.dedent(next(b for b in blocks if "similarity.attribute(" in b))


@pytest.mark.slow
def test_readme_similarity_example_prints_what_its_comments_say(capsys):
    """The README's five lines explaining one pair run, and the numbers in their comments are what they print (score
    to 3 decimals; the top two token pairs and their values to 3 decimals)."""
    code = _readme_similarity()
    exec(compile(code, "README.md", "exec"), {})
    score_line, top_line = capsys.readouterr().out.strip().splitlines()[-2:]
    comments = re.findall(r"# (.*)", code)
    assert f"{float(score_line.split()[0]):.3f}" == comments[1].split()[0]
    shown = re.findall(r"\('([^']*)', '([^']*)', (-?[\d.]+)\)", comments[2])
    printed = re.findall(r"\('([^']*)', '([^']*)', (-?[\d.e-]+)\)", top_line)
    assert len(shown) == 2 and len(printed) == 3
    for (a, b, v), (pa, pb, pv) in zip(shown, printed, strict=False):
        assert (a, b, v) == (pa, pb, f"{float(pv):.3f}")
