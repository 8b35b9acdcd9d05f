"""Known-answer tests for the head-specialisation measures on planted attention patterns (no model)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from bertscope.experiments.heads import experiment as heads
from bertscope.experiments.heads import similarity as sim
from bertscope.experiments.heads import statistics as hs
from bertscope.experiments.heads import syntax as syn
from bertscope.experiments.heads.roles import assign_roles, role_summary
from bertscope.probes.bootstrap import mean_of_groups, ratio_of_sums

CLS, SEP, PAD, DOT, COMMA = 101, 102, 0, 1012, 1010
HEADS = ("identity", "previous", "uniform", "to_sep", "next")


def planted_batch(lengths: tuple[int, ...] = (7, 5), pos: int = 8) -> dict[str, torch.Tensor]:
    """Two sentences ``[CLS] w ... w [SEP]`` (right-padded) with five planted heads.

    Head 0 identity, 1 previous token (query 0 attends itself), 2 uniform over real keys, 3 every query to
    [SEP], 4 next token (the last real query attends itself). Padded query rows hold garbage.
    """
    batch = len(lengths)
    ids = torch.full((batch, pos), PAD)
    mask = torch.zeros(batch, pos, dtype=torch.long)
    pattern = torch.rand(batch, len(HEADS), pos, pos, generator=torch.Generator().manual_seed(0))
    for b, n in enumerate(lengths):
        ids[b, :n] = torch.arange(2000, 2000 + n)
        ids[b, 0], ids[b, n - 1], ids[b, n - 2] = CLS, SEP, DOT
        ids[b, 2] = COMMA
        mask[b, :n] = 1
        real = torch.zeros(len(HEADS), n, pos)
        real[0, :, :n] = torch.eye(n, pos)[:, :n]
        real[1, 0, 0] = 1.0
        real[1, torch.arange(1, n), torch.arange(0, n - 1)] = 1.0
        real[2, :, :n] = 1.0 / n
        real[3, :, n - 1] = 1.0
        real[4, torch.arange(0, n - 1), torch.arange(1, n)] = 1.0
        real[4, n - 1, n - 1] = 1.0
        pattern[b, :, :n] = real
    return {"pattern": pattern, "ids": ids, "mask": mask}


def stats_of(
    batch: dict[str, torch.Tensor], value_norms: torch.Tensor | None = None, max_offset: int = 10
) -> hs.SentenceStats:
    ids = batch["ids"]
    return hs.attention_statistics(
        batch["pattern"],
        batch["mask"],
        cls_mask=ids == CLS,
        sep_mask=ids == SEP,
        punct_mask=(ids == DOT) | (ids == COMMA),
        value_norms=value_norms,
        max_offset=max_offset,
    )


# ------------------------------------------------------------------------------------- attention statistics


def test_planted_heads_get_their_exact_statistics():
    lengths = (7, 5)
    stats = stats_of(planted_batch(lengths))
    s = {k: v.numpy() for k, v in stats.scalars.items()}  # [sentence, head]
    for b, n in enumerate(lengths):
        identity, previous, uniform, to_sep, nxt = range(5)
        # identity: everything on the diagonal
        assert s["mass_self"][b, identity] == pytest.approx(1.0)
        assert s["mass_prev"][b, identity] == 0.0 and s["mass_next"][b, identity] == 0.0
        assert s["mass_cls"][b, identity] == pytest.approx(1 / n)  # only the [CLS] query attends to [CLS]
        assert s["mass_punct"][b, identity] == pytest.approx(2 / n)
        assert s["confidence"][b, identity] == pytest.approx(1.0)
        assert s["mean_distance"][b, identity] == 0.0
        assert s["entropy"][b, identity] < 1e-4
        # previous token: A[i, i-1] = 1 for every query with a previous token
        assert s["mass_prev"][b, previous] == pytest.approx(1.0)
        assert s["mass_self"][b, previous] == pytest.approx(1 / n)
        assert s["mean_distance"][b, previous] == pytest.approx((n - 1) / n)
        # next token
        assert s["mass_next"][b, nxt] == pytest.approx(1.0)
        # uniform: entropy ln n, confidence 1/n, every mass proportional to the number of keys
        assert s["entropy"][b, uniform] == pytest.approx(math.log(n), abs=1e-6)  # float32 input
        assert s["entropy_max"][b, uniform] == pytest.approx(math.log(n))
        assert s["entropy_ratio"][b, uniform] == pytest.approx(1.0, abs=1e-6)
        assert s["confidence"][b, uniform] == pytest.approx(1 / n)
        assert s["mass_cls"][b, uniform] == pytest.approx(1 / n)
        assert s["mass_punct"][b, uniform] == pytest.approx(2 / n)
        assert s["mass_prev"][b, uniform] == pytest.approx(1 / n)
        assert s["mean_distance"][b, uniform] == pytest.approx((n * n - 1) / (3 * n))
        # all to [SEP]
        assert s["mass_sep"][b, to_sep] == pytest.approx(1.0)
        assert s["sep_to_sep"][b, to_sep] == pytest.approx(1.0)
        assert s["mean_distance"][b, to_sep] == pytest.approx((n - 1) / 2)
        assert s["sep_to_sep"][b, uniform] == pytest.approx(1 / n)


def test_argmax_offset_histogram_of_planted_heads():
    lengths = (7, 5)
    stats = stats_of(planted_batch(lengths))
    frac, offsets = stats.offset_fraction.numpy(), stats.offsets
    np.testing.assert_allclose(frac.sum(-1), 1.0)
    for b, n in enumerate(lengths):
        assert frac[b, 0, offsets == 0] == pytest.approx(1.0)  # identity
        assert frac[b, 1, offsets == -1] == pytest.approx((n - 1) / n)  # previous; [CLS] attends itself
        assert frac[b, 1, offsets == 0] == pytest.approx(1 / n)
        assert frac[b, 4, offsets == 1] == pytest.approx((n - 1) / n)
        np.testing.assert_allclose(frac[b, 3, np.isin(offsets, np.arange(0, n))], 1 / n)  # to [SEP]: n-1-i


def test_norm_weighted_masses_follow_kobayashi():
    batch = planted_batch((7, 5))
    norms = torch.rand(2, len(HEADS), 8, generator=torch.Generator().manual_seed(1)) + 0.1
    s = stats_of(batch, norms).scalars
    for b, n in enumerate((7, 5)):
        w = norms[b, 2, :n].double()
        # uniform head: the share of [CLS] is its norm over the total norm
        assert s["norm_cls"][b, 2].item() == pytest.approx((w[0] / w.sum()).item())
        assert s["norm_sep"][b, 2].item() == pytest.approx((w[n - 1] / w.sum()).item())
        # one-hot heads do not depend on the norms
        assert s["norm_self"][b, 0].item() == pytest.approx(1.0)
        assert s["norm_prev"][b, 1].item() == pytest.approx(1.0)
        assert s["norm_sep"][b, 3].item() == pytest.approx(1.0)
    # equal norms reproduce the plain masses
    same = stats_of(batch, torch.ones(2, len(HEADS), 8)).scalars
    for name in ("cls", "sep", "punct", "self", "prev", "next"):
        torch.testing.assert_close(same[f"norm_{name}"], same[f"mass_{name}"])


def test_statistics_reject_bad_shapes():
    batch = planted_batch()
    with pytest.raises(ValueError, match="cls_mask"):
        hs.attention_statistics(
            batch["pattern"], batch["mask"], cls_mask=batch["ids"][:, :3] == CLS,
            sep_mask=batch["ids"] == SEP, punct_mask=batch["ids"] == DOT,
        )  # fmt: skip
    with pytest.raises(ValueError, match="query == key"):
        hs.attention_statistics(
            batch["pattern"][..., :3], batch["mask"], cls_mask=batch["ids"] == CLS,
            sep_mask=batch["ids"] == SEP, punct_mask=batch["ids"] == DOT,
        )  # fmt: skip


# ------------------------------------------------------------------------------------------ tables and roles


def planted_head_stats(lengths: tuple[int, ...] = (7, 5, 6)) -> pd.DataFrame:
    """Aggregate planted statistics through the experiment's own table builders (one layer, five heads)."""
    batch = planted_batch(lengths, pos=8)
    stats = stats_of(batch, torch.ones(len(lengths), len(HEADS), 8))
    scalars = np.stack([stats.scalars[m].numpy() for m in heads.SCALARS], axis=-1)[:, None]
    offsets = stats.offset_fraction.numpy()[:, None]
    table = heads.attention_table(scalars, offsets, heads.Settings(n_boot=50), seed=0)
    return heads.head_stats_wide(table)


def test_planted_heads_get_their_roles():
    roles = assign_roles(planted_head_stats())
    summary = role_summary(roles).set_index("head")
    assert set(roles.columns) >= {"layer", "head", "role", "statistic", "value", "threshold", "assigned"}
    assigned = {h: set(roles[(roles["head"] == h) & roles["assigned"]]["role"]) for h in range(5)}
    assert assigned[0] == {"self", "positional"}
    assert assigned[1] == {"previous-token"}  # (n-1)/n of argmaxes at -1 is below 90% for n <= 7
    assert assigned[2] == {"broad"}
    assert assigned[3] == {"[SEP]"}
    assert assigned[4] == {"next-token"}
    assert summary.loc[0, "roles"] == "self; positional (offset +0)"
    assert summary.loc[2, "primary_role"] == "broad"
    # thresholds are in the table, one per rule
    assert roles.groupby("role")["threshold"].nunique().eq(1).all()


def test_positional_role_needs_ninety_percent_at_one_offset():
    stats = planted_head_stats(lengths=(8, 8, 8))  # (n-1)/n = 7/8 < 0.9
    assert "positional" not in set(assign_roles(stats).query("head == 1 and assigned")["role"])
    stats.loc[stats["head"] == 1, "top_offset_fraction"] = 0.95
    got = assign_roles(stats).query("head == 1 and assigned")
    assert got.set_index("role").loc["positional", "detail"] == "offset -1"


def test_attention_table_has_offsets_tails_and_top_offset():
    stats = planted_head_stats()
    assert list(stats.loc[stats["head"] == 0, "top_offset"]) == [0]
    assert list(stats.loc[stats["head"] == 1, "top_offset"]) == [-1]
    assert list(stats.loc[stats["head"] == 4, "top_offset"]) == [1]


# ------------------------------------------------------------------------------------------------- syntax

# "The cat sat on the mat ." / a chain / "Dogs bark loudly ." with gold trees (1-based heads, 0 = root).
SENTENCES = [
    ((2, 3, 0, 6, 6, 3, 3), ("det", "nsubj", "root", "case", "det", "obl", "punct")),
    ((2, 3, 4, 0), ("amod", "nsubj", "aux", "root")),
    ((2, 0, 2, 2), ("nsubj", "root", "advmod", "punct")),
    ((3, 3, 0, 3), ("det", "nsubj:pass", "root", "punct")),
]


def planted_word_maps(gold: tuple[int, ...], transpose: bool = False) -> torch.Tensor:
    """``[layer=1, head=3, n, n]``: head 0 points each dependent to its gold head (head 1: the transpose, for
    a sentence where each head word has one dependent), head 2 attends to the previous word (its first
    word to the last one: a row with no weight off the diagonal would leave the argmax to a tie)."""
    n = len(gold)
    maps = torch.zeros(1, 3, n, n)
    for d, g in enumerate(gold):
        if g > 0:
            maps[0, 0, d, g - 1] = 1.0
            maps[0, 1, g - 1, d] = 1.0
    maps[0, 2, torch.arange(1, n), torch.arange(0, n - 1)] = 1.0
    maps[0, 2, 0, n - 1] = 1.0
    maps[0, 0, torch.arange(n), torch.arange(n)] = 5.0  # self is excluded before the argmax
    return maps


def all_hits() -> syn.ArcHits:
    return syn.ArcHits.concat(
        [syn.sentence_arc_hits(planted_word_maps(h), h, r, i, collapse_subtypes=True)
         for i, (h, r) in enumerate(SENTENCES)]  # fmt: skip
    )


def test_gold_head_pointer_is_perfect_and_beats_the_offset_baseline():
    hits = all_hits()
    acc = syn.head_relation_accuracy(hits)
    pointer = acc[(acc["head"] == 0) & (acc["direction"] == "dep->head")]
    assert (pointer["accuracy"] == 1.0).all()
    table = syn.syntax_table(hits, seed=0).set_index("relation")
    # every relation: best candidate is the pointer head, reading dependent -> head, with accuracy 1
    per_relation = table.drop(index=[syn.ALL_RELATIONS, syn.PER_RELATION])
    assert (per_relation["accuracy"] == 1.0).all()
    assert set(per_relation["direction"]) == {"dep->head"}
    # head offsets by hand: det +1, +1, +2; nsubj +1 (x4); punct -4, -2, -1
    assert table.loc["det", "baseline_offset"] == 1
    assert table.loc["det", "baseline_accuracy"] == pytest.approx(2 / 3)
    assert table.loc["nsubj", "n"] == 4  # nsubj:pass counts as nsubj
    assert table.loc["nsubj", "baseline_accuracy"] == 1.0
    assert table.loc["nsubj", "gain"] == 0.0
    assert "punct" not in table.index  # out of the headline table (Clark et al.'s Table 1), still in `acc`
    assert acc.query("relation == 'punct' and head == 0 and direction == 'dep->head'")["accuracy"].item() == 1.0
    assert table.loc[syn.ALL_RELATIONS, "accuracy"] == 1.0
    assert table.loc[syn.PER_RELATION, "heldout_accuracy"] == 1.0


def test_transposed_pointer_scores_head_to_dependent():
    gold, rels = SENTENCES[1]  # a chain: every head word has exactly one dependent
    hits = syn.sentence_arc_hits(planted_word_maps(gold), gold, rels)
    acc = syn.head_relation_accuracy(hits).set_index(["relation", "head", "direction"])["accuracy"]
    for rel in ("amod", "nsubj", "aux"):
        assert acc[(rel, 1, "head->dep")] == 1.0
        assert acc[(rel, 0, "dep->head")] == 1.0
        assert acc[(rel, 2, "dep->head")] == 0.0  # previous word is never the head in this right-headed chain


def test_syntactic_role_only_for_the_pointer_heads():
    hits = syn.ArcHits.concat(
        [syn.sentence_arc_hits(planted_word_maps(h), h, r, 10 * k + i) for k in range(40)
         for i, (h, r) in enumerate(SENTENCES)]  # fmt: skip
    )
    gains = syn.heldout_head_gains(hits, threshold=0.1, n_boot=200)
    stats = pd.DataFrame({
        "layer": 0, "head": [0, 1, 2], "mass_cls": 0.0, "mass_sep": 0.0, "mass_punct": 0.0, "mass_self": 0.0,
        "mass_prev": 0.0, "mass_next": 0.0, "entropy_ratio": 0.0, "top_offset": 0, "top_offset_fraction": 0.0,
    })  # fmt: skip
    roles = assign_roles(stats, gains, min_arcs=3)
    syntactic = roles[(roles["role"] == "syntactic") & roles["assigned"]]
    # head 0 points dependents to heads, head 1 is its transpose (Clark's head->dep reading finds it); head 2 is
    # the previous word, which no fixed offset beats
    assert list(syntactic["head"]) == [0, 1]
    assert (syntactic["detail"] == "det").all()  # the only relation where offsets fail; punct never counts
    # relations under min_arcs do not count: with min_arcs above every relation's count, nobody is syntactic
    assert not assign_roles(stats, gains, min_arcs=1000).query("role == 'syntactic'")["assigned"].any()


def test_arc_hits_reject_mismatched_words():
    with pytest.raises(ValueError, match="word segmentation"):
        syn.sentence_arc_hits(torch.zeros(1, 1, 3, 3), (2, 0), ("nsubj", "root"))


# ----------------------------------------------------------------------------------------------- distances


def random_rows(n: int, k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, k, generator=g) ** 4  # peaked rows, some near zero
    x[:, 0] *= torch.rand(n, generator=g) < 0.5  # exact zeros too
    x[:, 1] += 1e-3
    return x / x.sum(-1, keepdim=True)


def test_sqrt_jsd_is_a_metric_on_rows():
    p = random_rows(300, 6, 0)
    a, b, c = p[:100], p[100:200], p[200:]
    d_ab, d_bc, d_ac = sim.sqrt_jsd(a, b), sim.sqrt_jsd(b, c), sim.sqrt_jsd(a, c)
    assert (d_ac <= d_ab + d_bc + 1e-12).all()
    assert torch.equal(sim.sqrt_jsd(a, a), torch.zeros(100, dtype=torch.float64))
    torch.testing.assert_close(d_ab, sim.sqrt_jsd(b, a))
    assert (d_ab >= 0).all() and (d_ab <= 1).all()
    disjoint = sim.sqrt_jsd(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]))
    assert disjoint.item() == pytest.approx(1.0)  # 1 bit


def test_head_distances_matrix_is_a_metric_with_zero_between_identical_heads():
    g = torch.Generator().manual_seed(0)
    pattern = torch.rand(7, 5, 5, generator=g).softmax(-1)
    pattern[3] = pattern[1]  # two identical heads
    d = sim.head_distances(pattern, chunk=3).numpy()
    assert d[1, 3] == 0.0 and d[3, 1] == 0.0
    np.testing.assert_array_equal(np.diag(d), 0.0)
    np.testing.assert_array_equal(d, d.T)
    triangle = d[:, None, :] <= d[:, :, None] + d[None, :, :] + 1e-12  # d[i,k] <= d[i,j] + d[j,k]
    assert triangle.all()
    # matches the per-row definition averaged over queries
    expected = sim.sqrt_jsd(pattern[0], pattern[5]).mean().item()
    assert d[0, 5] == pytest.approx(expected, abs=1e-5)  # float32 entropies by default
    d64 = sim.head_distances(pattern, chunk=3, dtype=torch.float64).numpy()
    assert d64[0, 5] == pytest.approx(expected, rel=1e-12)
    np.testing.assert_allclose(d, d64, atol=1e-5)


def test_within_between_ratio_on_planted_distances():
    layer_of = np.repeat([0, 1, 2], 4)
    d = np.where(layer_of[:, None] == layer_of[None, :], 0.2, 0.8)
    np.fill_diagonal(d, 0.0)
    ratios = sim.within_between_ratio(d, layer_of)
    assert ratios[None] == pytest.approx(0.25)
    assert ratios[1] == pytest.approx(0.25)


def test_mds_is_seeded_and_keeps_planted_geometry():
    points = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0], [3.0, 1.0], [1.0, 1.0]])
    d = np.linalg.norm(points[:, None] - points[None], axis=-1)
    a = sim.mds_embedding(d, seed=0)
    np.testing.assert_array_equal(a, sim.mds_embedding(d, seed=0))
    recovered = np.linalg.norm(a[:, None] - a[None], axis=-1)
    np.testing.assert_allclose(recovered, d, atol=0.05)


def test_offset_histogram_of_short_sentences_keeps_every_bin():
    stats = stats_of(planted_batch((4, 3), pos=4), torch.ones(2, len(HEADS), 4), max_offset=3)  # offsets <= 3
    scalars = np.stack([stats.scalars[m].numpy() for m in heads.SCALARS], axis=-1)[:, None]
    offsets = stats.offset_fraction.numpy()[:, None]
    table = heads.attention_table(scalars, offsets, heads.Settings(n_boot=20, offset_bins=8))
    hist = table[table["metric"].str.startswith("argmax_offset")]
    assert hist["metric"].nunique() == 2 * 8 + 3
    np.testing.assert_allclose(hist.groupby("head")["value"].sum(), 1.0)
    top = table[table["metric"] == "top_offset"].set_index("head")["value"]
    assert top[0] == 0 and top[1] == -1


# --------------------------------------------------------------------------------- selection-aware statistics


def test_crossed_bootstrap_covers_order_variance():
    rng = np.random.default_rng(0)
    sentences = rng.normal(size=(30, 1, 1))  # sentence effects
    orders = np.linspace(-1, 1, 20)[None, :, None] * 5  # orders differ far more than sentences
    values = sentences + orders
    mean, low, high = hs.crossed_bootstrap_mean(values, n_boot=400, seed=0)
    assert mean.shape == (1,) and mean[0] == pytest.approx(values.mean())
    sentence_only, _ = mean_of_groups(values.mean(1), n_boot=400, seed=0)
    assert (high - low)[0] > 3 * (sentence_only.high - sentence_only.low)[0]  # order variance is in the interval


def test_heldout_top_reads_the_choice_of_the_other_half():
    # unit 0 is large on fold-0 sentences only, unit 1 on fold-1 only, unit 2 moderately everywhere
    fold = np.array([0, 1] * 10)
    values = np.zeros((20, 3))
    values[fold == 0, 0] = 10.0
    values[fold == 1, 1] = 10.0
    values[:, 2] = 1.0
    (top,) = hs.heldout_top(values, fold, 1, n_boot=50)
    assert (top["chosen_on_0"], top["chosen_on_1"]) == (0, 1)
    assert top["heldout_value"] == 0.0  # each half's winner is worthless on the other half
    assert top["value"] == 5.0  # the in-sample winner looks good
    ratio, low, high, se = hs.ratio_with_se(np.array([[1.0], [3.0]]), np.array([2.0, 2.0]), n_boot=200)
    assert ratio[0] == 1.0 and low[0] < 1.0 < high[0] and se[0] > 0
    reference = ratio_of_sums(np.array([[1.0], [3.0]]), np.array([[2.0], [2.0]]), n_boot=200)
    np.testing.assert_allclose([low[0], high[0]], [reference.low[0], reference.high[0]])  # the shared replicates
