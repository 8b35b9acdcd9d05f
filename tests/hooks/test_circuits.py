"""Circuits: known-answer tests. A planted two-head circuit is found exactly; on a model that is linear once its
LayerNorms are frozen, edge scores sum to the total effect and equal path patching; patching a node with its own
clean value changes nothing; AtP equals exact patching where the metric is linear in the node; CPR/CMD are MIB's
trapezoids; bad task files fail with the line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from bertscope.hooks import circuits
from bertscope.hooks.circuits import Metric, Task, TaskError
from bertscope.models import Encoder, EncoderConfig

D, H = 16, 2


def _zero_(model: Encoder) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for name, p in model.named_parameters():
            if name.endswith("weight") and ("ln" in name.split(".")[-2]):
                p.fill_(1.0)


def _task(clean: torch.Tensor, corrupted: torch.Tensor, u: torch.Tensor) -> Task:
    """A task over token ids whose metric is ``<mean-pooled hidden, u>`` (linear in the final hidden state)."""
    mask = torch.ones_like(clean)

    def fn(hidden, attn, rows):
        pooled = (hidden * attn[..., None]).sum(1) / attn.sum(1, keepdim=True)
        return pooled @ u.to(hidden.dtype)

    return Task({"input_ids": clean, "attention_mask": mask}, {"input_ids": corrupted, "attention_mask": mask},
                Metric(fn, "dot-u"))


def planted_model() -> tuple[Encoder, Task]:
    """Two layers of two heads, all weights zero except: embeddings live in dims 0-3 (zero-mean patterns, so
    centring leaves them alone); head A = L0H0 copies dims 0-3 to 4-7; head B = L1H1 copies 4-7 to 8-11; the
    metric reads dims 8-11. Queries and keys are zero (uniform attention), MLPs write nothing."""
    torch.manual_seed(0)
    cfg = EncoderConfig(vocab_size=12, d_model=D, n_layers=2, n_heads=H, d_mlp=8, max_positions=16,
                        type_vocab_size=0, hidden_dropout=0.0, attention_dropout=0.0)
    model = Encoder(cfg).eval().double()
    _zero_(model)
    dh = D // H
    with torch.no_grad():
        a, b = torch.randn(12).double(), torch.randn(12).double()
        model.embed.word.weight[:, :4] = torch.stack([a, -a, b, -b], 1)
        for j in range(4):
            model.blocks[0].attn.qkv.weight[2 * D + 0 * dh + j, j] = 1.0  # A's value reads dims 0-3
            model.blocks[0].attn.out.weight[4 + j, 0 * dh + j] = 1.0  # A writes dims 4-7
            model.blocks[1].attn.qkv.weight[2 * D + 1 * dh + j, 4 + j] = 1.0  # B's value reads dims 4-7
            model.blocks[1].attn.out.weight[8 + j, 1 * dh + j] = 1.0  # B writes dims 8-11
    clean = torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10], [2, 4, 6, 8, 10]])
    corrupted = clean.clone()
    corrupted[:, 3] = 11
    u = torch.zeros(D, dtype=torch.float64)
    u[8:12] = torch.tensor([1.0, -1.0, 1.0, -1.0])
    return model, _task(clean, corrupted, u)


def test_planted_two_head_circuit_is_found_exactly():
    model, task = planted_model()
    scores = circuits.edges(model, task, "eap")
    planted = {"input->L0H0", "L0H0->L1H1", "L1H1->output"}
    table = scores.table()
    nonzero = set(table.loc[table.abs_score > 1e-9, "edge"])
    assert nonzero == planted
    circuit = circuits.find_circuit(model, task, scores, method="greedy", threshold=0.01)
    assert set(circuit.edges) == planted
    assert circuit.nodes == ["L0H0", "L1H1"]
    assert circuit.faithfulness == pytest.approx(1.0, abs=1e-9)
    top = circuits.find_circuit(model, task, scores, method="topn", n_edges=3)
    assert set(top.edges) == planted


def linear_model(pre_ln: bool = False) -> Encoder:
    """A random tiny encoder made linear in its input once its LayerNorms are frozen: zero queries and keys
    (uniform attention), MLPs that write nothing."""
    torch.manual_seed(1)
    cfg = EncoderConfig(vocab_size=20, d_model=D, n_layers=3, n_heads=H, d_mlp=8, max_positions=16,
                        type_vocab_size=0, hidden_dropout=0.0, attention_dropout=0.0,
                        norm_placement="pre" if pre_ln else "post")
    model = Encoder(cfg).eval().double()
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight[: 2 * D] = 0.0
            block.attn.qkv.bias[: 2 * D] = 0.0
            block.mlp.fc_out.weight.zero_()
            block.mlp.fc_out.bias.zero_()
            block.attn.out.weight.mul_(20.0)  # heads that matter against the residual
        model.embed.word.weight.mul_(50.0)
    return model


def _linear_task(seed: int = 0) -> Task:
    gen = torch.Generator().manual_seed(seed)
    clean = torch.randint(0, 20, (4, 6), generator=gen)
    corrupted = clean.clone()
    corrupted[:, 2] = (clean[:, 2] + 7) % 20
    u = torch.randn(D, generator=gen, dtype=torch.float64)
    return _task(clean, corrupted, u)


def test_edge_scores_sum_to_the_total_effect_on_a_linear_model():
    model, task = linear_model(), _linear_task()
    scores = circuits.edges(model, task, "eap")
    ev = circuits.Evaluator(model, task)
    g = scores.graph
    total = ev.empty - ev.full  # m(corrupted, frozen) - m(clean)
    assert abs(total) > 1e-3
    into_output = float(scores.scores[:, g.receiver_output].sum())
    assert into_output == pytest.approx(total, rel=1e-9, abs=1e-12)
    # each edge's score is its exact (path-patching) effect, in the frozen model
    names = g.edge_names()
    exact = circuits.path_patch(model, task, names)
    est = scores.table().set_index("edge").loc[names, "score"].to_numpy()
    np.testing.assert_allclose(est, exact["effect"].to_numpy(), rtol=1e-8, atol=1e-12)
    assert np.abs(est).max() > 1e-3


def test_eap_ig_equals_eap_on_a_linear_model():
    model, task = linear_model(), _linear_task(1)
    a, b = circuits.edges(model, task, "eap"), circuits.edges(model, task, "eap-ig", steps=3)
    torch.testing.assert_close(a.scores, b.scores, rtol=1e-9, atol=1e-12)


def test_the_rebuilt_forward_reproduces_clean_and_frozen_corrupted_runs():
    model, task = linear_model(), _linear_task()
    with torch.no_grad():
        for L in range(3):  # make it non-linear again: real queries and keys, a working MLP
            torch.nn.init.normal_(model.blocks[L].attn.qkv.weight, std=0.3)
            torch.nn.init.normal_(model.blocks[L].mlp.fc_out.weight, std=0.3)
    ev = circuits.Evaluator(model, task)
    clean = circuits.metric_values(model, task).mean()
    assert ev.full == pytest.approx(float(clean), rel=1e-10)
    rows = torch.arange(task.n_pairs)
    c = circuits.graph.capture(model, task.batch(rows))
    k = circuits.graph.capture(model, task.batch(rows, "corrupted"), scales=c.scales)
    assert ev.empty == pytest.approx(float(task.metric(k.final, task.mask, rows).mean()), rel=1e-12)


def test_patching_a_node_with_its_own_clean_value_changes_nothing():
    model, task = linear_model(), _linear_task()
    task = Task(task.clean, task.clean, task.metric)
    for nodes in ("heads", "queries", "keys", "values", "mlps", "resid"):
        pos = torch.full((task.n_pairs,), 2)
        eff, total = circuits.patching.patch_effects(model, task, nodes, positions=pos)
        assert np.abs(eff).max() == 0.0 and np.abs(total).max() == 0.0, nodes


def test_atp_equals_exact_patching_when_the_metric_is_linear_in_the_node():
    """Pre-LN without a final LayerNorm and a last MLP that writes nothing: the last layer's heads write straight
    into the hidden state the (linear) metric pools, so first order is exact for them."""
    torch.manual_seed(2)
    cfg = EncoderConfig(vocab_size=20, d_model=D, n_layers=2, n_heads=H, d_mlp=8, max_positions=16,
                        type_vocab_size=0, hidden_dropout=0.0, attention_dropout=0.0, norm_placement="pre")
    model = Encoder(cfg).eval().double()
    with torch.no_grad():
        model.ln_final = None
        model.blocks[1].mlp.fc_out.weight.zero_()
        for p in model.parameters():
            p.mul_(5.0)  # large enough that the earlier layers are far from linear
    task = _linear_task()
    exact, _ = circuits.patching.patch_effects(model, task, "heads")
    est, _ = circuits.attribution.attribute_effects(model, task, "atp", "heads")
    last = slice(H, 2 * H)
    np.testing.assert_allclose(est[:, last], exact[:, last], rtol=1e-9, atol=1e-12)
    assert np.abs(exact[:, last]).max() > 1e-3
    assert np.abs(est[:, :H] - exact[:, :H]).max() > 1e-6  # the first layer is not linear: AtP is only first order


def _saturated_one_layer(changed: int = 4) -> tuple[Encoder, Task, torch.Tensor]:
    """One pre-LN layer with saturated attention, no final LayerNorm, no MLP; the metric reads the hidden state
    at position 0 along ``u`` (linear in the head outputs there); the corrupted text changes token ``changed``
    (the last by default)."""
    torch.manual_seed(3)
    cfg = EncoderConfig(vocab_size=20, d_model=D, n_layers=1, n_heads=H, d_mlp=8, max_positions=16,
                        type_vocab_size=0, hidden_dropout=0.0, attention_dropout=0.0, norm_placement="pre")
    model = Encoder(cfg).eval().double()
    with torch.no_grad():
        model.ln_final = None
        model.blocks[0].mlp.fc_out.weight.zero_()
        model.blocks[0].attn.qkv.weight[:D].mul_(300.0)  # saturated attention
    gen = torch.Generator().manual_seed(0)
    clean = torch.randint(0, 20, (3, 5), generator=gen)
    corrupted = clean.clone()
    corrupted[:, changed] = (clean[:, changed] + 5) % 20
    u = torch.randn(D, generator=gen, dtype=torch.float64)
    mask = torch.ones_like(clean)
    metric = Metric(lambda hidden, attn, rows: hidden[:, 0] @ u.to(hidden.dtype), "position-0")
    return model, Task({"input_ids": clean, "attention_mask": mask},
                       {"input_ids": corrupted, "attention_mask": mask}, metric), u


def test_atp_star_query_key_part_is_exact_for_one_changed_key():
    """One layer, metric linear in the head outputs at position 0, one token changed: the head's query/key effect
    is one key node's (query 0 is clean), which AtP* takes through the exact softmax, so AtP*'s query + key part
    equals exactly patching that head's queries and keys; its value part equals patching the values (linear
    given the pattern). Plain AtP linearises the saturated softmax and misses."""
    model, task, u = _saturated_one_layer()
    clean, corrupted, mask = task.clean["input_ids"], task.corrupted["input_ids"], task.mask
    loss = lambda out: (out[:, 0] @ u).sum()  # noqa: E731
    names = ["blocks.0.attn.hook_q", "blocks.0.attn.hook_k", "blocks.0.attn.hook_v", "blocks.0.attn.hook_pattern",
             "blocks.0.attn.hook_scores", "blocks.0.hook_resid_pre", "blocks.0.attn.hook_z"]
    _, cc = model.run_with_cache(clean, mask, names_filter=names, incl_bwd=True, loss_fn=loss)
    with torch.no_grad():
        _, ck = model.run_with_cache(corrupted, mask, names_filter=names)
        parts = circuits.attribution.atp_star_parts(model, 0, cc, ck, mask)
        base = model(clean, mask)[:, 0] @ u

        def patched(sites, head):
            def put(t, hook):
                t = t.clone()
                t[:, :, head] = ck[hook.name][:, :, head]
                return t
            with model.hooks([(f"blocks.0.attn.hook_{s}", put) for s in sites]):
                return model(clean, mask)[:, 0] @ u - base

        for h in range(H):
            torch.testing.assert_close(parts["query"][:, h] + parts["key"][:, h], patched("qk", h), rtol=1e-8,
                                       atol=1e-12)
            torch.testing.assert_close(parts["value"][:, h], patched("v", h), rtol=1e-8, atol=1e-12)
        qk = torch.stack([patched("qk", h) for h in range(H)], 1)
        atp_qk = sum(((ck[f"blocks.0.attn.hook_{s}"] - cc[f"blocks.0.attn.hook_{s}"])
                      * cc[f"blocks.0.attn.hook_{s}_grad"]).sum((1, 3)) for s in "qk")
    assert qk.abs().max() > 1e-3
    assert (atp_qk - qk).abs().max() > 0.1 * qk.abs().max()  # AtP on the q/k nodes linearises the softmax: off


def test_atp_star_per_node_kind_equals_exact_patching_of_that_node_kind():
    """Through the public entry points: AtP's QK fix (``atp-qk``) of each head's key (value) nodes equals exactly
    patching that head's keys (values) where the rest is linear; query nodes move nothing the metric reads (query 0
    is clean), in both; plain AtP on the key nodes linearises the saturated softmax and misses. With one layer
    GradDrop has no layer to drop but the node's own, so AtP* is the magnitude of the QK-fix estimate."""
    model, task, _ = _saturated_one_layer()
    for kind in ("queries", "keys", "values"):
        exact, _ = circuits.patching.patch_effects(model, task, kind)
        star, _ = circuits.attribution.attribute_effects(model, task, "atp-qk", kind)
        np.testing.assert_allclose(star, exact, rtol=1e-8, atol=1e-12)
        if kind != "queries":
            assert np.abs(exact).max() > 1e-3
    np.testing.assert_allclose(circuits.patching.patch_effects(model, task, "queries")[0], 0.0, atol=1e-12)
    keys, _ = circuits.patching.patch_effects(model, task, "keys")
    atp_keys, _ = circuits.attribution.attribute_effects(model, task, "atp", "keys")
    assert np.abs(atp_keys - keys).max() > 0.1 * np.abs(keys).max()
    heads, _ = circuits.attribution.attribute_effects(model, task, "atp-qk", "heads")
    parts = sum(circuits.attribution.attribute_effects(model, task, "atp-qk", k)[0]
                for k in ("queries", "keys", "values"))
    np.testing.assert_allclose(heads, parts, rtol=1e-10, atol=1e-14)
    for kind in ("queries", "keys", "values"):
        star, _ = circuits.attribution.attribute_effects(model, task, "atp*", kind)
        qk, _ = circuits.attribution.attribute_effects(model, task, "atp-qk", kind)
        np.testing.assert_allclose(star, np.abs(qk), rtol=1e-12, atol=1e-15)
    table = circuits.patch(model, task, "keys", n_boot=10)
    assert list(table.node[:2]) == ["L0H0.k", "L0H1.k"] and set(table["head"]) == {0, 1}


def test_atp_star_query_nodes_are_exact_where_the_query_moves():  # the QK fix: atp-qk
    """Issue 40.13: the query-side fix where it matters. The corrupted text changes token 0, the position the
    metric reads, so query 0 moves; AtP* recomputes that row's softmax exactly and, the rest being linear given
    the pattern, equals exactly patching the head's queries (and keys: only key 0 moves, recomputed column by
    column); plain AtP linearises the saturated softmax and misses by more than a tenth."""
    model, task, _ = _saturated_one_layer(changed=0)
    for kind in ("queries", "keys"):
        exact, _ = circuits.patching.patch_effects(model, task, kind)
        star, _ = circuits.attribution.attribute_effects(model, task, "atp-qk", kind)
        atp, _ = circuits.attribution.attribute_effects(model, task, "atp", kind)
        assert np.abs(exact).max() > 1e-3, kind
        np.testing.assert_allclose(star, exact, rtol=1e-8, atol=1e-12)
        assert np.abs(atp - exact).max() > 0.1 * np.abs(exact).max(), kind


def cancelling_model() -> Encoder:
    """Two pre-LN layers, no final LayerNorm, everything zero except: head A = L0H0 copies the token's dim-0 value
    (uniform attention) to +dim 4 / -dim 5; block 1's MLP has one ReLU unit reading dim 4 (bias -4.5: active on the
    clean text, inactive on the corrupted one) that writes +dim 8 / -dim 9."""
    cfg = EncoderConfig(vocab_size=12, d_model=D, n_layers=2, n_heads=H, d_mlp=8, max_positions=16,
                        type_vocab_size=0, hidden_dropout=0.0, attention_dropout=0.0, norm_placement="pre",
                        activation="relu")
    model = Encoder(cfg).eval().double()
    _zero_(model)
    model.ln_final = None
    with torch.no_grad():
        a = torch.linspace(-1, 1, 12).double()
        model.embed.word.weight[:, 0], model.embed.word.weight[:, 1] = a, -a
        model.embed.word.weight[:, 12:16] = torch.tensor([3.0, -3.0, 3.0, -3.0]).double()
        model.blocks[0].attn.qkv.weight[2 * D, 0] = 1.0  # A's value reads dim 0
        model.blocks[0].attn.out.weight[4, 0], model.blocks[0].attn.out.weight[5, 0] = 1.0, -1.0
        model.blocks[1].mlp.fc_in.weight[0, 4], model.blocks[1].mlp.fc_in.bias[0] = 10.0, -4.5
        model.blocks[1].mlp.fc_out.weight[8, 0], model.blocks[1].mlp.fc_out.weight[9, 0] = 1.0, -1.0
    return model


def test_graddrop_recovers_a_node_whose_direct_and_indirect_gradients_cancel():
    """Issue 40.13, Kramár et al.'s cancellation failure. The metric reads A's write directly (dim 4, weight alpha)
    and through the ReLU unit (dim 8); alpha is set so that at the clean run the two gradients cancel: plain AtP of
    A reads 0. Patching A turns the unit off, so the indirect path gives back less than its gradient says and the
    true effect is large. GradDrop's pass with block 1's gradient dropped keeps only the direct path; A's own
    layer's pass is zero; so AtP* = |that estimate| / (2 - 1), which is known: AtP (= exact patching, the path being
    linear) of A in the same model with block 1's MLP writing nothing. Last-layer heads have nothing downstream to
    drop: AtP* = |AtP| there."""
    model = cancelling_model()
    clean = torch.tensor([[11, 10, 9, 11, 10], [9, 10, 11, 10, 11], [10, 10, 11, 9, 11]])  # one multiset: one alpha
    corrupted = clean.clone()
    corrupted[:, 1] = 0
    unit = torch.eye(D, dtype=torch.float64)
    atp = lambda m, u: circuits.attribution.attribute_effects(m, _task(clean, corrupted, u), "atp", "heads")[0]  # noqa: E731
    direct, indirect = atp(model, unit[4])[:, 0], atp(model, unit[8])[:, 0]
    alpha = -indirect[0] / direct[0]
    np.testing.assert_allclose(-indirect / direct, alpha, rtol=1e-9)  # one alpha cancels every pair
    task = _task(clean, corrupted, alpha * unit[4] + unit[8])
    exact, _ = circuits.patching.patch_effects(model, task, "heads")
    plain, _ = circuits.attribution.attribute_effects(model, task, "atp", "heads")
    star, _ = circuits.attribution.attribute_effects(model, task, "atp*", "heads")
    assert np.abs(plain[:, 0]).max() < 1e-12 * np.abs(exact[:, 0]).min()  # AtP: no effect at all
    assert np.abs(exact[:, 0]).min() > 0.5  # the true effect is large
    no_mlp = cancelling_model()
    with torch.no_grad():
        no_mlp.blocks[1].mlp.fc_out.weight.zero_()
    only_direct, _ = circuits.attribution.attribute_effects(no_mlp, task, "atp", "heads")
    np.testing.assert_allclose(only_direct, circuits.patching.patch_effects(no_mlp, task, "heads")[0], rtol=1e-9)
    np.testing.assert_allclose(star[:, 0], np.abs(only_direct[:, 0]), rtol=1e-9)
    assert star[:, 0].min() > 0.5
    np.testing.assert_allclose(star[:, H:], np.abs(plain[:, H:]), rtol=1e-12, atol=1e-15)
    assert not circuits.table.node_method("atp*").signed and circuits.table.node_method("atp-qk").signed


def test_graddrop_pass_equals_removing_the_dropped_blocks_writes_from_the_backward_pass():
    """``graddrop_estimates``: the estimate of a layer-0 value node with block 1's gradient dropped equals AtP of
    the same node in a copy whose block-1 attention and MLP outputs are constants (``detach`` hooks, the definition
    written out by hand), on a random three-layer post-LN model; its own layer's entry is zero and the last layer's
    entries are the plain estimate."""
    torch.manual_seed(5)
    cfg = EncoderConfig(vocab_size=20, d_model=D, n_layers=3, n_heads=H, d_mlp=8, max_positions=16,
                        type_vocab_size=0, hidden_dropout=0.0, attention_dropout=0.0)
    model = Encoder(cfg).eval().double()
    task = _linear_task()
    c = circuits.attribution._chunk(model, task, "values", 1, (), task.clean, task.corrupted,
                                    torch.arange(task.n_pairs))
    _, cc = model.run_with_cache(**c.clean, names_filter=["blocks.*.attn.hook_v"], incl_bwd=True, loss_fn=c.loss)

    def estimate(L, grads):
        name = f"blocks.{L}.attn.hook_v"
        return ((c.ck[name] - cc[name]) * grads[name + "_grad"]).sum((1, 3)).double()

    per_drop = circuits.attribution.graddrop_estimates(model, c.clean, c.loss, "attn.hook_v", estimate, cc)
    assert per_drop.shape == (3, task.n_pairs, 3, H)
    cut = [(f"blocks.1.{w}", lambda t, hook: t.detach()) for w in ("hook_attn_out", "hook_mlp_out")]
    _, by_hand = model.run_with_cache(**c.clean, names_filter=["blocks.0.attn.hook_v"], fwd_hooks=cut,
                                      incl_bwd=True, loss_fn=c.loss)
    torch.testing.assert_close(per_drop[1, :, 0], estimate(0, by_hand))
    assert (per_drop[1, :, 0] - estimate(0, cc)).abs().max() > 1e-6  # dropping block 1 changes layer 0's estimate
    for drop in range(3):
        assert per_drop[drop, :, drop].abs().max() == 0.0
        torch.testing.assert_close(per_drop[drop, :, 2] if drop < 2 else per_drop[0, :, 2], estimate(2, cc))
    combined = circuits.attribution.graddrop(per_drop)
    torch.testing.assert_close(combined, per_drop.abs().sum(0).flatten(1) / 2)


def test_cpr_and_cmd_are_mibs_trapezoids():
    assert circuits.area_under_curve([0.1, 0.5, 1.0], [0.2, 0.6, 1.0]) == pytest.approx((0.56, 0.34))
    f = [0.0, 0.05, 0.1, 0.3, 0.5, 0.9, 1.1, 1.0, 0.95, 1.0]
    cpr, cmd = circuits.area_under_curve(circuits.PERCENTAGES, f)
    x = np.array(circuits.PERCENTAGES)
    assert cpr == pytest.approx(np.trapezoid(f, x))
    assert cmd == pytest.approx(np.trapezoid(np.abs(1 - np.array(f)), x))


def test_faithfulness_curve_and_random_control():
    model, task = planted_model()
    scores = circuits.edges(model, task, "eap")
    curve, areas = circuits.faithfulness(model, task, scores, n_random=3)
    assert set(areas.ordering) == {"scores", "random0", "random1", "random2"}
    ours = curve[curve.ordering == "scores"]
    assert ours.faithfulness.iloc[-1] == pytest.approx(1.0)  # 100% of edges = the full model
    assert float(areas.loc[areas.ordering == "scores", "cpr"].iloc[0]) > areas.cpr.iloc[1:].max()


# ====================================================================== task files
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from helpers import save_tiny_bert

    from bertscope import models

    folder = tmp_path_factory.mktemp("tiny-bert")
    save_tiny_bert(folder)
    return models.load(folder).eval()


def test_task_file_round_trip_and_errors(tiny, tmp_path):
    good = tmp_path / "pairs.jsonl"
    good.write_text(json.dumps({"clean": "the cat sat", "corrupted": "the dog sat", "query": "cat"}) + "\n")
    task = circuits.load_task(tiny, good, "cosine")
    assert task.n_pairs == 1
    task.write(tmp_path / "again.jsonl")
    assert circuits.load_task(tiny, tmp_path / "again.jsonl", "dot").n_pairs == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text(good.read_text() + json.dumps({"clean": "the cat sat", "corrupted": "the cat sat down",
                                                  "query": "x"}) + "\n")
    with pytest.raises(TaskError, match="line 2.*equal length"):
        circuits.load_task(tiny, bad, "cosine")
    with pytest.raises(TaskError, match="unknown metric"):
        circuits.load_task(tiny, good, "accuracy")
    with pytest.raises(TaskError, match="masked-LM head"):
        circuits.load_task(tiny, good, "mask-logit-diff")


def test_eap_ig_follows_hanna_et_al_interpolation_points():
    """EAP-IG as in Hanna et al.'s ``get_scores_eap_ig``: gradients averaged at the input embeddings
    ``e* + (k/m)(e - e*)`` for ``k = 0..m-1`` (the corrupted end included, the clean end not), times ``a* - a``.
    Pinned independently: with m = 2 the estimate is (a* - a) . mean of the gradients at the corrupted run and at the
    midpoint, each computed here by autograd on the node's hook."""
    torch.manual_seed(3)
    cfg = EncoderConfig(vocab_size=20, d_model=D, n_layers=2, n_heads=H, d_mlp=8, max_positions=16,
                        type_vocab_size=0, hidden_dropout=0.0, attention_dropout=0.0)
    model = Encoder(cfg).eval().double()
    task = _linear_task()
    est, _ = circuits.attribution.attribute_effects(model, task, "eap-ig", "heads", steps=2)
    clean, corr = task.batch(range(task.n_pairs), "clean"), task.batch(range(task.n_pairs), "corrupted")
    names = ["blocks.*.attn.hook_z", "embed.hook_out"]
    with torch.no_grad():
        _, cc = model.run_with_cache(**clean, names_filter=names)
        _, ck = model.run_with_cache(**corr, names_filter=names)
    grads = []
    for alpha in (0.0, 0.5):
        mixed = ck["embed.hook_out"] + alpha * (cc["embed.hook_out"] - ck["embed.hook_out"])
        zs = {}

        def keep(t, hook, zs=zs):
            t.retain_grad()
            zs[hook.name] = t
            return t

        hooks = [("embed.hook_out", lambda t, hook, mixed=mixed: mixed.clone().requires_grad_(True))]
        hooks += [(f"blocks.{L}.attn.hook_z", keep) for L in range(cfg.n_layers)]
        with model.hooks(hooks):
            hidden = model(**clean)
        task.metric(hidden, clean["attention_mask"], list(range(task.n_pairs))).sum().backward()
        grads.append([zs[f"blocks.{L}.attn.hook_z"].grad for L in range(cfg.n_layers)])
    expected = torch.cat([((ck[f"blocks.{L}.attn.hook_z"] - cc[f"blocks.{L}.attn.hook_z"])
                           * (grads[0][L] + grads[1][L]) / 2).sum((1, 3)) for L in range(cfg.n_layers)], 1)
    np.testing.assert_allclose(est, expected.numpy(), rtol=1e-9, atol=1e-12)
    one, _ = circuits.attribution.attribute_effects(model, task, "eap-ig", "heads", steps=1)
    assert np.abs(one - est).max() > 1e-6  # the midpoint matters: the check above can tell the conventions apart


def test_eap_ig_activations_follows_hanna_et_al_every_line_every_node():
    """EAP-IG-activations as Hanna et al.'s ``get_scores_ig_activations`` (MIB's "EAP-IG-activations"): one line
    per node of their graph (input, each layer's attention with all heads together, each MLP), ``alpha = k/m`` for
    ``k = 1..m``, and on every pass the gradient is read at every node; a head's score is ``(a* - a)`` times the
    mean of its gradient over all ``(2 n_layers + 1) m`` passes (a moved node's output is a constant there, so the
    gradient of the nodes before it skips the paths through it, as in their hooks). Pinned by a reference built
    here pass by pass with autograd (m = 2)."""
    torch.manual_seed(5)
    cfg = EncoderConfig(vocab_size=20, d_model=D, n_layers=2, n_heads=H, d_mlp=8, max_positions=16,
                        type_vocab_size=0, hidden_dropout=0.0, attention_dropout=0.0)
    model = Encoder(cfg).eval().double()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    task = _linear_task()
    rows = list(range(task.n_pairs))
    clean, corr = task.batch(rows, "clean"), task.batch(rows, "corrupted")
    lines = ["embed.hook_out"] + [f"blocks.{L}.{s}" for L in range(2) for s in ("attn.hook_z", "hook_mlp_out")]
    z = [f"blocks.{L}.attn.hook_z" for L in range(2)]
    with torch.no_grad():
        _, cc = model.run_with_cache(**clean, names_filter=lines)
        _, ck = model.run_with_cache(**corr, names_filter=lines)
    total = [torch.zeros_like(cc[n]) for n in z]
    for line in lines:
        for alpha in (0.5, 1.0):
            seen = {}

            def keep(t, hook, seen=seen):
                t.retain_grad()
                seen[hook.name] = t
                return t

            def put(t, hook, line=line, alpha=alpha, keep=keep):
                out = (alpha * cc[line] + (1 - alpha) * ck[line]).clone().requires_grad_(True)
                return keep(out, hook) if hook.name in z else out

            hooks = [(line, put)] + [(n, keep) for n in z if n != line]
            with model.hooks(hooks):
                hidden = model(**clean)
            task.metric(hidden, clean["attention_mask"], rows).sum().backward()
            total = [t + seen[n].grad for t, n in zip(total, z, strict=True)]
    expected = torch.cat([((ck[n] - cc[n]) * t / (len(lines) * 2)).sum((1, 3)) for n, t in zip(z, total, strict=True)],
                         1)
    est, _ = circuits.attribution.attribute_effects(model, task, "eap-ig-act", "heads", steps=2)
    np.testing.assert_allclose(est, expected.numpy(), rtol=1e-9, atol=1e-12)
    own, _ = circuits.attribution.attribute_effects(model, task, "ig-act-own", "heads", steps=2)
    assert np.abs(own - est).max() > 1e-6  # the two variants differ: the reference above tells them apart


def test_ig_on_a_nodes_own_line_converges_to_exact_patching_of_the_node():
    """``ig-act-own`` integrates a layer's gradient along its own line from the clean to the corrupted activation,
    everything else clean: with one head per layer the Riemann sum converges to that head's exact patching effect
    (error O(1/steps)), and the input-path EAP-IG does not (it moves every node at once)."""
    torch.manual_seed(4)
    cfg = EncoderConfig(vocab_size=20, d_model=D, n_layers=2, n_heads=1, d_mlp=8, max_positions=16,
                        type_vocab_size=0, hidden_dropout=0.0, attention_dropout=0.0)
    model = Encoder(cfg).eval().double()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)  # not linear: AtP's first-order error is visible
    task = _linear_task()
    exact, _ = circuits.patching.patch_effects(model, task, "heads")
    fine, _ = circuits.attribution.attribute_effects(model, task, "ig-act-own", "heads", steps=400)
    coarse, _ = circuits.attribution.attribute_effects(model, task, "ig-act-own", "heads", steps=4)
    atp, _ = circuits.attribution.attribute_effects(model, task, "atp", "heads")
    scale = np.abs(exact).max()
    err = {k: np.abs(v - exact).max() / scale for k, v in (("fine", fine), ("coarse", coarse), ("atp", atp))}
    print(err)
    assert err["fine"] < 0.02 * err["atp"] and err["fine"] < 0.02 * err["coarse"], err


def test_edge_check_path_patches_the_top_and_a_random_sample_of_edges():
    """The experiment's edge check: on the frozen-linear model each checked edge's path-patching effect equals its
    EAP score; the first rows are the top-ranked edges, the rest a seeded sample of the others."""
    from bertscope.experiments.circuits.measures import edge_check

    model, task = linear_model(), _linear_task(2)
    scores = circuits.edges(model, task, "eap")
    check = edge_check(model, task, scores, 3, seed=0)
    table = scores.table()
    assert list(check.edge[check.chosen == "top"]) == list(table.edge[:3])
    rand = check[check.chosen == "random"]
    assert len(rand) == 3 and not set(rand.edge) & set(table.edge[:3])
    np.testing.assert_allclose(check.path_patching, check.score, rtol=1e-8, atol=1e-12)
    assert list(edge_check(model, task, scores, 3, seed=0).edge) == list(check.edge)


@pytest.mark.parametrize("line,problem", [('{"clean": "unclosed', "not valid JSON"), ('["clean"]', "expected a JSON")])
def test_task_files_and_jsonl_corpora_share_one_reader(tmp_path, line, problem):
    """One JSON Lines reader (hooks/jsonl.py) serves task files and JSONL corpora; both name the bad line."""
    from bertscope.experiments.corpus import CorpusError, read_corpus_file
    from bertscope.hooks.circuits.tasks import read_pairs

    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps({"clean": "a b", "corrupted": "a c", "text": "a b"}) + "\n\n" + line + "\n")
    with pytest.raises(TaskError, match=f"line 3: {problem}"):
        read_pairs(path)
    with pytest.raises(CorpusError, match=f"x.jsonl:3: {problem}"):
        read_corpus_file(path)


def test_edge_scores_and_circuit_reprs_are_one_short_line_naming_the_top_entries():
    """A 12-layer, 12-head graph has thousands of edges: the reprs give sizes and the planted top edges only."""
    from bertscope.hooks.circuits.graph import Graph
    from bertscope.hooks.circuits.search import Circuit

    g = Graph(12, 12, True)
    scores = torch.zeros(len(g.senders), len(g.receivers), dtype=torch.float64)
    planted = [("L2H3", "L5H8", -0.5), ("input", "output", 0.25), ("m4", "L7H1", 0.125)]
    for s, r, v in planted:
        scores[g.senders.index(s), g.receivers.index(r)] = v
    later, earlier = g.senders.index("L7H1"), g.receivers.index("L2H3")
    assert not g.valid[later, earlier]
    scores[later, earlier] = 9.0  # not an edge (a later head cannot feed an earlier one): never shown
    text = repr(circuits.EdgeScores(g, scores, "eap-ig", 24))
    assert "\n" not in text and len(text) < 200, text
    assert text.startswith("EdgeScores(method='eap-ig', n_pairs=24, edges=")
    assert f"edges={int(g.valid.sum())}" in text
    shown = [part.split(":")[0] for part in text.split("top=[")[1].split(", ")[:3]]
    assert shown == [f"{s}->{r}" for s, r, _ in planted]
    assert "L2H3->L5H8: -0.5" in text

    edges = [f"{s}->{r}" for s, r, _ in planted] * 4
    c = Circuit(torch.zeros(len(g.senders), len(g.receivers), dtype=torch.bool), edges, ["L2H3", "L5H8"], 0.875,
                0.3, 0.4, 0.1, 17, [{"step": i} for i in range(500)])
    text = repr(c)
    assert "\n" not in text and len(text) < 200, text
    assert text.startswith("Circuit(edges=12, nodes=2, faithfulness=0.875, n_evaluations=17, edges_shown=[L2H3->")
    assert text.endswith(", ...])")
