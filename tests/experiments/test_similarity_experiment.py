"""The `similarity` experiment's pieces against known answers: the negation rule, the split, correlations and the
chosen row, the head ablation (against the hooks' own ``ablate_heads``), removals (a planted top pair is the one
removed; deleting pieces equals the text without them), faithfulness drops, the concentration control, and
findings formatted from the tables."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from bertscope.experiments.similarity import data, measures

import bertscope
from bertscope import similarity


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from helpers import save_tiny_bert

    folder = tmp_path_factory.mktemp("tiny-bert")
    save_tiny_bert(folder)
    model = bertscope.load(str(folder))
    model.eval()
    return model


# ---------------------------------------------------------------------------------------------- data
@pytest.mark.parametrize(("text", "negated"), [
    ("The man is playing a guitar.", "The man is not playing a guitar."),
    ("She can swim.", "She can not swim."),
    ("Was it late?", "Was not it late?"),
    ("It has been sold.", "It has not been sold."),
])
def test_negation_inserts_not_after_the_first_auxiliary(text, negated) -> None:
    assert data.negate(text) == (negated, "")
    assert data.control(negated) == negated.replace(" not", " now", 1)


@pytest.mark.parametrize(("text", "why"), [("Dogs bark loudly.", "no auxiliary or copula"),
                                           ("He is not here.", "negated already"),
                                           ("She can't swim.", "negated already")])
def test_negation_skips_and_says_why(text, why) -> None:
    assert data.negate(text) == (None, why)
    edits = data.negation_edits([text, text, "The cat is black."])
    assert len(edits) == 2 and list(edits.skipped) == [why, ""]


def test_builtin_pairs_cover_every_contrast_on_the_sts_scale() -> None:
    rows = data.builtin_rows()
    assert len(rows) >= 40
    assert {r["kind"] for r in rows} == {"paraphrase", "partial", "unrelated", "negation", "word swap"}
    assert all(0 <= r["score"] <= 5 and r["a"].strip() and r["b"].strip() for r in rows)


def test_split_is_seeded_and_leaves_both_sides() -> None:
    s = data.split(44, 0.5, seed=0)
    assert s.sum() == 22 and np.array_equal(s, data.split(44, 0.5, seed=0))
    assert not np.array_equal(s, data.split(44, 0.5, seed=1))
    assert data.split(3, 0.9, 0).sum() == 2  # at least one pair reported


def test_head_ablation_equals_the_hooks_mean_ablation(tiny) -> None:
    from bertscope.hooks import interventions

    a, b = ["the cat sat on the mat", "dogs bark", "a bird sang"], ["a cat sits", "the dog is barking loudly", "x"]
    got = data.head_ablation_scores(tiny, a, b, pooling="mean", batch_size=2)
    assert got.shape == (2, 4, 3)
    reference = interventions.mean_z(tiny, list(dict.fromkeys(a + b)))
    for layer, head in [(0, 0), (1, 3)]:
        with tiny.hooks(interventions.ablate_heads(tiny, {layer: [head]}, "mean", reference=reference)):
            e = similarity.embed(tiny, a + b, pooling="mean")[(similarity.final_site(tiny), "mean")]
        np.testing.assert_allclose(got[layer, head], similarity.score(e[:3], e[3:]).numpy(), atol=1e-5)


def test_removals_know_their_answers(tiny) -> None:
    a, b = ["the cat sat on the mat", "dogs bark"], ["a cat sits", "the dog is barking"]
    ids_a, ids_b = data.piece_ids(tiny, a), data.piece_ids(tiny, b)
    intact = data.removal_scores(tiny, ids_a, ids_b, measures.intact_plans(2), pooling="mean")
    e = similarity.embed(tiny, a + b, pooling="mean")[(similarity.final_site(tiny), "mean")]
    np.testing.assert_allclose(intact, similarity.score(e[:2], e[2:]).numpy(), atol=1e-5)
    plan = pd.DataFrame({"pair": [0], "positions_a": [[2]], "positions_b": [[2]]})  # "cat" on both sides
    deleted = data.removal_scores(tiny, ids_a, ids_b, plan, pooling="mean", removal="delete")
    e2 = similarity.embed(tiny, ["the sat on the mat", "a sits"], pooling="mean")[(similarity.final_site(tiny),
                                                                                  "mean")]
    np.testing.assert_allclose(deleted, similarity.score(e2[:1], e2[1:]).numpy(), atol=1e-5)
    padded = data.removal_scores(tiny, ids_a, ids_b, plan, pooling="mean", removal="reference")
    pad = data.pad_id(tiny)
    ea = data.embed_ids(tiny, [[pad if n == 2 else t for n, t in enumerate(ids_a[0])]], pooling="mean")
    eb = data.embed_ids(tiny, [[pad if n == 2 else t for n, t in enumerate(ids_b[0])]], pooling="mean")
    np.testing.assert_allclose(padded, similarity.score(ea, eb).numpy(), atol=1e-6)
    one = data.removal_scores(tiny, ids_a, ids_b, plan, pooling="mean", removal="delete", sides="one")
    e3 = similarity.embed(tiny, ["the sat on the mat", "a cat sits", "the cat sat on the mat", "a sits"],
                          pooling="mean")[(similarity.final_site(tiny), "mean")]
    only_a, only_b = similarity.score(e3[:1], e3[1:2]), similarity.score(e3[2:3], e3[3:])
    np.testing.assert_allclose(one, ((only_a + only_b) / 2).numpy(), atol=1e-5)  # a's cat gone, then b's
    with pytest.raises(ValueError, match="sides must be one of"):
        data.removal_scores(tiny, ids_a, ids_b, plan, pooling="mean", sides="neither")


# ---------------------------------------------------------------------------------------------- measures
def test_correlations_and_the_chosen_row() -> None:
    rng = np.random.default_rng(0)
    gold = rng.uniform(0, 5, 40)
    select = data.split(40, 0.5, 0)
    scores = {("blocks.0.hook_resid_post", "mean"): rng.normal(size=40),
              ("blocks.1.hook_resid_post", "mean"): gold ** 3,  # monotone in gold: Spearman 1
              ("blocks.1.hook_resid_post", "cls"): -gold}
    df = measures.benchmark_table(scores, gold, select, own=("blocks.1.hook_resid_post", "cls"), n_boot=200, seed=0)
    assert len(df) == 6 and set(df.split) == {"select", "report"}
    best = df[df.chosen]
    assert set(best.site) == {"blocks.1.hook_resid_post"} and set(best.pooling) == {"mean"} and len(best) == 2
    assert np.allclose(best.spearman, 1.0) and np.allclose(df[df.own].spearman, -1.0)
    assert (df.spearman_low <= df.spearman + 1e-12).all() and (df.spearman <= df.spearman_high + 1e-12).all()
    assert list(df[df.split == "report"].n_pairs.unique()) == [20]


def test_heads_table_shares_and_ablation_change() -> None:
    n = 30
    gold = np.linspace(0, 5, n)
    base = gold / 5
    ablated = np.tile(base, (2, 2, 1))
    ablated[1, 0] = np.random.default_rng(1).permutation(base)  # head L1H0 ablated: ranking destroyed
    rows = [(p, name, layer, head, kind, share) for p in range(n) for name, layer, head, kind, share in
            [("a0.h0", 0, 0, "head", 0.1), ("a0.h1", 0, 1, "head", 0.0), ("a1.h0", 1, 0, "head", 0.3),
             ("a1.h1", 1, 1, "head", 0.0), ("m0", 0, -1, "mlp", 0.2), ("embeddings", -1, -1, "embeddings", 0.1)]]
    shares = pd.DataFrame(rows, columns=["pair", "component", "layer", "head", "kind", "share"])
    df = measures.heads_table(shares, ablated, base, gold, n_boot=100, seed=0)
    h = df.set_index("component")
    assert h.loc["a1.h0", "share"] == pytest.approx(0.3) and h.loc["m0", "share"] == pytest.approx(0.2)
    assert h.loc["a0.h0", "spearman_change"] == pytest.approx(0.0)
    assert h.loc["a1.h0", "spearman_change"] < -0.5 and h.loc["a1.h0", "change_high"] < 0
    assert np.isnan(h.loc["m0", "spearman_change"])


def test_removal_plans_remove_the_planted_pair_first() -> None:
    m = np.zeros((5, 4))
    m[2, 1] = 5.0  # planted pair
    m[3, 2] = 1.0
    m[0, 0] = 9.0  # [CLS]/[CLS]: special, never removed
    sa, sb = np.array([1, 0, 0, 0, 1], bool), np.array([1, 0, 0, 1], bool)
    plans = measures.removal_plans({"planted": [m]}, [sa], [sb], ks=(1, 2), n_random=3, seed=0)
    top = plans[plans.method == "planted"].set_index("k")
    assert top.loc[1, "positions_a"] == [2] and top.loc[1, "positions_b"] == [1]
    assert top.loc[2, "positions_a"] == [2, 3] and top.loc[2, "positions_b"] == [1, 2]
    matched = plans[plans.method == "matched:planted"]
    assert (matched.positions_a.map(len) == matched.k).all() and len(matched) == 6
    rand = plans[plans.method == "random"]
    for r in rand.itertuples():
        assert not set(r.positions_a) & {0, 4} and not set(r.positions_b) & {0, 3}


def test_faithfulness_drops_are_the_planted_differences() -> None:
    plans = measures.removal_plans({"m": [np.eye(4)] * 3}, [np.array([1, 0, 0, 1], bool)] * 3,
                                   [np.array([1, 0, 0, 1], bool)] * 3, ks=(1, 2), n_random=2, seed=0)
    before = np.array([0.9, 0.8, 0.7])
    after = before[plans.pair.to_numpy()] - np.where(plans.method == "m", 0.5, 0.1)
    faith, aopc = measures.faithfulness_tables(plans, {"delete": after}, before, n_boot=100, seed=0)
    m = faith[faith.method == "m"]
    assert np.allclose(m["drop"], 0.5) and np.allclose(m.random_drop, 0.1) and np.allclose(m.matched_drop, 0.1)
    assert set(m.vs_random) == {"above"} and set(m.vs_matched) == {"above"}
    row = aopc.set_index("method").loc["m"]
    assert row.aopc == pytest.approx(0.5) and row.ratio_to_random == pytest.approx(5.0) and row.removal == "delete"
    assert row.sides == "both" and np.isnan(row.ratio_to_rollout)  # a bare removal key means both texts


def test_aopc_ratio_to_rollout_is_the_planted_ratio() -> None:
    """Planted drops: the method 0.5, attention rollout 0.2 on every pair, random 0.1: the method's AOPC is 2.5
    times rollout's (the interval too, every resample has the same ratio), rollout's own ratio is 1."""
    mats = {"m": [np.eye(4)] * 4, measures.ROLLOUT: [np.eye(4)] * 4}
    special = [np.array([1, 0, 0, 1], bool)] * 4
    plans = measures.removal_plans(mats, special, special, ks=(1, 2), n_random=2, seed=0)
    before = np.array([0.9, 0.8, 0.7, 0.6])
    drop = np.select([plans.method == "m", plans.method == measures.ROLLOUT], [0.5, 0.2], 0.1)
    after = before[plans.pair.to_numpy()] - drop
    faith, aopc = measures.faithfulness_tables(plans, {("delete", "one"): after}, before, n_boot=50, seed=0)
    assert set(faith.sides) == {"one"} and list(faith.columns[:3]) == ["removal", "sides", "method"]
    rows = aopc.set_index("method")
    assert rows.loc["m", "ratio_to_rollout"] == pytest.approx(2.5)
    assert rows.loc["m", "ratio_to_rollout_low"] == pytest.approx(2.5)
    assert rows.loc["m", "ratio_to_rollout_high"] == pytest.approx(2.5)
    assert rows.loc[measures.ROLLOUT, "ratio_to_rollout"] == pytest.approx(1.0)


def test_concentration_control_separates_one_dominant_pair_from_token_weights() -> None:
    rank_one = np.outer([1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 2.0, 5.0])
    assert measures.top_share(rank_one, 0.1) == pytest.approx(measures.top_share(measures.marginals(rank_one), 0.1))
    planted = np.full((6, 6), 0.01)
    planted[1, 2] = planted[3, 4] = 10.0  # two pairs, on different tokens: row and column weights cannot place them
    assert measures.top_share(planted, 0.05) > 0.9
    assert measures.top_share(measures.marginals(planted), 0.05) == pytest.approx(0.5, abs=0.02)
    conc = measures.concentration_table({"m": [planted] * 4}, 0.05)
    neg = pd.DataFrame({"cos_negated": [0.9, 0.95], "cos_control": [0.97, 0.99]})
    claims = measures.claims_table(neg, 3, np.array([0.8, 0.85]), conc, "m", 0.05, n_boot=50, seed=0)
    negation, dominate = claims.iloc[0], claims.iloc[1]
    assert negation.holds and negation.n == 2 and negation.n_skipped == 3
    assert negation.difference == pytest.approx(-0.055)
    assert dominate.holds and dominate.value > 0.9 and dominate.reference_value == pytest.approx(2 / 36)


def test_experiment_settings_refuse_bad_values() -> None:
    from bertscope.experiments.similarity import Settings

    for bad in ({"methods": ("nope",)}, {"ks": (0,)}, {"poolings": ("median",)}, {"attributed": 1},
                {"select_fraction": 1.0}, {"removals": ("erase",)}, {"sides": ("three",)}, {"sides": ()}):
        with pytest.raises(ValueError):
            Settings(**bad)


def test_matrices_round_trip(tiny) -> None:
    results = similarity.attribute(tiny, ["the cat sat"], ["a cat"], method="occlusion")
    table = measures.matrices_table({"occlusion": results}, [7])
    (m,) = measures.matrices_by_method(table, [7])["occlusion"]
    assert torch.allclose(torch.tensor(m), results[0].matrix)


def test_findings_state_the_rollout_ratio_only_where_rollout_is_clearly_positive() -> None:
    from bertscope.experiments.similarity.findings import _faithfulness

    def table(rollout_low: float) -> pd.DataFrame:
        rows = [("integrated-jacobians", 0.4, 0.3, 0.5, 2.0, 1.5, 2.5, "above"),
                (measures.ROLLOUT, 0.2, rollout_low, 0.3, 1.0, 1.0, 1.0, "below"),
                ("random", 0.25, 0.2, 0.3, 1.25, 1.0, 1.5, "baseline")]
        df = pd.DataFrame(rows, columns=["method", "aopc", "aopc_low", "aopc_high", "ratio_to_rollout",
                                         "ratio_to_rollout_low", "ratio_to_rollout_high", "vs_random"])
        return df.assign(removal="delete", sides="one", random_aopc=0.25, ks="1,2", n_pairs=10)

    (clear,) = _faithfulness(table(0.1), None)
    assert "AOPC is 2.0 [1.5, 2.5]" in clear.text and clear.numbers["ij_over_rollout"] == pytest.approx(2.0)
    assert "from one text at a time" in clear.text and "Not above random: mixing:rollout:attention" in clear.text
    (unclear,) = _faithfulness(table(-0.1), None)
    assert "no ratio to it is stated" in unclear.text and "ij_over_rollout" not in unclear.numbers
