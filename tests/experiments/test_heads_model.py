"""Known-answer tests for head importance (ablation, gradients, pruning) and word-piece syntax scoring."""

from __future__ import annotations

import copy
import os
import signal

import numpy as np
import pytest
import torch
from bertscope.experiments import corpus as corpus_mod
from bertscope.experiments.heads import gradients as grads
from bertscope.experiments.heads import importance as imp
from bertscope.experiments.heads import parallel, pruning
from bertscope.experiments.heads import syntax as syn
from bertscope.hooks.hook_points import fork_batch

from bertscope import hooks, models
from tests.helpers import assert_close_across_kernels


@pytest.fixture(scope="module")
def tiny(tiny_config: models.EncoderConfig, tokenizer) -> models.Encoder:
    """Tiny random encoder (2 layers x 4 heads) whose attention outputs are large enough to matter."""
    model = models.random_encoder(tiny_config, seed=0, tokenizer=tokenizer)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight.mul_(10.0)
            block.attn.out.weight.mul_(10.0)
    return model


def toy_batch(n: int = 3, pos: int = 9, seed: int = 0) -> imp.TokenBatch:
    """Random tokens framed by [CLS] ... [SEP], right-padded to different lengths."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, 5000, (n, pos), generator=g)
    mask = torch.ones(n, pos, dtype=torch.long)
    for b in range(n):
        length = pos - 2 * b
        ids[b, 0], ids[b, length - 1] = 101, 102
        ids[b, length:], mask[b, length:] = 0, 0
    special = (ids == 101) | (ids == 102)
    return imp.TokenBatch(ids, mask, torch.zeros_like(ids), special)


def without_heads(model: models.Encoder, heads_to_zero: list[tuple[int, int]]) -> models.Encoder:
    """A copy of ``model`` with the given heads' slices of W_O set to zero."""
    dead = copy.deepcopy(model)
    d = model.config.d_head
    with torch.no_grad():
        for layer, head in heads_to_zero:
            dead.blocks[layer].attn.out.weight[:, head * d : (head + 1) * d] = 0.0
    return dead


def real_rows(x: torch.Tensor, batch: imp.TokenBatch) -> torch.Tensor:
    return x[batch.attention_mask.bool()]


# ---------------------------------------------------------------------------------------------- ablation


def test_zero_ablation_through_hooks_equals_zeroing_the_W_O_slice(tiny):
    batch = toy_batch()
    keep = torch.ones(2, 2, 4)
    keep[0, 1, 2] = 0.0
    keep[1, 0, 1] = keep[1, 1, 3] = 0.0
    with torch.no_grad():
        ablated = imp.forward_with_heads(tiny, batch, keep).reshape(2, 3, 9, -1)
        clean = tiny(batch.input_ids, batch.attention_mask)
        for c, dead_heads in enumerate([[(1, 2)], [(0, 1), (1, 3)]]):
            expected = without_heads(tiny, dead_heads)(batch.input_ids, batch.attention_mask)
            assert_close_across_kernels(real_rows(ablated[c], batch), real_rows(expected, batch))
            assert (real_rows(ablated[c], batch) - real_rows(clean, batch)).abs().max() > 1e-2  # not a no-op


@pytest.mark.parametrize("method", imp.METHODS)
def test_ablation_matches_hooks_ablate_heads_and_runs_from_the_ablated_layer(tiny, method):
    batch = toy_batch()
    mean_z = imp.mean_head_outputs(tiny, [batch])
    reference = hooks.mean_z(tiny, batch.input_ids, batch.attention_mask, batch.token_type_ids)
    torch.testing.assert_close(mean_z, torch.stack([reference[0], reference[1]]), atol=1e-6, rtol=1e-5)
    keep = imp.single_head_keep(2, 4, layer=1)[2:3]  # ablate head (1, 2)
    with torch.no_grad():
        ours = imp.forward_with_heads(tiny, batch, keep, method=method, mean_z=mean_z)
        _, cache = tiny.run_with_cache(batch.input_ids, batch.attention_mask, names_filter="blocks.1.hook_resid_pre")
        started = imp.forward_with_heads(
            tiny, batch, keep, method=method, mean_z=mean_z, start=(1, cache["blocks.1.hook_resid_pre"])
        )
        lead = tiny.run_with_hooks(
            batch.input_ids,
            batch.attention_mask,
            fwd_hooks=hooks.ablate_heads(
                tiny, {1: [2]}, method, reference=reference, attention_mask=batch.attention_mask
            ),
        )
    # batched masks vs hooks, and a restart from layer 1: other kernels (batch shape, fused vs explicit attention)
    assert_close_across_kernels(real_rows(ours, batch), real_rows(lead, batch))
    assert_close_across_kernels(real_rows(started, batch), real_rows(ours, batch))
    with pytest.raises(ValueError, match="earlier layers"):
        imp.forward_with_heads(tiny, batch, imp.single_head_keep(2, 4, 0), start=(1, cache["blocks.1.hook_resid_pre"]))


def test_one_sentence_copies_share_the_start_layer_and_mix_methods(tiny):
    """One unpadded sentence started from its clean residual: the copies (each with its own method) fork at the
    first gated layer's hook_z, so that layer's Q/K/V run once; each copy equals a full forward with its mask."""
    batch = toy_batch()
    mean_z = imp.mean_head_outputs(tiny, [batch])
    keep = torch.ones(4, 2, 4)
    keep[0, 1, 2] = 0.0  # zero (1, 2)
    keep[1, 1, [0, 3]] = 0.0  # mean of (1, 0) and (1, 3)
    keep[2, 1, 1] = 0.5  # half uniform (1, 1)
    methods = ["zero", "mean", "uniform", "zero"]  # the last copy removes nothing
    sentences = imp.split_sentences(batch)
    assert [s.input_ids.shape[1] for s in sentences] == [9, 7, 5]
    seen: dict[str, int] = {}  # batch size at each layer's Q
    watch = [("blocks.*.attn.hook_q", lambda q, hook: seen.__setitem__(hook.name, q.shape[0]))]
    for i, sentence in enumerate(sentences):
        assert bool(sentence.attention_mask.all())
        _, cache = tiny.run_with_cache(sentence.input_ids, sentence.attention_mask, names_filter="blocks.0.*")
        seen.clear()
        with torch.no_grad(), tiny.hooks(watch):
            shared = imp.forward_with_heads(tiny, sentence, keep, method=methods, mean_z=mean_z,
                                            start=(0, cache["blocks.0.hook_resid_pre"]))  # fmt: skip
        assert seen == {"blocks.0.attn.hook_q": 1, "blocks.1.attn.hook_q": 1}  # forked at layer 1's hook_z
        assert shared.shape == (4, 9 - 2 * i, tiny.config.d_model)
        for c, method in enumerate(methods):
            with torch.no_grad():
                alone = imp.forward_with_heads(tiny, batch, keep[c][None], method=method, mean_z=mean_z)
            real = batch.attention_mask[i].bool()
            assert_close_across_kernels(shared[c], alone[i][real])  # forked batch vs padded batch
    keep_early = keep.clone()
    keep_early[3, 0, 0] = 0.0  # copy 3 now gates layer 0: the fork moves there
    seen.clear()
    with torch.no_grad(), tiny.hooks(watch):
        imp.forward_with_heads(tiny, sentence, keep_early, method=methods, mean_z=mean_z,
                               start=(0, cache["blocks.0.hook_resid_pre"]))  # fmt: skip
    assert seen == {"blocks.0.attn.hook_q": 1, "blocks.1.attn.hook_q": 4}


def test_fork_batch_is_the_only_shape_change_a_hook_may_make(tiny):
    ids = toy_batch(n=1).input_ids
    grow = [("blocks.0.attn.hook_z", lambda z, hook: torch.cat([z, z]))]
    with pytest.raises(ValueError, match="returned shape"):
        tiny.run_with_hooks(ids, fwd_hooks=grow)
    out = tiny.run_with_hooks(ids, fwd_hooks=[("blocks.0.attn.hook_z", fork_batch(3))])
    assert out.shape == (3, ids.shape[1], tiny.config.d_model)
    assert_close_across_kernels(out[2], tiny(ids)[0])  # a batch of 3 vs of 1: the matmuls may block differently
    with pytest.raises(ValueError, match="batch of one"):
        tiny.run_with_hooks(toy_batch(n=2).input_ids, fwd_hooks=[("blocks.0.attn.hook_z", fork_batch(3))])


def test_ablation_effects_equal_one_full_forward_per_head_and_method(tiny):
    """Sentence by sentence without padding, methods sharing passes: the same as ablating each head alone with
    the padded batch through a full forward."""
    batch = toy_batch()
    effects, measures = imp.ablation_effects(tiny, [batch], copies_per_pass=5)
    mean_z = imp.mean_head_outputs(tiny, [batch])
    with torch.no_grad():
        clean = tiny(batch.input_ids, batch.attention_mask, batch.token_type_ids)
        for a, method in enumerate(imp.METHODS):
            for layer in range(2):
                keep = imp.single_head_keep(2, 4, layer)
                hidden = imp.forward_with_heads(tiny, batch, keep, method=method, mean_z=mean_z)
                change = imp.output_change(clean, hidden.reshape(4, *batch.input_ids.shape, -1), batch.attention_mask)
                for m, name in enumerate(measures):
                    np.testing.assert_allclose(effects[:, a, layer, :, m], change[name].T.numpy(), atol=1e-5)
    assert (effects[:, :, :, :, 0] > 1e-4).all()


def test_a_dead_head_has_no_effect_and_no_gradient(tiny):
    model = without_heads(tiny, [(1, 0), (0, 3)])
    batches = [toy_batch(seed=0), toy_batch(n=2, seed=1)]
    effects, measures = imp.ablation_effects(model, batches, copies_per_pass=3)
    assert measures == list(imp.OUTPUT_MEASURES)
    assert effects.shape == (5, 3, 2, 4, 2)
    np.testing.assert_allclose(effects[:, :, 1, 0], 0.0, atol=1e-6)
    np.testing.assert_allclose(effects[:, :, 0, 3], 0.0, atol=1e-6)
    assert (effects[:, 0, 1, 1:] > 1e-4).all()  # live heads do matter
    grad, objective = grads.gradient_importance(model, batches)
    assert objective == "projection" and grad.shape == (5, 2, 4)
    assert (grad[:, 1, 0] == 0).all() and (grad[:, 0, 3] == 0).all()
    assert (grad.mean(0)[1, 1:] > 0).all()


def test_gradient_importance_ranks_a_planted_critical_head_first(tiny):
    model = copy.deepcopy(tiny)
    d = model.config.d_head
    with torch.no_grad():
        for block in model.blocks:
            block.attn.out.weight.mul_(0.2)
        model.blocks[0].attn.out.weight[:, 2 * d : 3 * d] *= 25.0  # head (0, 2) writes 25x more than the rest
    batches = [toy_batch(seed=s) for s in range(2)]
    grad, _ = grads.gradient_importance(model, batches, n_projections=8)
    assert np.unravel_index(grad.mean(0).argmax(), grad.shape[1:]) == (0, 2)
    effects, _ = imp.ablation_effects(model, batches, methods=("zero",))
    pooled = effects[:, 0, :, :, imp.OUTPUT_MEASURES.index("pooled_cos")].mean(0)
    assert np.unravel_index(pooled.argmax(), pooled.shape) == (0, 2)


def test_per_example_gradients_match_finite_differences(tiny):
    model = copy.deepcopy(tiny).double()
    batch = toy_batch(n=3)
    seed = 5
    grad_importance, _ = grads.gradient_importance(model, [batch], n_projections=1, seed=seed)
    projections = torch.randn(3, model.config.d_model, generator=torch.Generator().manual_seed(seed))
    gates = torch.ones(3, 2, 4, dtype=torch.float64, requires_grad=True)
    loss = grads.gate_objective(model, batch, gates, projections=projections)
    (grad,) = torch.autograd.grad(loss.sum(), gates)
    np.testing.assert_allclose(grad_importance, grad.abs().numpy(), rtol=1e-10, atol=1e-14)
    eps = 1e-5
    finite = torch.zeros(3, 2, 4, dtype=torch.float64)
    with torch.no_grad():
        for layer in range(2):
            for head in range(4):
                up, down = torch.ones(3, 2, 4, dtype=torch.float64), torch.ones(3, 2, 4, dtype=torch.float64)
                up[:, layer, head] += eps
                down[:, layer, head] -= eps
                diff = grads.gate_objective(model, batch, up, projections=projections) - grads.gate_objective(
                    model, batch, down, projections=projections
                )
                finite[:, layer, head] = diff / (2 * eps)
    torch.testing.assert_close(grad, finite, rtol=1e-5, atol=1e-9)
    assert np.corrcoef(grad.abs().ravel(), finite.abs().ravel())[0, 1] > 0.999


def test_mlm_loss_is_used_when_the_model_has_an_mlm_head(tiny_config, tokenizer):
    torch.manual_seed(0)
    model = models.Encoder(tiny_config, mlm_head=True).eval()
    model.tokenizer = tokenizer
    model = without_heads(model, [(1, 1)])
    batches = [toy_batch(seed=0)]
    effects, measures = imp.ablation_effects(model, batches, methods=("zero",))
    assert measures[-1] == imp.MLM_MEASURE
    np.testing.assert_allclose(effects[:, 0, 1, 1, -1], 0.0, atol=1e-9)  # dead head: same masked-LM loss
    assert np.abs(effects[:, 0, 0, :, -1]).max() > 0
    grad, objective = grads.gradient_importance(model, batches)
    assert objective == "mlm" and (grad[:, 1, 1] == 0).all() and grad.mean() > 0
    with pytest.raises(ValueError, match="masked-LM head"):
        grads.gradient_importance(models.random_encoder(tiny_config), batches, objective="mlm")


def test_pruning_curve_starts_at_zero_and_dead_heads_cost_nothing(tiny):
    model = without_heads(tiny, [(0, 0), (1, 3)])
    order = [(0, 0), (1, 3), (0, 1), (1, 0)]
    curve = pruning.pruning_curve(model, [toy_batch()], order, counts=[0, 1, 2, 4])
    assert curve.shape == (3, 4, 2)
    np.testing.assert_allclose(curve[:, :3], 0.0, atol=1e-6)
    assert (curve[:, 3] > 1e-4).all()
    with pytest.raises(ValueError, match="counts"):
        pruning.pruning_curve(model, [toy_batch()], order, counts=[5])


def test_batched_pruning_curves_equal_one_full_forward_per_mask(tiny):
    """Many orders at once (shared masks deduplicated, restarts at the first touched layer, split into passes)
    give what a full forward with each mask alone gives."""
    batch = toy_batch()
    n_layers, n_heads = tiny.config.n_layers, tiny.config.n_heads
    rng = np.random.default_rng(0)
    orders = [[divmod(int(i), n_heads) for i in rng.permutation(n_layers * n_heads)] for _ in range(3)]
    orders.append([(n_layers - 1, h) for h in range(n_heads)] + [(0, h) for h in range(n_heads)])  # late layer first
    counts = [0, 1, 3, n_heads, n_layers * n_heads]
    keep = pruning.pruning_keeps(orders, counts, n_layers, n_heads)
    curves = pruning.pruning_curves(tiny, [batch], keep, copies_per_pass=2)
    assert curves.shape == (3, len(orders), len(counts), 2)
    with torch.no_grad():
        clean = tiny(batch.input_ids, batch.attention_mask, batch.token_type_ids)
        for o in range(len(orders)):
            for c in range(len(counts)):
                hidden = imp.forward_with_heads(tiny, batch, keep[o, c][None], method="zero")
                change = imp.output_change(clean, hidden[None], batch.attention_mask)
                expected = np.stack([change[m][0].numpy() for m in imp.OUTPUT_MEASURES], -1)
                np.testing.assert_allclose(curves[:, o, c], expected, atol=1e-5)
    np.testing.assert_array_equal(curves[:, :, 0], 0.0)  # nothing removed
    assert (curves[:, :, -1] > 1e-3).all()  # everything removed


def test_sentences_over_worker_processes_give_the_in_process_results_in_order(tiny):
    """Forked single-threaded workers: the same effects and curves as the in-process loop, sentences in order."""
    batches = [toy_batch(), toy_batch(n=2, seed=1)]
    keep = pruning.pruning_keeps([[(1, 2), (0, 1), (1, 0)], [(0, 3), (1, 1), (0, 0)]], [0, 1, 3], 2, 4)
    serial = pruning.pruning_curves(tiny, batches, keep)
    forked = pruning.pruning_curves(tiny, batches, keep, workers=2)
    np.testing.assert_allclose(forked, serial, atol=1e-6)
    assert (serial[:, :, -1] > 1e-3).all() and serial.shape == (5, 2, 3, 2)
    effects, _ = imp.ablation_effects(tiny, batches, workers=2)
    np.testing.assert_allclose(effects, imp.ablation_effects(tiny, batches)[0], atol=1e-6)
    assert parallel.map_sentences(lambda x: x * x, list(range(7)), workers=3) == [x * x for x in range(7)]


def _die_on_three(x: int) -> int:
    if x == 3:
        os._exit(1)  # what a worker killed for memory looks like to the parent: gone, no exception sent back
    return x


def test_a_worker_that_dies_stops_the_map_with_an_error_not_a_wait():
    with pytest.raises(RuntimeError, match="worker process of the job service died"):
        parallel.map_sentences(_die_on_three, list(range(6)), workers=2)
    assert parallel.map_sentences(_die_on_three, [0, 1, 2], workers=2) == [0, 1, 2]  # the next map is unharmed


def _sigterm_is_default(_: int) -> bool:
    return signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_workers_end_on_sigterm_whatever_handler_the_parent_installed():
    """A library may leave a SIGTERM handler that raises (torchrun's agent does); a worker inheriting it would
    survive being stopped and leave its pool waiting."""

    def raising(signum, frame):
        raise RuntimeError("the parent's handler")

    before = signal.signal(signal.SIGTERM, raising)
    try:
        assert parallel.map_sentences(_sigterm_is_default, [0, 1, 2], workers=2) == [True, True, True]
    finally:
        signal.signal(signal.SIGTERM, before)


def test_training_mode_is_refused(tiny_config):
    model = models.random_encoder(tiny_config).train()
    with pytest.raises(ValueError, match="eval"):
        imp.ablation_effects(model, [toy_batch()])


# ----------------------------------------------------------------------------- syntax through word pieces


def test_token_level_pointer_head_is_perfect_on_word_level_maps(tokenizer):
    corpus = corpus_mod.load_corpus("builtin", max_sentences=12)
    encoded = corpus_mod.encode(corpus, tokenizer, batch_size=12)
    batch = encoded.batches[0]
    assert (batch.word_ids.max(-1).values + 1 < batch.attention_mask.sum(-1) - 2).any(), "want split words"
    parts = []
    for b, si in enumerate(batch.sentence_index):
        sentence, wids = corpus[si], batch.word_ids[b]
        pos = len(wids)
        pattern = torch.zeros(1, 1, pos, pos)
        pattern[..., :, 0] = 1.0  # everything that is not a word piece rests on [CLS]
        for q in range(pos):
            w = int(wids[q])
            if w >= 0 and sentence.heads[w] > 0:
                first_piece = int(torch.nonzero(wids == sentence.heads[w] - 1)[0, 0])
                pattern[0, 0, q] = 0.0
                pattern[0, 0, q, first_piece] = 1.0
        maps = corpus_mod.word_attention(pattern, wids)
        parts.append(syn.sentence_arc_hits(maps, sentence.heads, sentence.deprels, si))
    table = syn.syntax_table(syn.ArcHits.concat(parts), n_boot=20).set_index("relation")
    assert (table["accuracy"].dropna() == 1.0).all() and (table["heldout_accuracy"].dropna() == 1.0).all()
    assert (table.drop(index=[syn.ALL_RELATIONS, syn.PER_RELATION])["direction"] == "dep->head").all()


def test_michel_importance_on_a_masked_lm_checkpoint_matches_autograd_on_transformers(tmp_path, tokenizer):
    """A tiny BertForMaskedLM saved here: the MLM path is used, and its scores equal Michel et al.'s formula
    computed directly on transformers' model (|<dL/dctx, ctx>| per head and real token, summed, / tokens)."""
    import transformers
    from helpers import save_tiny_bert

    hf = save_tiny_bert(tmp_path, cls=transformers.BertForMaskedLM)
    model = models.load(str(tmp_path)).eval()
    assert imp.has_mlm_head(model)
    batch = toy_batch(n=3, pos=9, seed=1)
    grad, objective = grads.gradient_importance(model, [batch], seed=3)
    assert objective == "mlm"
    sums, tokens = grads.michel_importance(model, [batch], seed=3)
    np.testing.assert_allclose(grad, sums / tokens[:, None, None])
    # the same masking (same seed), then autograd on transformers' context layers
    ids, labels = imp._mlm_inputs(model, batch, 0.15, torch.Generator().manual_seed(3))
    contexts = {}

    def keep(layer):
        def hook(module, args, output):
            ctx = output[0]
            ctx.retain_grad()
            contexts[layer] = ctx
        return hook

    cfg = hf.config
    handles = [hf.bert.encoder.layer[L].attention.self.register_forward_hook(keep(L))
               for L in range(cfg.num_hidden_layers)]  # fmt: skip
    logits = hf(input_ids=ids, attention_mask=batch.attention_mask, token_type_ids=batch.token_type_ids).logits
    for h in handles:
        h.remove()
    ce = torch.nn.functional.cross_entropy(logits.double().transpose(1, 2), labels, ignore_index=-100,
                                           reduction="none")  # fmt: skip
    loss = (ce.sum(-1) / (labels != -100).sum(-1)).sum()
    loss.backward()
    d_head = cfg.hidden_size // cfg.num_attention_heads
    real = batch.attention_mask.double()
    expected = np.zeros_like(sums)
    for layer, ctx in contexts.items():
        c = ctx.detach().double().reshape(*ctx.shape[:2], cfg.num_attention_heads, d_head)
        g = ctx.grad.double().reshape(*ctx.shape[:2], cfg.num_attention_heads, d_head)
        dot = torch.einsum("bphd,bphd->bph", g, c).abs()
        expected[:, layer] = (dot * real[:, :, None]).sum(1).numpy()
    np.testing.assert_allclose(sums, expected, rtol=2e-4, atol=1e-10)
    np.testing.assert_allclose(tokens, batch.attention_mask.sum(-1).numpy())
    normalised = grads.michel_normalise(sums.sum(0) / tokens.sum())
    np.testing.assert_allclose(np.linalg.norm(normalised, axis=-1), 1.0)
