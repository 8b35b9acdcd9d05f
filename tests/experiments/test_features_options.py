"""`bertscope run features --tokens N --dictionaries DIR` (issue 29): named options that are the same settings as
``--set features.tokens=N`` / ``--set features.dictionaries=DIR``, and ``--dictionaries`` folders checked against
the model and the sites before anything is written (one line, exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from bertscope.experiments import cli
from bertscope.experiments.cli.commands import options_from_args
from bertscope.experiments.cli.parser import build_parser
from bertscope.experiments.features import steps
from bertscope.experiments.options import UsageError, load_model
from bertscope.probes.dictionary import Dictionary, DictionaryConfig


def bertscope(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def settings_of(*argv: str) -> dict:
    args = build_parser(["run", *argv]).parse_args(["run", *argv])
    return options_from_args(args).settings


def test_options_are_the_same_settings_as_set(tmp_path: Path):
    d = str(tmp_path / "dicts")
    by_option = settings_of("features", "--tokens", "50k", "--dictionaries", d)
    by_set = settings_of("features", "--set", "features.tokens=50000", "--set", f"features.dictionaries={d}")
    assert by_option == by_set == {"features": {"tokens": "50000", "dictionaries": d}}
    assert settings_of("all", "--tokens", "7000") == {"features": {"tokens": "7000"}}  # run all: for features
    assert settings_of("features") == {}


@pytest.mark.parametrize("argv, message", [
    (["features", "--tokens", "5000", "--set", "features.tokens=6000"], "give the same setting"),
    (["heads", "--tokens", "5000"], "--tokens is an option of `bertscope run features`"),
    (["heads", "--dictionaries", "x"], "--dictionaries is an option of `bertscope run features`"),
])
def test_option_twice_or_for_another_experiment_is_refused(argv, message):
    args = build_parser(["run", *argv]).parse_args(["run", *argv])
    with pytest.raises(UsageError, match=message):
        options_from_args(args)


def test_tokens_must_be_a_positive_count(capsys):
    with pytest.raises(SystemExit) as e:
        build_parser(["run", "features"]).parse_args(["run", "features", "--tokens", "0"])
    assert e.value.code == 2


# ---------------------------------------------------------------------------------------------- dictionaries
@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_model(str(tiny_model_dir), device=torch.device("cpu"), dtype=torch.float32)


def sites_of(model) -> list[steps.Site]:
    return steps.default_sites(model.config.n_layers, None, None)


def dictionaries(model, *, d_in: int | None = None, sha: str | None = None, swap: bool = False) -> dict:
    """One small dictionary per default site of ``model`` (``d_in``: another width; ``sha``: recorded weights;
    ``swap``: an SAE where the transcoder belongs)."""
    out = {}
    for s in sites_of(model):
        width = d_in or model.config.d_model
        meta = {"weights_sha256": sha} if sha else {}
        if s.kind == "sae" or swap:
            cfg = DictionaryConfig(d_in=width, d_sae=8, arch="topk", k=2, site=s.name, metadata=meta)
        else:
            cfg = DictionaryConfig(d_in=width, d_sae=8, arch="batchtopk", k=2, kind="transcoder", d_out=width,
                                   site=s.name, site_out=s.site_out, metadata=meta)
        d = Dictionary(cfg)
        d.init_weights(torch.Generator().manual_seed(0))
        out[s.name] = d
    return out


def test_saved_dictionaries_load_back_exactly(tiny, tmp_path: Path):
    made = dictionaries(tiny, sha=tiny.weights_sha256)
    steps.save_site_dictionaries(made, tmp_path)
    loaded = steps.load_site_dictionaries(tiny, tmp_path, sites_of(tiny))
    x = torch.randn(5, tiny.config.d_model, generator=torch.Generator().manual_seed(1))
    assert set(loaded) == set(made)
    for site, d in made.items():
        torch.testing.assert_close(loaded[site].encode(x), d.encode(x))


@pytest.mark.parametrize("case, message", [
    ("empty", "has no dictionary for site blocks.0.hook_resid_post"),
    ("width", "is 16 wide; this model's is 32"),
    ("sha", "was trained on another model"),
    ("swap", "the features site needs blocks.1.hook_resid_mid -> blocks.1.hook_mlp_out"),
])
def test_run_features_refuses_unfit_dictionaries_in_one_line(capsys, tiny, tiny_model_dir, tmp_path: Path,
                                                              case: str, message: str):
    folder = tmp_path / "dicts"
    folder.mkdir()
    if case != "empty":
        steps.save_site_dictionaries(dictionaries(tiny, d_in=16 if case == "width" else None,
                                                  sha="0" * 64 if case == "sha" else None, swap=case == "swap"),
                                     folder)
    out = tmp_path / "out"
    code, _, err = bertscope(capsys, "run", "features", "--model", tiny_model_dir, "--max-sentences", "40",
                             "--dictionaries", folder, "--out", out, "--quiet")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert message in err
    assert not (out / "features").exists()


def test_every_run_option_names_a_setting_of_its_experiment():
    import dataclasses

    from bertscope.experiments.registry import EXPERIMENTS, RUN_OPTIONS, load_experiment

    for flag, (name, field, _, text) in RUN_OPTIONS.items():
        assert name in EXPERIMENTS and flag.startswith("--") and text
        assert field in {f.name for f in dataclasses.fields(load_experiment(name).Settings)}


def test_the_reinitialised_control_matches_a_loaded_dictionary_s_width_and_budget(capsys, tiny, tiny_model_dir,
                                                                                   tmp_path: Path):
    """Issue 40.8: a loaded dictionary of 8 latents trained on 300 rows (the default width here would be 64 and
    the default budget 100 rows) gets a re-initialised control of 8 latents trained on 300 rows."""
    import dataclasses

    import pandas as pd
    from bertscope.experiments.features import compute

    made = dictionaries(tiny, sha=tiny.weights_sha256)
    for d in made.values():
        d.config = dataclasses.replace(d.config, metadata={**d.config.metadata, "tokens_trained": 300,
                                                           "train_settings": {"lr": 2e-3, "batch_size": 64}})
    folder = tmp_path / "dicts"
    steps.save_site_dictionaries(made, folder)
    settings, width = compute.control_recipe(features_settings(tokens=100), next(iter(made.values())))
    assert (width, settings.tokens, settings.k, settings.lr, settings.batch_size) == (8, 300, 2, 2e-3, 64)
    out = tmp_path / "out"
    code, _, err = bertscope(capsys, "run", "features", "--model", tiny_model_dir, "--max-sentences", "40",
                             "--dictionaries", folder, "--tokens", "100", "--out", out, "--quiet", "--no-report")
    assert code == 0, err
    s = pd.read_parquet(out / "features" / "summary.parquet")
    lat = s[s["basis"] == "latent"].set_index(["site", "encoder"])
    for site in {x for x, _ in lat.index}:
        trained, control = lat.loc[(site, "trained")], lat.loc[(site, "reinit")]
        assert trained["d_sae"] == control["d_sae"] == 8
        assert trained["tokens_trained"] == 300 and abs(control["tokens_trained"] - 300) < 64  # whole batches of 64


def features_settings(**changes):
    from bertscope.experiments import features

    return features.Settings(**changes)
