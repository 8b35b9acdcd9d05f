"""The dictionary architecture table is the one extension point: an architecture registered from this file alone is
trained, saved in SAELens's format, loaded and evaluated through the CLI, with no edit anywhere else (issue 38.1);
and no code outside an architecture's own file names an architecture."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pandas as pd
import pytest
import torch
import transformers
from bertscope.experiments.cli import main
from bertscope.probes.dictionary import (
    Architecture,
    DictionaryConfig,
    TrainSettings,
    architectures,
    load_dictionary,
    register,
    save_dictionary,
    train_dictionaries,
)
from helpers import save_tiny_bert

ROOT = Path(__file__).resolve().parents[2]
CAP = 0.5  # the toy's planted answer: no latent activation ever exceeds it
CALLS = {"sparsity": 0}


def capped_relu(d, h):
    """The toy architecture: ``min(ReLU(h), CAP)``."""
    return h.relu().clamp_max(CAP)


def plain_l1(d, h, f, settings, tokens):
    """An L1 penalty without decoder norms (counted, so the test sees the trainer call it)."""
    CALLS["sparsity"] += 1
    return settings.l1_coefficient * f.abs().sum(-1).mean()


@pytest.fixture()
def toy():
    spec = register(Architecture(name="cappedrelu", activate=capped_relu, sparsity_loss=plain_l1,
                                 saelens={"sae": "standard"}, reads_saelens=False, revive="resample",
                                 summary="ReLU capped at 0.5 (a test's toy)"))
    yield spec
    architectures.unregister("cappedrelu")
    assert "cappedrelu" not in architectures.names()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_mlm_arch")
    save_tiny_bert(folder, transformers.BertForMaskedLM)
    return folder


def test_a_registered_architecture_trains_saves_loads_and_evaluates_through_the_cli(toy, tiny, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["sae", "train", "--help"])
    assert "cappedrelu: ReLU capped at 0.5" in capsys.readouterr().out
    out = tmp_path / "sae"
    CALLS["sparsity"] = 0
    rc = main(["sae", "train", "--model", str(tiny), "--site", "blocks.0.hook_resid_post", "--arch", "cappedrelu",
               "--width", "2x", "--tokens", "1k", "--l1", "0.01", "--out", str(out), "--train-batch", "128",
               "--buffer", "512", "--max-sentences", "40", "--quiet", "--no-controls"])
    assert rc == 0, capsys.readouterr().err
    assert CALLS["sparsity"] == 1000 // 128  # one call per training step: the trainer used the toy's loss
    folder = out / "blocks.0.hook_resid_post"
    cfg = json.loads((folder / "cfg.json").read_text())
    assert cfg["architecture"] == "standard" and cfg["metadata"]["bertscope"]["arch"] == "cappedrelu"
    d = load_dictionary(folder)
    assert d.arch == "cappedrelu" and d.spec is toy
    x = torch.randn(64, 32) * 20
    with torch.no_grad():
        f = d.encode(x)
        assert torch.equal(f, d.pre_activation(x).relu().clamp_max(CAP)) and float(f.max()) == CAP
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["settings"]["arch"] == "cappedrelu"
    ev = tmp_path / "eval"
    rc = main(["sae", "eval", str(out), "--model", str(tiny), "--max-sentences", "10", "--out", str(ev), "--quiet"])
    assert rc == 0, capsys.readouterr().err
    summary = pd.read_csv(ev / "summary.csv")
    assert list(summary.dictionary) == ["blocks.0.hook_resid_post"]
    table = pd.read_parquet(ev / "evaluation.parquet")
    assert set(table.arch) == {"cappedrelu"} and json.loads((ev / "manifest.json").read_text())["status"] == "complete"


def test_the_table_drives_validation_and_the_format(toy):
    with pytest.raises(ValueError, match="transcoder is"):
        DictionaryConfig(d_in=4, d_sae=8, arch="cappedrelu", kind="transcoder", d_out=4)
    with pytest.raises(ValueError, match="registered already"):
        register(toy)
    with pytest.raises(ValueError, match="arch must be one of"):
        DictionaryConfig(d_in=4, d_sae=8, arch="nosuch")
    assert "cappedrelu" in architectures.names() and "cappedrelu" in architectures.for_kind("sae")


def test_a_toy_round_trips_in_memory(toy, tmp_path):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2048, 8, generator=gen)
    cfg = DictionaryConfig(d_in=8, d_sae=16, arch="cappedrelu", site="x")
    d = train_dictionaries([x], cfg, TrainSettings(tokens=512, batch_size=256, buffer_rows=1024, progress=False,
                                                   l1_coefficient=0.0))["x"]
    back = load_dictionary(save_dictionary(d, tmp_path / "toy"))
    assert back.arch == "cappedrelu"
    with torch.no_grad():
        assert torch.equal(back.encode(x), d.encode(x))


def _names_an_architecture(node: ast.AST, names: set[str]) -> bool:
    """A comparison or membership test against an architecture's name (``x == "topk"``, ``arch in ("relu", …)``)."""
    if not isinstance(node, ast.Compare):
        return False
    parts = [node.left, *node.comparators]
    consts = [c.value for p in parts for c in ast.walk(p) if isinstance(c, ast.Constant) and isinstance(c.value, str)]
    return any(c in names for c in consts)


def test_no_code_outside_an_architecture_file_compares_an_architecture_name():
    names = set(architectures.names())
    own = ROOT / "probes" / "dictionary" / "architectures"
    offenders = []
    for folder in ("probes", "experiments"):  # models/ has activation functions of the same names (relu)
        for path in (ROOT / folder).rglob("*.py"):
            if own in path.parents:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if _names_an_architecture(node, names):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, f"architecture names compared outside probes/dictionary/architectures/: {offenders}"


def test_the_docs_table_is_generated_from_the_table():
    from bertscope.probes.dictionary.architectures.table import markdown_table

    text = (ROOT / "docs" / "dictionaries.md").read_text()
    block = text.split("<!-- architectures:begin -->\n", 1)[1].split("\n<!-- architectures:end -->", 1)[0]
    assert block == markdown_table(), "docs/dictionaries.md's architecture table is stale: regenerate it"


def test_old_names_still_import():
    from bertscope.experiments import sae
    from bertscope.experiments.explorer.latents import load_for_model
    from bertscope.probes.dictionary import ARCHITECTURES
    from bertscope.probes.dictionary import load_for_model as placed
    from bertscope.probes.dictionary.losses import auxk_loss, topk_loss  # noqa: F401
    from bertscope.probes.dictionary.models import UNIT_NORM_DECODER, JumpReLUFunction, topk_activation  # noqa: F401

    assert load_for_model is placed and set(ARCHITECTURES) >= {"relu", "topk", "batchtopk", "jumprelu"}
    assert set(UNIT_NORM_DECODER) == {"topk", "batchtopk", "jumprelu"}
    for name in sae.__all__:
        assert getattr(sae, name) is not None


def test_repr_saelens_names_and_top_level_names():
    import bertscope

    d = DictionaryConfig(d_in=4, d_sae=8, k=2, site="blocks.1.hook_resid_post")
    from bertscope.probes.dictionary import Dictionary

    sae = Dictionary(d)
    assert repr(sae) == "Dictionary(arch='topk', kind='sae', d_in=4, d_sae=8, k=2, site='blocks.1.hook_resid_post')"
    assert sae.cfg.hook_name == "blocks.1.hook_resid_post" and sae.cfg is sae.config
    from bertscope.experiments.dictionary import evaluate_sae, train_sae

    assert bertscope.load_dictionary is load_dictionary
    assert bertscope.train_sae is train_sae and bertscope.evaluate_sae is evaluate_sae
