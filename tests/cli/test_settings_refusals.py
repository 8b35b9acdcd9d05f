"""Every experiment's settings are checked before any work (issue 39 items 11 and 12): a bad ``--set`` value, of
the wrong type, out of range, or one the model cannot take (a layer it lacks, more active latents than latents),
is one line on stderr, exit 2, and nothing written, whether the experiment runs alone or in ``run all``."""

from __future__ import annotations

from pathlib import Path

import pytest
from bertscope.experiments import registry
from test_cli import bertscope

#: (experiment, --set item, a piece of the one line it must give). The tiny model has 2 blocks of width 32.
BAD_SETTINGS = [
    ("same-token", "same-token.max_sentences=0", "max_sentences must be >= 1"),
    ("same-token", "same-token.ci=1.5", "ci must be between 0 and 1"),
    ("same-token", "same-token.random_corpus=nope", "random_corpus must be repeated-random"),
    ("same-token", "same-token.top_k=-1", "top_k must be >= 1"),
    ("heads", "heads.methods=zero,bogus", "unknown 'bogus'"),
    ("heads", "heads.role_fdr=0", "role_fdr must be between 0 and 1"),
    ("heads", "heads.workers=0", "workers must be >= 1"),
    ("heads", "heads.distance_sentences=abc", "expected int"),
    ("positions", "positions.alphas=0,1", "alphas must be > 0"),
    ("positions", "positions.max_sentences=0", "max_sentences must be >= 1"),
    ("positions", "positions.backend=jax", "backend must be"),
    ("mixing", "mixing.baseline=nothing", "baseline must be one of"),
    ("mixing", "mixing.methods=bogus", "unknown 'bogus'"),
    ("mixing", "mixing.ig_steps=0", "ig_steps must be >= 1"),
    ("structure", "structure.lr=0", "lr must be > 0"),
    ("structure", "structure.n_boot=0", "n_boot must be >= 1"),
    ("structure", "structure.ranks=0,2", "ranks must be positive"),
    ("structure", "structure.ci=1", "ci must be between 0 and 1"),
    ("erasure", "erasure.erase_layers=9", "erase layer 9 is outside 0..2"),
    ("erasure", "erasure.inlp_classifier=tree", "inlp_classifier must be one of"),
    ("erasure", "erasure.min_words=50", "min_words (50) must not exceed max_words (40)"),
    ("erasure", "erasure.alpha=-1", "alpha must be > 0"),
    ("erasure", "erasure.methods=()", "methods needs at least one item"),
    ("circuits", "circuits.n_pairs=abc", "expected int"),
    ("circuits", "circuits.ig_steps=1.5", "expected int"),
    ("features", "features.k=5000", "TopK needs k below the dictionary's 256 latents"),
    ("features", "features.width=abc", "width must be a positive multiple"),
    ("features", "features.width=0x", "width must be a positive multiple"),
    ("features", "features.layers=9", "block 9 is outside 0..1"),
    ("features", "features.transcoder_layer=9", "block 9 is outside 0..1"),
    ("features", "features.ks=0,2", "ks must be >= 1"),
    ("features", "features.probe_variables=bogus", "unknown 'bogus'"),
    ("features", "features.threshold=0", "threshold must be in (0, 1]"),
    ("similarity", "similarity.methods=bogus", "got unknown 'bogus'"),
    ("similarity", "similarity.attributed=1", "attributed must be at least 2"),
    ("similarity", "similarity.poolings=cls,max", "the model's own pooling 'mean' must be among them"),
    ("minimal-pairs", "minimal-pairs.methods=l2r", "got unknown 'l2r'"),
    ("minimal-pairs", "minimal-pairs.batch_rows=0", "batch_rows must be >= 1"),
]


def test_the_table_covers_every_experiment() -> None:
    assert {name for name, _, _ in BAD_SETTINGS} == set(registry.EXPERIMENTS)


@pytest.mark.parametrize(("experiment", "item", "said"), BAD_SETTINGS, ids=[i for _, i, _ in BAD_SETTINGS])
def test_a_bad_setting_is_one_line_exit_2_and_nothing_written(
    capsys: pytest.CaptureFixture[str], tiny_model_dir: Path, tmp_path: Path, experiment: str, item: str, said: str
) -> None:
    out = tmp_path / "out"
    code, stdout, err = bertscope(capsys, "run", experiment, "--model", tiny_model_dir, "--max-sentences", "20",
                                  "--out", out, "--device", "cpu", "--quiet", "--no-report", "--set", item)
    assert code == 2, err
    (line,) = err.strip().splitlines()
    assert line.startswith("bertscope: error: ") and said in line, line
    assert "Traceback" not in stdout + err
    assert not out.exists()


@pytest.mark.parametrize("item", ["features.layers=9", "erasure.erase_layers=9"])
def test_run_all_refuses_a_setting_the_model_cannot_take_before_any_work(
    capsys: pytest.CaptureFixture[str], tiny_model_dir: Path, tmp_path: Path, item: str
) -> None:
    """In ``run all`` too: not a skipped experiment, a usage error before the first experiment starts."""
    out = tmp_path / "out"
    code, stdout, err = bertscope(capsys, "run", "all", "--model", tiny_model_dir, "--max-sentences", "20", "--out",
                                  out, "--device", "cpu", "--quiet", "--no-report", "--set", item)
    assert code == 2, err
    (line,) = err.strip().splitlines()
    assert "is outside" in line
    assert not out.exists()


def test_erasure_erases_exactly_the_layers_its_settings_name() -> None:
    """The layer list the manifest records is the list erased: no silent substitution of layer 1."""
    import types

    from bertscope.experiments.erasure import Settings, steps

    run = types.SimpleNamespace(model=types.SimpleNamespace(config=types.SimpleNamespace(n_layers=6)), log=print)
    assert steps.erase_layers(run, Settings(erase_layers=(3, 1, 3))) == [3, 1]
    with pytest.raises(ValueError, match="erase layer 9 is outside 0..6"):
        steps.erase_layers(run, Settings(erase_layers=(9,)))
    # the default layers (1, 3) on a 2-block model: layer 3 left out (said), not replaced
    assert steps.layers_to_erase(Settings(), 2) == ([1], [3])
