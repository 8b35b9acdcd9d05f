"""One dictionary recipe (issue 40 item 1): ``sae train``, ``train_sae``, ``TrainSettings`` and ``run features``
all default to ``bertscope.probes.dictionary.RECIPE``, and it is not SAELens's lr 3e-4 / batch 4096."""

from __future__ import annotations

import inspect

from bertscope.experiments.cli.parser import build_parser
from bertscope.experiments.dictionary import train_sae
from bertscope.experiments.features.experiment import Settings as FeaturesSettings
from bertscope.probes.dictionary import RECIPE, TrainSettings, architectures


def test_the_recipe_is_the_held_out_chosen_one():
    assert (RECIPE.lr, RECIPE.batch_size, RECIPE.k, RECIPE.width) == (3e-3, 1024, 32, "8x")


def test_train_settings_default_to_the_recipe():
    ts = TrainSettings()
    assert (ts.lr, ts.batch_size, ts.tokens) == (RECIPE.lr, RECIPE.batch_size, RECIPE.tokens)


def test_sae_train_cli_defaults_to_the_recipe():
    argv = ["sae", "train", "--site", "blocks.0.hook_resid_post", "--out", "x"]
    args = build_parser(argv).parse_args(argv)
    assert (args.lr, args.train_batch, args.k, args.width, args.tokens, args.arch) == (
        RECIPE.lr, RECIPE.batch_size, RECIPE.k, RECIPE.width, RECIPE.tokens, architectures.DEFAULT)


def test_train_sae_defaults_to_the_recipe():
    p = inspect.signature(train_sae).parameters
    assert (p["k"].default, p["width"].default, p["arch"].default) == (RECIPE.k, RECIPE.width, architectures.DEFAULT)
    assert p["settings"].default is None  # None is TrainSettings(), the recipe


def test_run_features_defaults_to_the_recipe():
    s = FeaturesSettings()
    assert (s.lr, s.batch_size, s.k, s.width) == (RECIPE.lr, RECIPE.batch_size, RECIPE.k, RECIPE.width)
