"""Structural probes (Hewitt & Manning 2019): known answers, the reference code's conventions, determinism,
and the `structure` experiment end to end on a tiny random encoder."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pandas as pd
import pytest
import torch
from bertscope.experiments import corpus as corpus_mod
from bertscope.experiments import structure
from bertscope.experiments.options import Inputs, RunOptions, UsageError, corpus_summary, model_summary
from bertscope.experiments.runner import run_experiment
from bertscope.probes import structural as st
from bertscope.probes import structural_fit as fit
from bertscope.probes.structural import StructuralProbe
from scipy.sparse.csgraph import shortest_path
from scipy.stats import spearmanr

from bertscope import models


@pytest.fixture(autouse=True)
def one_thread():
    """Many small steps: one torch thread is much faster than two on a shared machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


CORPUS = corpus_mod.load_corpus("builtin", max_sentences=160)
HEADS = [list(s.heads) for s in CORPUS]
PUNCT = [np.array([u == "PUNCT" for u in s.upos]) for s in CORPUS]


def path_embedding(heads, d: int = 48) -> np.ndarray:
    """x_i = sum of one-hot vectors of the edges on i's path to the root: ||x_i - x_j||^2 = d_tree(i, j) and
    ||x_i||^2 = depth(i) exactly."""
    x = np.zeros((len(heads), d))
    for i in range(len(heads)):
        j = i + 1
        while heads[j - 1] != 0:
            x[i, j - 1] = 1.0
            j = heads[j - 1]
    return x


# ----------------------------------------------------------------------------- the reporter, written again


def reporter_edges(matrix, punct):
    """reporter.prims_matrix_to_edges: pairs sorted by distance, union-find, punctuation never in the tree."""
    parents = list(range(len(matrix)))

    def find(i):
        while parents[i] != i:
            i = parents[i]
        return i

    pairs = {(i, j): matrix[i][j] for i in range(len(matrix)) for j in range(len(matrix))
             if not punct[i] and not punct[j]}
    edges = []
    for (i, j), _ in sorted(pairs.items(), key=lambda x: x[1]):
        if find(i) != find(j):
            parents[find(i)] = j
            edges.append((i, j))
    return edges


def reporter_uuas(preds, heads, punct):
    correct = total = 0
    for p, h, pu in zip(preds, heads, punct, strict=True):
        gold = {tuple(sorted(e)) for e in reporter_edges(st.tree_distances(h), pu)}
        pred = {tuple(sorted(e)) for e in reporter_edges(p, pu)}
        correct += len(gold & pred)
        total += len(gold)
    return correct / total


def reporter_spearman(preds, golds):
    by_length = defaultdict(list)
    for p, g in zip(preds, golds, strict=True):
        if p.ndim == 2:
            by_length[len(p)].extend(spearmanr(a, b).correlation for a, b in zip(p, g, strict=True))
        else:
            by_length[len(p)].append(spearmanr(p, g).correlation)
    means = {n: np.mean(v) for n, v in by_length.items()}
    return np.mean([means[n] for n in range(5, 51) if n in means])


def reporter_root(preds, heads, punct):
    hits = 0
    for p, h, pu in zip(preds, heads, punct, strict=True):
        p = np.array(p, dtype=float)
        argmin = int(np.argmin(p))
        for _ in range(len(p)):
            argmin = int(np.argmin(p))
            if not pu[argmin]:
                break
            p[argmin] = 9000
        hits += list(h).index(0) == argmin
    return hits / len(preds)


# ----------------------------------------------------------------------------------------------- tests


def test_tree_distances_and_depths_are_path_lengths():
    for h in HEADS[:60]:
        n = len(h)
        adj = np.zeros((n, n))
        child = [i for i in range(n) if h[i]]
        adj[child, [h[i] - 1 for i in child]] = 1
        np.testing.assert_array_equal(st.tree_distances(h), shortest_path(adj, directed=False, unweighted=True))
        np.testing.assert_array_equal(st.tree_depths(h), st.tree_distances(h)[h.index(0)])
    assert st.tree_depths([2, 0, 2, 3]).tolist() == [1, 0, 1, 2]


def test_metrics_match_the_reporter_on_random_predictions():
    rng = np.random.default_rng(0)
    dists, depths = [], []
    heads, punct = HEADS[:70], PUNCT[:70]
    for h in heads:
        a = rng.random((len(h), len(h))) + 0.3 * st.tree_distances(h)
        a = a + a.T
        np.fill_diagonal(a, 0)
        dists.append(a)
        depths.append(rng.random(len(h)) + 0.3 * st.tree_depths(h))
    assert any(p.any() for p in punct)
    assert st.uuas(dists, heads, punct) == pytest.approx(reporter_uuas(dists, heads, punct))
    gold_d = [st.tree_distances(h) for h in heads]
    assert st.distance_spearman(dists, heads) == pytest.approx(reporter_spearman(dists, gold_d))
    gold_n = [st.tree_depths(h) for h in heads]
    assert st.norm_spearman(depths, heads) == pytest.approx(reporter_spearman(depths, gold_n))
    assert st.root_accuracy(depths, heads, punct) == pytest.approx(reporter_root(depths, heads, punct))
    # the linear chain scored like any predicted distance matrix
    chains = [st.linear_chain_distances(len(h)).astype(float) for h in heads]
    assert st.uuas(chains, heads, punct) == pytest.approx(reporter_uuas(chains, heads, punct))


def test_loss_is_the_reference_l1_normalised_by_length():
    xs = [np.random.default_rng(i).normal(size=(len(h), 6)) for i, h in enumerate(HEADS[:5])]
    b = torch.tensor(np.random.default_rng(9).normal(size=(1, 6, 3)), dtype=torch.float32)
    packed = fit.Sentences.from_list(xs, HEADS[:5])
    specs = [fit.ProbeSpec("distance"), fit.ProbeSpec("depth")]
    both = torch.cat([b, b], dim=-1)  # the two probes side by side, as fit_probes holds them
    losses = fit.batch_loss(packed, np.arange(5), both, None, specs, [slice(0, 3), slice(3, 6)])
    for p, (kind, power) in enumerate((("distance", 2), ("depth", 1))):
        got = losses[:, p]
        per_sent = []
        for x, h in zip(xs, HEADS[:5], strict=True):
            t = x @ b[0].double().numpy()
            if kind == "distance":
                pred = ((t[:, None] - t[None]) ** 2).sum(-1)
                gold = st.tree_distances(h)
            else:
                pred, gold = (t**2).sum(-1), st.tree_depths(h)
            per_sent.append(np.abs(pred - gold).sum() / len(h) ** power)
        assert float(got[0]) == pytest.approx(np.mean(per_sent), rel=1e-4)


def test_closed_form_gradient_equals_autograd_of_the_reference_loss():
    """`batch_loss_grad` differentiates by hand; autograd of the loss written sentence by sentence (float64,
    no padding) must give the same gradient, at every site of a subset and for both kinds and two ranks."""
    rng = np.random.default_rng(5)
    heads = HEADS[:7]
    xs = [rng.normal(size=(3, len(h), 6)) for h in heads]
    packed = fit.Sentences.from_list(xs, heads)
    specs = [fit.ProbeSpec("distance"), fit.ProbeSpec("depth"), fit.ProbeSpec("distance", 2)]
    blocks = [slice(0, 6), slice(6, 12), slice(12, 14)]
    weight = torch.tensor(rng.normal(scale=0.4, size=(3, 6, 14)), dtype=torch.float32)
    rows, sites = np.array([4, 0, 6, 2]), torch.tensor([2, 0])
    loss, grad = fit.batch_loss_grad(packed, rows, weight[sites], sites, specs, blocks)
    w = weight[sites].double().requires_grad_(True)
    ref = []
    for j, site in enumerate(sites.tolist()):
        per_probe = []
        for spec, blk in zip(specs, blocks, strict=True):
            errs = []
            for i in rows:
                t = torch.as_tensor(xs[i][site]) @ w[j][:, blk]
                if spec.kind == "distance":
                    pred = ((t[:, None] - t[None]) ** 2).sum(-1)
                    errs.append((pred - torch.as_tensor(st.tree_distances(heads[i]))).abs().sum() / len(t) ** 2)
                else:
                    errs.append(((t**2).sum(-1) - torch.as_tensor(st.tree_depths(heads[i]))).abs().sum() / len(t))
            per_probe.append(torch.stack(errs).mean())
        ref.append(torch.stack(per_probe))
    ref = torch.stack(ref)
    (ref_grad,) = torch.autograd.grad(ref.sum(), w)
    torch.testing.assert_close(loss.double(), ref.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad.double(), ref_grad, rtol=1e-4, atol=1e-5)
    assert ref_grad.abs().max() > 0.1  # a gradient worth comparing


def test_isometric_tree_embedding_gives_exact_scores_and_is_learned_with_default_settings():
    xs = [path_embedding(h) for h in HEADS]
    exact_d = [((x[:, None] - x[None]) ** 2).sum(-1) for x in xs]
    exact_n = [(x**2).sum(-1) for x in xs]
    assert st.uuas(exact_d, HEADS, PUNCT) == 1.0
    assert st.distance_spearman(exact_d, HEADS) == pytest.approx(1.0)
    assert st.root_accuracy(exact_n, HEADS, PUNCT) == 1.0
    assert st.norm_spearman(exact_n, HEADS) == pytest.approx(1.0)
    # The default regimen (the paper's, trained to early stopping) learns the known answer from the same
    # embedding rotated and scaled (squared distances = 16 x tree distances; real features are not axis-aligned
    # 0/1 vectors) and stops by itself, well before the max_epochs cap.
    rotation = np.linalg.qr(np.random.default_rng(0).normal(size=(48, 48)))[0]
    xs = [4 * x @ rotation for x in xs]
    probe = StructuralProbe("distance", seed=0).fit(xs[:100], HEADS[:100])
    assert probe.early_stopped_.all() and probe.n_epochs_ < probe.max_epochs / 2
    assert probe.stopped_epoch_[0] == probe.best_epoch_[0] + probe.patience + 2  # best epoch, then patience + 1
    pred = probe.predict(xs[100:])
    assert st.uuas(pred, HEADS[100:], PUNCT[100:]) == 1.0
    assert st.distance_spearman(pred, HEADS[100:]) > 0.9
    depth = StructuralProbe("depth", seed=0).fit(xs[:100], HEADS[:100])
    assert depth.early_stopped_.all() and depth.n_epochs_ < depth.max_epochs / 2
    assert st.root_accuracy(depth.predict(xs[100:]), HEADS[100:], PUNCT[100:]) == 1.0
    assert st.norm_spearman(depth.predict(xs[100:]), HEADS[100:]) > 0.9


def test_metrics_score_many_predictions_at_once_as_one_by_one():
    rng = np.random.default_rng(5)
    heads, punct = HEADS[:40], PUNCT[:40]
    dists = [rng.random((3, 2, len(h), len(h))) + 0.2 * st.tree_distances(h) for h in heads]  # [probe, site, n, n]
    dists = [a + np.swapaxes(a, -1, -2) for a in dists]  # predicted distances are symmetric
    depths = [rng.random((3, 2, len(h))) + 0.2 * st.tree_depths(h) for h in heads]
    got_u = st.uuas(dists, heads, punct)
    got_d = st.distance_spearman(dists, heads)
    got_r, got_n = st.root_accuracy(depths, heads, punct), st.norm_spearman(depths, heads)
    assert got_u.shape == got_d.shape == got_r.shape == (3, 2)
    for a in range(3):
        for b in range(2):
            one = [x[a, b] for x in dists]
            assert got_u[a, b] == pytest.approx(st.uuas(one, heads, punct))
            assert got_u[a, b] == pytest.approx(reporter_uuas(one, heads, punct))
            assert got_d[a, b] == pytest.approx(st.distance_spearman(one, heads))
            assert got_r[a, b] == pytest.approx(st.root_accuracy([x[a, b] for x in depths], heads, punct))
            assert got_n[a, b] == pytest.approx(st.norm_spearman([x[a, b] for x in depths], heads))
    forest = st.mst_forest(np.stack([x[0, 0] for x in dists[:1]] * 2), ~punct[0])
    edges = st.mst_edges(dists[0][0, 0], ~punct[0])
    for t in range(2):
        assert {(int(i), int(j)) for k, i, j in zip(*forest, strict=True) if k == t} == edges


def test_kinds_and_ranks_trained_in_one_pass_equal_each_trained_alone():
    """Probes stop at different epochs; the pass drops stopped probes' columns and stopped sites, and every
    probe is still exactly the one trained alone."""
    rng = np.random.default_rng(3)
    noise = [rng.normal(size=(2, len(h), 48)) for h in HEADS[:50]]
    path = [path_embedding(h)[None] + 0.1 * rng.normal(size=(1, len(h), 48)) for h in HEADS[:50]]
    reg = fit.Regimen(max_epochs=16, seed=1)

    def sets(xs):
        return fit.Sentences.from_list(xs[:40], HEADS[:40]), fit.Sentences.from_list(xs[40:], HEADS[40:50])

    # two noise sites: the full-rank probes stop early at both (columns dropped), the rank-2 probe goes on
    specs = [fit.ProbeSpec("distance"), fit.ProbeSpec("depth"), fit.ProbeSpec("distance", 2)]
    together = fit.fit_probes(*sets(noise), specs, reg)
    assert together[0].n_epochs.max() < together[2].n_epochs.min() and together[1].early_stopped.all()
    for spec, res in zip(specs, together, strict=True):
        (alone,) = fit.fit_probes(*sets(noise), [spec], reg)
        torch.testing.assert_close(res.proj, alone.proj, rtol=1e-4, atol=1e-5)
        np.testing.assert_array_equal(res.best_epoch, alone.best_epoch)
        np.testing.assert_array_equal(res.n_epochs, alone.n_epochs)
        assert res.proj.shape == (2, 48, 48 if spec.rank is None else spec.rank)
    # a tree site and a noise site: the noise site stops first and leaves the pass
    mixed = [np.concatenate([p, n[:1]]) for p, n in zip(path, noise, strict=True)]
    (both,) = fit.fit_probes(*sets(mixed), [fit.ProbeSpec("distance")], reg)
    assert both.n_epochs[1] < both.n_epochs[0]
    for site in range(2):
        (alone,) = fit.fit_probes(*sets([x[site] for x in mixed]), [fit.ProbeSpec("distance")], reg)
        torch.testing.assert_close(both.proj[site], alone.proj[0], rtol=1e-4, atol=1e-5)
        assert both.n_epochs[site] == alone.n_epochs[0]


def test_shuffled_features_fall_to_the_random_tree_level():
    rng = np.random.default_rng(1)
    xs = [path_embedding(h)[rng.permutation(len(h))] for h in HEADS]
    probe = StructuralProbe("distance", max_epochs=6, seed=0).fit(xs[:100], HEADS[:100])
    got = st.uuas(probe.predict(xs[100:]), HEADS[100:], PUNCT[100:])
    m = np.array([(~p).sum() for p in PUNCT[100:]])
    random_tree = ((m - 1) * 2 / m).sum() / (m - 1).sum()  # E[UUAS] of a uniform random spanning tree
    assert abs(got - random_tree) < 0.1
    assert got < 0.5


def test_sites_trained_together_equal_sites_trained_alone_and_seed_decides():
    rng = np.random.default_rng(2)
    a = [rng.normal(size=(len(h), 48)) for h in HEADS[:40]]
    b = [path_embedding(h) + 0.1 * rng.normal(size=(len(h), 48)) for h in HEADS[:40]]
    both = [np.stack([x, y]) for x, y in zip(a, b, strict=True)]
    kw = dict(max_epochs=5, seed=3)
    joint = StructuralProbe("distance", **kw).fit(both, HEADS[:40])
    alone = [StructuralProbe("distance", **kw).fit(x, HEADS[:40]) for x in (a, b)]
    for s in range(2):
        torch.testing.assert_close(joint.proj_[s], alone[s].proj_, rtol=1e-4, atol=1e-5)
        assert joint.best_epoch_[s] == alone[s].best_epoch_[0]
    again = StructuralProbe("distance", **kw).fit(both, HEADS[:40])
    assert torch.equal(joint.proj_, again.proj_)
    other = StructuralProbe("distance", max_epochs=5, seed=4).fit(both, HEADS[:40])
    assert not torch.equal(joint.proj_, other.proj_)
    assert joint.predict(both[:2])[0].shape == (2, len(HEADS[0]), len(HEADS[0]))
    assert StructuralProbe("distance", rank=2, **kw).fit(a, HEADS[:40]).transform(a[:1])[0].shape == (len(a[0]), 2)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="kind"):
        StructuralProbe("parse")
    with pytest.raises(ValueError, match="heads"):
        StructuralProbe().fit([np.zeros((3, 4))] * 4, [[0, 1]] * 4)
    with pytest.raises(RuntimeError, match="not fitted"):
        StructuralProbe().predict([np.zeros((3, 4))])


# ------------------------------------------------------------------------------------------- experiment


@pytest.fixture(scope="module")
def tiny(tiny_config, tokenizer):
    return models.random_encoder(tiny_config, seed=0, tokenizer=tokenizer)


SMALL = structure.Settings(n_train=30, n_dev=10, n_test=20, max_epochs=3, ranks=(1, 4), n_boot=50, n_examples=2,
                           sublayers=True)


def test_sublayer_sites_can_be_chosen_by_name():
    from bertscope.experiments.structure import data

    assert data.sublayer_sites(2, ("resid_mid",)) == ["blocks.0.hook_resid_mid", "blocks.1.hook_resid_mid"]
    assert len(data.sublayer_sites(2)) == 6
    with pytest.raises(ValueError, match="sublayers must be"):
        structure.Settings(sublayers=("resid_post",))


def test_passes_trained_side_by_side_equal_the_passes_trained_in_turn(tiny, tmp_path, monkeypatch):
    # workers=2 trains the passes in forked one-thread processes (the job service); workers=1 with threads=1 in
    # this process, one after another, on one thread too: the same probes bit for bit, cached alike (a rerun
    # trains nothing)
    import dataclasses

    from bertscope.experiments.structure import plots

    monkeypatch.setattr(plots, "FORMATS", ("png",))
    corpus = corpus_mod.load_corpus("builtin", max_sentences=80)
    inputs = Inputs(tiny, corpus, torch.device("cpu"), torch.float32, model_summary(tiny), corpus_summary(corpus))
    tables = {}
    for workers in (1, 2):
        monkeypatch.setattr(structure, "Settings", lambda w=workers: dataclasses.replace(SMALL, workers=w, threads=1))
        result = run_experiment(structure, RunOptions(out=tmp_path / str(workers), quiet=True, keep_steps=True), inputs)
        assert result.status == "complete", result.error
        tables[workers] = pd.read_parquet(tmp_path / str(workers) / "structure" / "training.parquet")
        tables[f"res{workers}"] = pd.read_parquet(tmp_path / str(workers) / "structure" / "results.parquet")
    pd.testing.assert_frame_equal(tables[1], tables[2], check_exact=True)
    pd.testing.assert_frame_equal(tables["res1"], tables["res2"], check_exact=True)
    steps = sorted(p.name for p in (tmp_path / "2" / "structure" / "steps").glob("probes-*.npz"))
    assert len(steps) == 3  # one cached step per pass, as before
    with monkeypatch.context() as m:
        from bertscope.experiments.structure import passes

        m.setattr(passes, "fit_probes", lambda *a, **k: pytest.fail("a cached pass was trained again"))
        options = RunOptions(out=tmp_path / "2", quiet=True, force=False)
        (tmp_path / "2" / "structure" / "manifest.json").unlink()  # not complete: rerun, reusing the steps
        assert run_experiment(structure, options, inputs).status == "complete"


def test_experiment_writes_tables_figures_and_findings(tiny, tmp_path, monkeypatch):
    from bertscope.experiments.structure import plots

    monkeypatch.setattr(structure, "Settings", lambda: SMALL)
    monkeypatch.setattr(plots, "FORMATS", ("png",))  # PDFs cost time and prove nothing more here
    corpus = corpus_mod.load_corpus("builtin", max_sentences=80)
    inputs = Inputs(tiny, corpus, torch.device("cpu"), torch.float32, model_summary(tiny), corpus_summary(corpus))
    result = run_experiment(structure, RunOptions(out=tmp_path, quiet=True), inputs)
    assert result.status == "complete", result.error
    out = tmp_path / "structure"
    res = pd.read_parquet(out / "results.parquet")
    assert list(res.columns) == structure.experiment.COLUMNS
    assert set(res["metric"]) == {"uuas", "dspr", "root_acc", "nspr"}
    assert {"trained", "random_weights", "baseline:linear_chain", "baseline:random_tree"} == set(res["encoder"])
    assert (res["split"] == "test").all() and res["n_train"].iloc[0] == 30 and res["n_test"].iloc[0] == 20
    assert len(res[(res["encoder"] == "trained") & (res["metric"] == "uuas")]) == 1 + 2 * 4  # embed + 2 x 4 sites
    assert res["model"].iloc[0] == str(tiny.source) and (res["corpus"] == "builtin").all()
    ok = res["ci_low"].isna() | (res["ci_low"] <= res["value"] + 1e-9)
    assert ok.all()
    summary = pd.read_csv(out / "summary.csv")
    assert summary["layer"].tolist() == [0, 1, 2]
    sweep = pd.read_parquet(out / "rank_sweep.parquet")
    assert sorted(sweep["rank"].unique()) == [1, 4, 32]
    assert set(sweep["encoder"]) == {"trained"}  # the rank sweep is the trained model's
    assert sweep.groupby(["encoder", "metric", "site"]).size().eq(3).all()  # each site: ranks 1, 4, full per metric
    training = pd.read_parquet(out / "training.parquet")
    assert {"best_epoch", "stopped_epoch", "early_stopped", "max_epochs"} <= set(training.columns)
    assert (training["stopped_epoch"] <= training["max_epochs"]).all()
    assert (training["best_epoch"] < training["stopped_epoch"]).all()
    assert ((training["stopped_epoch"] < training["max_epochs"]) == training["early_stopped"]).all()
    probes = res[~res["encoder"].str.startswith("baseline:")]
    assert probes[["dev_value", "dev_ci_low", "dev_ci_high"]].notna().all().all()
    assert res.loc[res["encoder"].str.startswith("baseline:"), "dev_value"].isna().all()
    for r in summary.loc[summary["smallest_rank"].notna()].itertuples():  # chosen on dev: reaches the dev interval
        at = sweep[(sweep["site"] == r.site) & (sweep["metric"] == "uuas") & (sweep["encoder"] == "trained")]
        full = at[at["rank"] == at["rank"].max()].iloc[0]
        assert at.loc[at["rank"] == r.smallest_rank, "dev_value"].iloc[0] >= full["dev_ci_low"] - 1e-12
        assert r.uuas_at_smallest_rank == at.loc[at["rank"] == r.smallest_rank, "value"].iloc[0]
    assert (summary["best_on_dev"].str.contains("uuas")).sum() == 1
    assert summary.loc[summary["best_on_dev"].str.contains("uuas"), "dev_uuas"].iloc[0] == summary["dev_uuas"].max()
    for stem in ("structure_layers", "structure_rank", "structure_trees"):
        assert (out / f"{stem}.png").is_file() and stem in structure.CAPTIONS
    found = structure.findings(out)
    assert found and "Chosen on the dev sentences" in found[0].text


def test_best_layer_and_smallest_rank_are_chosen_on_dev_and_reported_on_test(tmp_path):
    """Layer 2 is best on test but layer 1 on dev: the summary, the findings and the rank rule follow dev."""
    rows = []
    for layer, (test, dev) in enumerate([(0.5, 0.5), (0.6, 0.8), (0.9, 0.6)]):
        site = "embed.hook_out" if layer == 0 else f"blocks.{layer - 1}.hook_resid_post"
        comp = "embed" if layer == 0 else "resid_post"
        for rank, scale in ((1, 0.5), (2, 1.0), (8, 1.0)):  # rank 2 matches full rank on dev only at layer 1
            t, dv = test * (scale if rank < 8 else 1), dev * (scale if rank < 8 else 1)
            dv = dv if (layer == 1 or rank == 8 or rank == 1) else dev * 0.7
            rows.append({"encoder": "trained", "site": site, "layer": layer, "component": comp, "kind": "distance",
                         "metric": "uuas", "rank": rank, "value": t, "ci_low": t - 0.02, "ci_high": t + 0.02,
                         "dev_value": dv, "dev_ci_low": dv - 0.02, "dev_ci_high": dv + 0.02})
    for name in ("linear_chain", "random_tree"):
        rows.append({"encoder": f"baseline:{name}", "site": "", "layer": -1, "component": "", "kind": "distance",
                     "metric": "uuas", "rank": 0, "value": 0.3, "ci_low": 0.28, "ci_high": 0.32, "dev_value": np.nan,
                     "dev_ci_low": np.nan, "dev_ci_high": np.nan})
    table = pd.DataFrame(rows)
    sweep = table[table["encoder"] == "trained"]
    results = table[(table["rank"] == 8) | table["encoder"].str.startswith("baseline:")]
    summary = structure.experiment.summary_table(results, sweep)
    assert summary["best_on_dev"].tolist() == ["", "uuas", ""]
    assert summary.loc[1, "smallest_rank"] == 2 and summary.loc[1, "uuas_at_smallest_rank"] == pytest.approx(0.6)
    assert summary.loc[2, "smallest_rank"] == 8  # on test rank 2 would reach; on dev it does not
    summary.to_parquet(tmp_path / "summary.parquet")
    found = structure.findings(tmp_path)
    # table layer 1 = hidden_states[1], the output of blocks.0: "after layer 0" in the report's numbering
    assert "residual stream after layer 0 (of 2 layers)" in found[0].text
    assert found[0].numbers["peak_uuas"] == pytest.approx(0.6)


def test_corpus_without_trees_is_refused_by_the_framework_exception(tiny, tmp_path):
    """`registry.CannotRun` (not the CLI's UsageError) from ``check`` up front and from ``run`` alike."""
    from bertscope.experiments.registry import CannotRun

    plain = [corpus_mod.Sentence(s.id, s.words, s.text) for s in CORPUS[:10]]
    corpus = corpus_mod.Corpus("plain", "test", plain)
    inputs = Inputs(tiny, corpus, torch.device("cpu"), torch.float32, model_summary(tiny), corpus_summary(corpus))
    from bertscope.experiments.context import Context

    with pytest.raises(CannotRun, match="gold dependency trees"):
        structure.check(inputs, SMALL)
    ctx = Context("structure", RunOptions(out=tmp_path, quiet=True), inputs, tmp_path / "structure",
                  settings=SMALL)
    with pytest.raises(CannotRun, match="gold dependency trees") as caught:
        structure.run(ctx)
    assert not isinstance(caught.value, UsageError)
    assert not (tmp_path / "structure").exists()

