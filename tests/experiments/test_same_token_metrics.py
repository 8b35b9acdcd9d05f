"""Known-answer tests for the same-token metrics on planted patterns (no model)."""

from __future__ import annotations

import math

import pytest
import torch
from bertscope.experiments.same_token.balance import QueryRows, type_balanced_draws
from bertscope.experiments.same_token.held_out import held_out_top
from bertscope.experiments.same_token.measures import (
    Positions,
    Tallies,
    attention_masses,
    boot_weights,
    logit_metrics,
    norm_weighted,
    raw_attention,
    summarize,
    tally,
)
from bertscope.probes.bootstrap import resample_counts

CLS, SEP, PAD = 101, 102, 0
SPECIAL = {"cls": CLS, "sep": SEP}


def make_batch(sentences: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Wrap token lists in [CLS] ... [SEP] and pad -> input_ids, attention_mask, special_mask [batch, pos]."""
    n = max(len(s) for s in sentences) + 2
    ids = torch.full((len(sentences), n), PAD)
    mask = torch.zeros(len(sentences), n, dtype=torch.long)
    for b, s in enumerate(sentences):
        row = [CLS, *s, SEP]
        ids[b, : len(row)] = torch.tensor(row)
        mask[b, : len(row)] = 1
    special = (ids == CLS) | (ids == SEP) | (mask == 0)
    return ids, mask, special


def positions(sentences: list[list[int]]) -> Positions:
    return Positions.from_batch(*make_batch(sentences), special_ids=SPECIAL)


def uniform_pattern(pos: Positions, heads: int = 1) -> torch.Tensor:
    keep = pos.valid[:, None, None, :].expand(-1, heads, pos.valid.shape[1], -1).double()
    return keep / keep.sum(-1, keepdim=True)


def test_identity_pattern_gives_self_one_and_nothing_elsewhere() -> None:
    pos = positions([[5, 6, 5, 7], [8, 8]])
    n = pos.valid.shape[1]
    pattern = torch.eye(n).expand(2, 3, n, n)
    masses = attention_masses(pattern, pos)
    t = summarize(tally(masses, pattern, pos, max_length=16), n_boot=20)
    by = t.set_index(["metric", "head"])["value"]
    for h in range(3):
        assert by["self", h] == 1.0
        assert by["duplicate", h] == 0.0
        assert by["previous", h] == 0.0 and by["next", h] == 0.0
        assert by["self_cls", h] == 1.0 and by["self_sep", h] == 1.0
        assert by["to_pad", h] == 0.0
    # self counts content queries only: 4 + 2
    assert t.loc[t.metric == "self", "n_queries"].iloc[0] == 6
    # queries with a copy: the two 5s and the two 8s
    assert t.loc[t.metric == "duplicate", "n_queries"].iloc[0] == 4
    assert t.loc[t.metric == "duplicate_earlier", "n_queries"].iloc[0] == 2


def test_same_token_pattern_gives_k_over_k_plus_one() -> None:
    # token 5 appears 3 times (k = 2 copies), 6 twice (k = 1), 7 once (k = 0)
    tokens = [5, 6, 5, 7, 6, 5]
    pos = positions([tokens])
    same = (pos.input_ids[:, :, None] == pos.input_ids[:, None, :]) & pos.valid[:, None, :]
    pattern = (same.double() / same.sum(-1, keepdim=True))[:, None]  # A ∝ 1[t_i = t_j]
    masses = attention_masses(pattern, pos)
    dup, counted = masses["duplicate"].values[0, 0], masses["duplicate"].counted[0]
    for i, t in enumerate(tokens, start=1):
        k = tokens.count(t) - 1
        assert masses["self"].values[0, 0, i] == pytest.approx(1 / (k + 1))
        assert bool(counted[i]) == (k > 0)
        assert dup[i] == pytest.approx(k / (k + 1))
    # earlier-only: the 3rd 5 (position 6) has two earlier copies out of its three equal keys
    assert masses["duplicate_earlier"].values[0, 0, 6] == pytest.approx(2 / 3)
    assert not masses["duplicate_earlier"].counted[0, 1]  # first occurrence has no earlier copy
    # the aggregate is the mean over queries that have a copy: (2/3 * 3 + 1/2 * 2) / 5
    t = summarize(tally(masses, pattern, pos, max_length=16), n_boot=10)
    value = t.set_index("metric").loc["duplicate", "value"]
    assert value == pytest.approx((2 / 3 * 3 + 1 / 2 * 2) / 5)


def test_uniform_pattern_matches_both_nulls() -> None:
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(4, 12, (30,), generator=gen)
    sentences = [torch.randint(5, 9, (int(n),), generator=gen).tolist() for n in lengths]
    pos = positions(sentences)
    pattern = uniform_pattern(pos, heads=2)
    t = summarize(tally(attention_masses(pattern, pos), pattern, pos, max_length=16), n_boot=50)
    by = t.set_index(["metric", "head"])
    for metric in ("self", "duplicate", "duplicate_earlier", "previous", "next", "to_cls", "to_sep"):
        row = by.loc[(metric, 1)]
        assert row.value == pytest.approx(row.null_uniform), metric
        assert row.ratio_uniform == pytest.approx(1.0), metric
    # in sentences of one length n a uniform head puts 1/n on every non-copy offset too, so the
    # offset-matched null equals the value
    pos = positions([torch.randint(5, 9, (8,), generator=gen).tolist() for _ in range(30)])
    pattern = uniform_pattern(pos)
    by = summarize(tally(attention_masses(pattern, pos), pattern, pos, max_length=16), n_boot=50).set_index(
        ["metric", "head"]
    )
    for metric in ("duplicate", "duplicate_earlier"):
        row = by.loc[(metric, 0)]
        assert row.null_kind == "offset" and row.null == row.null_offset
        assert row.ratio == pytest.approx(1.0)
        assert row.ci_low <= row.value <= row.ci_high


def test_offset_null_is_mass_at_copy_offsets_on_non_copies() -> None:
    # A head that attends only to the token two to the left. Copies sit at offset -2 in the first
    # sentence; the second sentence has offset -2 pairs that are not copies (null support).
    pos = positions([[5, 6, 5, 7], [8, 9, 10, 11]])
    n = pos.valid.shape[1]
    pattern = torch.zeros(2, 1, n, n)
    for i in range(n):
        pattern[:, 0, i, max(i - 2, 0)] = 1.0
    t = summarize(tally(attention_masses(pattern, pos), pattern, pos, max_length=16), n_boot=10)
    row = t.set_index("metric").loc["duplicate_earlier"]
    assert row.value == 1.0  # the second 5 puts all of its mass on its copy
    # non-copy content pairs at offset -2: (7 -> 6) in sentence 1, (10 -> 8), (11 -> 9) in sentence 2,
    # all with mass 1 -> M(-2) = 1, so the offset-matched null is 1 and the ratio 1, whereas uniform says 1/6.
    assert row.null == pytest.approx(1.0) and row.ratio == pytest.approx(1.0)
    assert row.null_uniform == pytest.approx(1 / 6)


def test_offset_null_undefined_without_support_falls_back_visibly() -> None:
    pos = positions([[5, 5]])  # the only offset-1 content pair is a copy
    pattern = uniform_pattern(pos)
    row = summarize(tally(attention_masses(pattern, pos), pattern, pos, max_length=8), n_boot=5).set_index(
        "metric"
    ).loc["duplicate"]
    assert math.isnan(row.null_offset) and math.isnan(row.ratio_offset)
    assert row.null_kind == "uniform"
    assert row.null == row.null_uniform == pytest.approx(1 / 4) and row.ratio == pytest.approx(1.0)


def test_raw_attention_matches_closed_form_with_exact_ties() -> None:
    # orthogonal embeddings of norm c: logits are c^2/sqrt(d) on self and copies, 0 elsewhere
    d, c = 16, 3.0
    table = torch.eye(d, dtype=torch.float64) * c
    tokens = [CLS, 5, 6, 5, 7, 5, SEP]  # 5 has k = 2 copies
    ids = torch.tensor([tokens + [PAD]])
    mask = torch.tensor([[1] * len(tokens) + [0]])
    x = table[torch.tensor([[0, 5, 6, 5, 7, 5, 1, 2]])]  # [CLS], [SEP], [PAD] on rows 0, 1, 2
    logits, pattern = raw_attention(x, mask)
    a = c * c / math.sqrt(d)
    n = len(tokens)
    expected_self = math.exp(a) / (3 * math.exp(a) + (n - 3))
    assert pattern[0, 1, 1].item() == pytest.approx(expected_self, rel=1e-12)
    assert pattern[0, 1, 3].item() == pattern[0, 1, 1].item() == pattern[0, 1, 5].item()  # exact ties
    assert pattern[0, 1, 7].item() == 0.0  # padding key
    pos = Positions.from_batch(ids, mask, (ids == CLS) | (ids == SEP) | (mask == 0), SPECIAL)
    masses = attention_masses(pattern[:, None], pos)
    assert masses["duplicate"].values[0, 0, 1].item() == pytest.approx(2 * expected_self, rel=1e-12)
    raw = logit_metrics(logits, pos)
    assert raw["argmax_self_or_copy"].values[0, 0, 1].item() == 1.0
    assert raw["logit_gap"].values[0, 0, 1].item() == pytest.approx(a)
    assert raw["argmax_self_or_copy"].uniform[0, 1].item() == pytest.approx(3 / n)


def test_raw_attention_ties_are_exact_for_random_float32_rows() -> None:
    gen = torch.Generator().manual_seed(1)
    table = torch.randn(50, 384, generator=gen)
    ids = torch.randint(0, 50, (8, 40), generator=gen)
    _, pattern = raw_attention(table[ids], torch.ones_like(ids))
    same = ids[:, :, None] == ids[:, None, :]
    # within a row, every key holding the query's own token gets exactly the self weight
    diag = pattern.diagonal(dim1=-2, dim2=-1)[:, :, None].expand_as(pattern)
    assert torch.equal(pattern[same], diag[same])


def test_norm_weighting_scales_by_value_norms() -> None:
    pattern = torch.tensor([[[[0.5, 0.5, 0.0], [0.25, 0.25, 0.5], [1.0, 0.0, 0.0]]]])
    norms = torch.tensor([[[3.0, 1.0, 2.0]]])
    out = norm_weighted(pattern, norms)
    assert torch.allclose(out[0, 0, 0], torch.tensor([0.75, 0.25, 0.0]))
    assert torch.allclose(out[0, 0, 1], torch.tensor([0.75, 0.25, 1.0]) / 2.0)
    assert torch.equal(out[0, 0, 2], torch.tensor([1.0, 0.0, 0.0]))
    assert torch.equal(norm_weighted(pattern, torch.zeros_like(norms)), torch.zeros_like(pattern))


def test_bootstrap_is_seeded_and_concat_pools_sentences() -> None:
    gen = torch.Generator().manual_seed(2)
    parts, patterns = [], []
    for _ in range(3):
        sents = [torch.randint(5, 8, (6,), generator=gen).tolist() for _ in range(4)]
        pos = positions(sents)
        pattern = torch.rand(4, 2, 8, 8, generator=gen) * pos.valid[:, None, None, :]
        pattern = pattern / pattern.sum(-1, keepdim=True)
        parts.append(tally(attention_masses(pattern, pos), pattern, pos, max_length=8))
        patterns.append((pattern, pos))
    pooled = Tallies.concat(parts)
    assert pooled.n_sentences == 12
    a, b = summarize(pooled, n_boot=30, seed=7), summarize(pooled, n_boot=30, seed=7)
    assert a.equals(b)
    assert not a.ci_low.equals(summarize(pooled, n_boot=30, seed=8).ci_low)
    # pooled self = mean over every content query of every batch
    selfs = torch.cat([p.diagonal(dim1=-2, dim2=-1)[:, 0][pos.content] for p, pos in patterns])
    assert a.set_index(["metric", "head"]).loc[("self", 0), "value"] == pytest.approx(selfs.double().mean().item())


def test_bad_shapes_are_named() -> None:
    pos = positions([[5, 6]])
    with pytest.raises(ValueError, match=r"pattern must be \[batch, head, query, key\]"):
        attention_masses(torch.ones(1, 4, 4), pos)
    with pytest.raises(ValueError, match="max_length"):
        tally(attention_masses(uniform_pattern(pos), pos), uniform_pattern(pos), pos, max_length=2)
    with pytest.raises(ValueError, match="value_norms"):
        norm_weighted(torch.ones(1, 2, 3, 3), torch.ones(1, 3, 3))


def test_type_balanced_counts_each_type_once() -> None:
    # token 7 ("the") occurs 4 times with duplicate mass 1 at each query; token 9 twice with mass 0.
    # pooled: 4 / 6 = 0.667; type-balanced: (1 + 0) / 2 = 0.5
    rows = QueryRows(
        sentence=torch.tensor([0, 0, 0, 0, 1, 1]),
        token=torch.tensor([7, 7, 7, 7, 9, 9]),
        values=torch.tensor([[1.0], [1.0], [1.0], [1.0], [0.0], [0.0]], dtype=torch.float64),
        uniform=torch.tensor([0.3, 0.3, 0.3, 0.3, 0.1, 0.1], dtype=torch.float64),
    )
    weights = torch.tensor([[1.0, 1.0], [2.0, 0.0], [0.0, 3.0]], dtype=torch.float64)
    value, null = type_balanced_draws(rows, weights)
    assert value[:, 0].tolist() == pytest.approx([0.5, 1.0, 0.0])  # a draw without a type averages the others
    assert null.tolist() == pytest.approx([0.2, 0.3, 0.1])
    assert float(rows.values.mean()) == pytest.approx(4 / 6)


def test_boot_weights_subset_resamples_only_that_half() -> None:
    w = boot_weights(10, n_boot=50, seed=1, subset=torch.tensor([2, 5, 7]))
    assert w[0].tolist() == [0, 0, 1, 0, 0, 1, 0, 1, 0, 0]
    assert (w[:, [0, 1, 3, 4, 6, 8, 9]] == 0).all() and (w.sum(-1) == 3).all()
    assert torch.equal(boot_weights(10, n_boot=50, seed=1)[1:].sum(-1), torch.full((50,), 10.0, dtype=torch.float64))


def test_held_out_top_reads_the_choice_on_the_other_half() -> None:
    # 4 sentences, 3 heads: half 1 = sentences 0, 1 (head 0 scores highest there), half 2 = 2, 3 (head 1 wins).
    per_sentence = torch.tensor([[5.0, 1, 0], [5, 1, 0], [1, 3, 0], [1, 3, 0]], dtype=torch.float64)

    def mean(w: dict[str, torch.Tensor]) -> torch.Tensor:
        return (w["c"] @ per_sentence) / w["c"].sum(-1, keepdim=True)

    halves = tuple({"c": boot_weights(4, n_boot=20, seed=i, subset=torch.tensor(part))}
                   for i, part in enumerate(([0, 1], [2, 3])))
    rows = held_out_top(mean, {"score": mean}, halves, k=2)
    top = rows[0]
    assert top["rank"] == 1 and top["chosen"] == (0, 1)
    # head 0 read on half 2 (1.0) and head 1 read on half 1 (1.0): held-out 1.0, where in-sample would say 4.0
    assert top["value"] == pytest.approx(1.0) and top["ci_low"] == pytest.approx(1.0)
    assert rows[1]["chosen"] == (1, 0) and rows[1]["value"] == pytest.approx(4.0)


def test_boot_weights_are_the_shared_group_bootstrap() -> None:
    """Rows 1.. are probes.bootstrap.resample_counts (one bootstrap in the project), on the subset's columns."""
    assert torch.equal(boot_weights(9, n_boot=40, seed=3)[1:], torch.from_numpy(resample_counts(9, 40, 3)))
    subset = torch.tensor([1, 4, 8])
    w = boot_weights(9, n_boot=40, seed=3, subset=subset)
    assert torch.equal(w[1:, subset], torch.from_numpy(resample_counts(3, 40, 3)))


def test_held_out_top_removes_the_winners_curse() -> None:
    """50 heads with the same true mean 0.5 and sentence noise: the in-sample top head looks inflated, the
    held-out one reads ~0.5, and its interval (heads re-chosen per draw) covers 0.5."""
    gen = torch.Generator().manual_seed(0)
    per_sentence = 0.5 + torch.randn(200, 50, generator=gen, dtype=torch.float64)

    def mean(w: dict[str, torch.Tensor]) -> torch.Tensor:
        return (w["c"] @ per_sentence) / w["c"].sum(-1, keepdim=True)

    perm = torch.randperm(200, generator=gen)
    halves = tuple({"c": boot_weights(200, n_boot=300, seed=i, subset=part.sort().values)}
                   for i, part in enumerate((perm[:100], perm[100:])))
    top = held_out_top(mean, {"mean": mean}, halves, k=1)[0]
    in_sample = float(per_sentence.mean(0).max())
    assert in_sample > 0.58  # the winner's curse: over 1 standard error (0.07) above the truth
    assert abs(top["value"] - 0.5) < abs(in_sample - 0.5) / 2
    assert top["ci_low"] < 0.5 < top["ci_high"]
