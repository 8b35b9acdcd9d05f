"""The attribution tables (``hooks/circuits/table.py``): a node method registered from this file alone appears in
the command line's choices and in the circuits experiment's tables; bad task files and settings are refused in one
line, exit 2, with nothing written (issue 39.13); one set of defaults for Python and the command line."""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pandas as pd
import pytest
from bertscope.experiments import cli
from bertscope.hooks.circuits import table


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    from helpers import save_tiny_bert

    folder = tmp_path_factory.mktemp("tiny-bert")
    save_tiny_bert(folder)
    return folder


GOOD = [{"clean": "the cat sat on the mat cat", "corrupted": "the cat sat on the mat the", "query": "cat"},
        {"clean": "dogs bark at night dogs", "corrupted": "dogs bark at night the", "query": "dogs"},
        {"clean": "a bird sang in the tree bird", "corrupted": "a bird sang in the tree the", "query": "bird"}]


def _pairs(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _layer_index(model, task, nodes, *, steps, batch_size):
    """A toy estimate with a known answer: node i of pair p scores ``i + 100 p``; the total is 1 per pair."""
    n_nodes = model.config.n_layers * model.config.n_heads
    effects = np.arange(n_nodes)[None, :] + 100.0 * np.arange(task.n_pairs)[:, None]
    return effects, np.ones(task.n_pairs)


@pytest.fixture
def toy_method():
    spec = table.register_node(table.NodeMethod("toy-index", _layer_index, citation="this test", cost="gradient",
                                                nodes=("heads",), summary="node index plus 100 x pair index"))
    yield spec
    del table.NODE_TABLE["toy-index"]


def test_a_node_method_registered_here_reaches_the_cli_and_the_tables(toy_method, tiny_folder, tmp_path, capsys):
    """Done-when of issue 38.2: no edit anywhere else. The method is listed by `bertscope circuits --help`, is one of
    the experiment's default methods, is computed by `run circuits` and has its rows (with the planted values) in
    the head table and its row in the agreement table."""
    with pytest.raises(SystemExit):
        cli.main(["circuits", "--help"])
    assert "toy-index" in re.sub(r"-\s+", "-", capsys.readouterr().out)  # argparse may wrap at the hyphen
    from bertscope.experiments.circuits import Settings

    assert "toy-index" in Settings().methods
    out = tmp_path / "out"
    task = _pairs(tmp_path / "pairs.jsonl", GOOD)
    code = cli.main(["run", "circuits", "--task", str(task), "--model", str(tiny_folder), "--out", str(out),
                     "--set", "circuits.methods=exact,toy-index", "--set", "circuits.ig_steps=1", "--set",
                     "circuits.candidates=3", "--set", "circuits.n_random=1", "--set", "circuits.checked_edges=1",
                     "--quiet", "--no-report"])
    assert code == 0, capsys.readouterr().err
    heads = pd.read_csv(out / "circuits" / "results.csv")
    toy = heads[heads.method == "toy-index"].reset_index(drop=True)
    assert len(toy) == 2 * 4 and list(toy.node) == [f"L{L}H{h}" for L in range(2) for h in range(4)]
    assert np.allclose(toy.effect, np.arange(8) + 100.0)  # mean over the 3 pairs of i + 100 p
    agreement = pd.read_csv(out / "circuits" / "agreement.csv")
    assert list(agreement.method) == ["toy-index"]
    assert list(agreement.reference) == ["mean effect"]  # a signed method (atp*, a magnitude, says "mean |effect|")
    for col in ("recall_at_5", "recall_at_5_low", "mean_abs_exact", "mean_abs_estimate_high"):
        assert col in agreement, col  # Kramár et al.'s measures (k < the 8 heads only: no recall_at_10)
    assert "recall_at_10" not in agreement
    cost = pd.read_csv(out / "circuits" / "cost.csv")
    assert "toy-index" in set(cost.method)


def test_registering_twice_or_badly_is_refused(toy_method):
    with pytest.raises(ValueError, match="registered already"):
        table.register_node(toy_method)
    with pytest.raises(ValueError, match="commas"):
        table.register_node(dataclasses.replace(toy_method, name="a,b"))
    with pytest.raises(ValueError, match="NodeMethod.nodes"):
        table.register_node(dataclasses.replace(toy_method, name="other", nodes=("neurons",)))
    with pytest.raises(ValueError, match="attributes heads"):
        toy_method.effects(None, None, "mlps")


def test_the_tables_hold_every_built_in_method_with_its_facts():
    assert table.node_methods() == ("exact", "atp", "atp*", "atp-qk", "eap-ig", "eap-ig-act", "ig-act-own")
    assert table.node_methods(default=True) == ("exact", "atp", "atp*", "eap-ig", "eap-ig-act")
    assert table.edge_methods() == ("eap", "eap-ig")
    for spec in [*table.NODE_TABLE.values(), *table.EDGE_TABLE.values()]:
        assert spec.citation and spec.summary, spec.name
    assert "QK fix and GradDrop" in table.NODE_TABLE["atp*"].citation  # the paper's AtP*: both fixes
    assert "GradDrop not applied" in table.NODE_TABLE["atp-qk"].citation  # the QK-fix-only variant says so
    assert "mlps" not in table.NODE_TABLE["atp-qk"].nodes and "mlps" in table.NODE_TABLE["atp*"].nodes
    assert not table.NODE_TABLE["atp*"].signed  # GradDrop's absolute values: a magnitude
    assert all(spec.signed for name, spec in table.NODE_TABLE.items() if name != "atp*")


def test_python_and_the_command_line_share_one_set_of_defaults():
    """Issue 40.11: `edges`/`find_circuit`/`faithfulness` and `run circuits` (and its alias) default alike."""
    import inspect

    from bertscope.experiments.circuits import Settings
    from bertscope.hooks import circuits

    d, s = table.DEFAULTS, Settings()
    for name in ("edge_method", "ig_steps", "candidates", "threshold", "n_random", "n_random_circuits",
                 "top_edges", "checked_edges"):
        assert getattr(s, name) == getattr(d, name), name
    edges = inspect.signature(circuits.edges).parameters
    assert edges["method"].default == d.edge_method and edges["steps"].default == d.ig_steps
    find = inspect.signature(circuits.find_circuit).parameters
    assert find["candidates"].default == d.candidates and find["threshold"].default == d.threshold
    assert inspect.signature(circuits.faithfulness).parameters["n_random"].default == d.n_random
    attribute = inspect.signature(circuits.attribute).parameters
    assert attribute["steps"].default == d.ig_steps and attribute["batch_size"].default == d.batch_size


def test_one_pair_has_no_interval():
    """An interval over pairs is never printed from one pair: NaN, and the interval column says why."""
    from bertscope.hooks.circuits.results import effects_table

    one = effects_table(np.array([[0.5, -0.2]]), np.array([1.0]), [("L0H0", 0, 0), ("L0H1", 0, 1)], method="x")
    assert one.effect.tolist() == [0.5, -0.2] and one.effect_low.isna().all() and one.normalised_high.isna().all()
    assert one.interval.iloc[0].startswith("none: 1 pair")
    two = effects_table(np.array([[0.5, -0.2], [0.1, 0.0]]), np.array([1.0, 1.0]), [("L0H0", 0, 0), ("L0H1", 0, 1)],
                        method="x")
    assert (two.effect_low <= two.effect).all() and (two.effect_low < two.effect_high).any()


BAD_TASKS = {
    "binary": (b"\x80\x81\xfe\xff garbage \x00\x9c", "not valid UTF-8"),
    "empty clean": (json.dumps({"clean": " ", "corrupted": "a b", "query": "a"}).encode(), "clean text is empty"),
    "empty corrupted": (json.dumps({"clean": "a b", "corrupted": "", "query": "a"}).encode(),
                        "corrupted text is empty"),
    "one pair": (json.dumps(GOOD[0]).encode(), "1 pair(s); at least 2"),
    "not json": (b"clean, corrupted\n", "not valid JSON"),
    "no pairs": (b"\n\n", "no pairs"),
}


@pytest.mark.parametrize("case", sorted(BAD_TASKS))
@pytest.mark.parametrize("command", ["circuits", "run"])
def test_bad_task_files_are_refused_in_one_line(case, command, tiny_folder, tmp_path, capsys):
    data, expected = BAD_TASKS[case]
    task = tmp_path / "task.jsonl"
    task.write_bytes(data)
    out = tmp_path / "out"
    argv = (["circuits", "--task", str(task), "--metric", "cosine"] if command == "circuits"
            else ["run", "circuits", "--task", str(task)])
    code = cli.main([*argv, "--model", str(tiny_folder), "--out", str(out), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("bertscope: error:"), err
    assert expected in err[0], err[0]
    assert not out.exists()


BAD_SETTINGS = {
    "circuits.n_pairs=0": "n_pairs must be at least 2",
    "circuits.n_pairs=1": "n_pairs must be at least 2",
    "circuits.ig_steps=0": "ig_steps must be at least 1",
    "circuits.threshold=1.5": "threshold must be in [0, 1)",
    "circuits.methods=exact,nope": "unknown nope",
    "circuits.edge_method=acdc": "unknown edge method 'acdc'",
    "circuits.metric=dot": "needs a task file",
    "circuits.task=/no/such/file.jsonl": "no such file",
    "circuits.n_random=-1": "n_random must be >= 0",
}


@pytest.mark.parametrize("item", sorted(BAD_SETTINGS))
def test_bad_settings_are_refused_before_any_work(item, tmp_path, capsys):
    """39.13: `run circuits --set circuits.n_pairs=0` blamed the corpus and left an empty folder; every bad
    setting now answers in one line, exit 2, before the model is loaded, with nothing written."""
    out = tmp_path / "out"
    code = cli.main(["run", "circuits", "--set", item, "--model", "/no/such/model", "--out", str(out), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and BAD_SETTINGS[item] in err[0], err
    assert not out.exists()


def test_an_edited_task_file_is_a_new_run(tiny_folder, tmp_path, capsys):
    """The task file's sha256 is part of the settings (and so of what a rerun must match): editing the file and
    running the same command recomputes instead of skipping the finished run."""
    task = _pairs(tmp_path / "pairs.jsonl", GOOD[:2])
    out = tmp_path / "out"
    argv = ["run", "circuits", "--task", str(task), "--model", str(tiny_folder), "--out", str(out), "--quiet",
            "--no-report", "--set", "circuits.methods=exact", "--set", "circuits.candidates=1", "--set",
            "circuits.n_random=0", "--set", "circuits.n_random_circuits=0", "--set", "circuits.checked_edges=0"]
    assert cli.main(argv) == 0, capsys.readouterr().err
    first = json.loads((out / "circuits" / "manifest.json").read_text())["settings"]["task_sha256"]
    assert cli.main(argv) == 0 and "skipped" in capsys.readouterr().out  # unchanged: the finished run stands
    _pairs(task, GOOD)
    assert cli.main(argv) == 0
    said = capsys.readouterr().out
    manifest = json.loads((out / "circuits" / "manifest.json").read_text())
    assert "skipped" not in said and manifest["settings"]["task_sha256"] != first
    assert manifest["notes"]["pairs"] == 3
