"""What the mixing experiment reads from the model and the corpus (the template's ``data`` role), on plain values:
the per-layer pass over the activations stage, the costly pass (value zeroing, the input attributions and the
faithfulness rows on the first sentences) and the example maps; each returns the long per-sentence table the step
cache stores (``measures`` turns it into the results). Only ``experiment.run`` sees the run context."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import torch
from bertscope.experiments.activations import iter_activations
from bertscope.experiments.context import RunValues
from bertscope.experiments.mixing import measures
from bertscope.hooks.mixing import contributions, graph, needed_sites, per_layer_contributions

MAP_COLUMNS = ["sentence", "method", "layer", "query", "key", "query_token", "key_token", "value"]


def per_layer_pass(run: RunValues, corpus: Any, methods: tuple[str, ...], source: Any = None) -> pd.DataFrame:
    """Mixing ratio and group shares per sentence for ``methods`` and their rollouts over ``corpus``, from the
    hooked tensors of the activations stage (a forward, or the capture ``source``)."""
    model = run.model
    encoded = run.encode(corpus)
    sites = needed_sites(methods, range(model.config.n_layers))
    frames = []
    batches = iter_activations(model, corpus, sites, capture=source, encoded=encoded) if methods else ()
    for acts in run.progress(batches, "per-layer methods", total=len(encoded.batches)):
        frames += _layer_frames(model, inputs_of(acts.batch, model.device), acts.batch.sentence_index, methods,
                                cache=acts.tensors)[0]  # fmt: skip
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def costly_pass(run: RunValues, corpus: Any, settings: Any, targets: dict[str, str], rng: np.random.Generator,
                source: Any = None) -> pd.DataFrame:  # fmt: skip
    """On ``corpus`` (the first sentences): the costly per-layer methods' statistics and every method's
    faithfulness against ``loo``. The per-layer methods read the activations stage (a forward, or the capture
    ``source``; value zeroing re-runs each block from its ``hook_resid_pre``); the input attributions run the
    model on perturbed inputs. ``rng``: the seeded draw of the masked token (masked-LM targets)."""
    model = run.model
    encoded = run.encode(corpus)
    sites = needed_sites([*settings.methods, *settings.costly_methods], range(model.config.n_layers))
    last = model.config.n_layers - 1
    mlm = targets["loo"] == "mlm_loss"
    frames = []
    # Progress counts each batch's five stages (costly methods, loo, the other methods, grad x input, integrated
    # gradients): on long sequences one stage takes minutes, and the whole corpus is often one batch.
    bar = run.progress(None, "costly methods and faithfulness (5 stages per batch)", total=5 * len(encoded.batches))

    def sub_bar(desc: str, total: int) -> Any:  # finer progress inside a stage (value zeroing, loo)
        return run.progress(None, desc, total=total)

    for acts in iter_activations(model, corpus, sites, capture=source, encoded=encoded):
        batch, cache = acts.batch, acts.tensors
        inputs = inputs_of(batch, model.device)
        sentences = batch.sentence_index
        mask = inputs["attention_mask"]
        layer_frames, known = _layer_frames(model, inputs, sentences, settings.costly_methods, progress=sub_bar,
                                            cache=cache)  # fmt: skip
        bar.update(1)
        frames += layer_frames
        if mlm:  # one content token per sentence masked: the loss there is the target, its row is read out
            inputs, labels, rows = _mask_one(inputs, batch.special_mask.to(model.device), model.tokenizer, rng)
        else:
            labels, rows = None, mask / mask.sum(-1, keepdim=True)
        ref = contributions(model, inputs, "loo", target=targets["loo"], baseline=settings.baseline,
                            labels=labels, progress=sub_bar)[:, 0]  # fmt: skip
        bar.update(1)
        attributions = {"loo": ref}
        every = (*settings.methods, *settings.costly_methods)
        if mlm:  # masked input (no capture holds it): recompute, all methods from one pass
            known = per_layer_contributions(model, inputs, every)
        else:  # the costly methods are known already; the cheap ones are computed on these sentences
            known = {**per_layer_contributions(model, inputs, [m for m in every if m not in known], cache=cache),
                     **known}  # fmt: skip
        for m in every:
            c = known[m]
            attributions[m] = measures.read_out(c[:, last], rows)
            attributions[f"rollout:{m}"] = measures.read_out(graph.rollout(c, mask, m)[:, last], rows)
        bar.update(1)
        attributions["grad_x_input"] = contributions(model, inputs, "grad_x_input", target=targets["grad_x_input"],
                                                     labels=labels)[:, 0]  # fmt: skip
        bar.update(1)
        attributions["integrated_gradients"] = contributions(
            model, inputs, "integrated_gradients", target=targets["integrated_gradients"],
            baseline=settings.baseline, n_steps=settings.ig_steps, labels=labels,
        )[:, 0]  # fmt: skip
        bar.update(1)
        for m, a in attributions.items():
            frames.append(measures.spearman_rows(m, a, ref, mask, sentences, last))
    bar.close()
    return pd.concat(frames, ignore_index=True)


def example_maps(model: Any, corpus: Any, settings: Any) -> pd.DataFrame:
    """Last-layer contribution shares ``[query, key]`` of the first ``n_examples`` sentences of at most
    ``example_max_tokens`` tokens, per per-layer method and for ``rollout:attention`` / ``rollout:alti``."""
    from bertscope.experiments.corpus import Corpus, encode

    tok = model.tokenizer
    picked = [s for s in corpus if len(tok(list(s.words), is_split_into_words=True)["input_ids"])
              <= settings.example_max_tokens][: settings.n_examples]  # fmt: skip
    last = model.config.n_layers - 1
    frames = []
    for sentence in picked:
        batch = next(iter(encode(Corpus(corpus.name, corpus.source, [sentence]), tok,
                                 max_length=model.config.max_length)))  # the model's usable length (RoBERTa: 2 less)
        inputs = inputs_of(batch, model.device)
        tokens = tok.convert_ids_to_tokens(batch.input_ids[0].tolist())
        n = len(tokens)
        grids = {}
        every = (*settings.methods, *settings.costly_methods)
        for m, c in per_layer_contributions(model, inputs, every).items():
            grids[m] = measures.shares(c[0, last])
            if m in ("attention", "alti"):
                grids[f"rollout:{m}"] = graph.rollout(c, inputs["attention_mask"], m)[0, last]
        q, k = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
        for m, grid in grids.items():
            frames.append(pd.DataFrame({
                "sentence": sentence.id, "method": m, "layer": last, "query": q.ravel(), "key": k.ravel(),
                "query_token": [tokens[i] for i in q.ravel()], "key_token": [tokens[j] for j in k.ravel()],
                "value": grid.double().cpu().numpy().ravel(),
            }))  # fmt: skip
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=MAP_COLUMNS)


def inputs_of(batch: Any, device: torch.device) -> dict[str, torch.Tensor]:
    """A batch's model inputs on ``device``."""
    return {
        "input_ids": batch.input_ids.to(device),
        "attention_mask": batch.attention_mask.to(device),
        "token_type_ids": batch.token_type_ids.to(device),
    }


def _layer_frames(
    model: Any, inputs: dict, sentences: list[int], methods: tuple[str, ...], progress: Any = None,
    cache: Any = None,
) -> tuple[list[pd.DataFrame], dict[str, torch.Tensor]]:
    """Per-sentence rows of ``methods`` and their rollouts, and the contributions computed (reused by callers);
    ``progress``: the bar factory for the long loops inside, ``cache``: the hooked tensors the methods read
    (``per_layer_contributions``)."""
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    groups = measures.token_groups(ids, mask, model.tokenizer)
    frames = []
    wanted = [*methods, *(["ratio:residual_norm"] if "residual_norm" in methods else [])]
    computed = per_layer_contributions(model, inputs, wanted, progress=progress, cache=cache)
    ratio = computed.pop("ratio:residual_norm", None)
    for m in methods:
        c = computed[m]
        frames.append(measures.layer_rows(m, c, mask, groups, sentences, ratio=ratio if m == "residual_norm" else None))
        frames.append(measures.layer_rows(f"rollout:{m}", graph.rollout(c, mask, m), mask, groups, sentences))
    return frames, computed


def _mask_one(inputs: dict, special: torch.Tensor, tokenizer: Any, rng: np.random.Generator):
    """Replace one seeded content token per sentence by [MASK]: ``(inputs, labels [b, p], rows [b, p])`` with
    the original token as the label and a one-hot row at the masked position."""
    ids = inputs["input_ids"].clone()
    content = inputs["attention_mask"].bool() & ~special
    labels = torch.full_like(ids, -100)
    rows = torch.zeros(ids.shape, dtype=torch.float32, device=ids.device)
    for i in range(ids.shape[0]):
        where = torch.nonzero(content[i]).flatten().cpu().numpy()
        if len(where) == 0:
            raise ValueError("mlm faithfulness needs a content token in every sentence")
        j = int(rng.choice(where))
        labels[i, j], ids[i, j], rows[i, j] = ids[i, j], tokenizer.mask_token_id, 1.0
    return {**inputs, "input_ids": ids}, labels, rows
