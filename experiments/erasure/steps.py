"""The erasure experiment's computation: clean activations and probes, then one hooked forward pass over the
evaluation sentences per (concept, erasure layer, method) and per equal-rank random control."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from bertscope.experiments.erasure import measures
from bertscope.experiments.erasure.data import Split, flat_sentence_index, site
from bertscope.probes.erasure import INLP, LeaceFitter, LinearEraser, MeanProjection, RandomSubspaceEraser
from bertscope.probes.structural import StructuralProbe

SELECTION = "none: fixed probe alpha and eraser settings; fitted on the training sentences only"


from bertscope.experiments.context import RunValues  # noqa: E402 - one class, built by `Context.run_values`


@dataclass
class Prepared:
    """Clean activations, labels and probes shared by every erasure."""

    encoded_eval: Any
    lengths_eval: list[int]
    clean_train: measures.Activations
    clean_eval: measures.Activations
    labels: dict[str, tuple[np.ndarray, np.ndarray, int]]
    types: tuple[np.ndarray, np.ndarray]
    probes: dict[tuple[str, int], Any]
    clean_hits: dict[tuple[str, int], np.ndarray]
    structural: Any
    heads: list
    punct: list
    site_cache: dict = dataclasses.field(default_factory=dict)

    def clean_structural_scores(self, clean_struct: list, boot: dict) -> dict:
        """UUAS and DSpr of the clean run at every layer (computed once)."""
        if "structural" not in self.site_cache:
            self.site_cache["structural"] = measures.structural_scores(clean_struct, self.heads, self.punct, seed=2,
                                                                       **boot)
        return self.site_cache["structural"]

    def site_clean(self, run: RunValues, settings: Any, concept: str, layer: int, at: str | None = None) -> tuple:
        """Clean per-sentence hits of the concept probe and of the control task at ``layer``'s residual site (or
        at the site ``at``, e.g. a sublayer output), and the control labels (train, eval); computed once each."""
        s = at or site(layer)
        if (concept, s) not in self.site_cache:
            xt, xe = self.clean_train.words[s], self.clean_eval.words[s]
            ytr, yev, _ = self.labels[concept]
            sent, n = flat_sentence_index(self.lengths_eval), len(self.lengths_eval)
            if at is None and (concept, layer) in self.clean_hits:
                task = self.clean_hits[concept, layer]
            else:
                pred = measures.fit_probe(xt, ytr, alpha=settings.alpha, seed=run.seed).predict(xe)
                task = measures.sentence_hits(pred, yev, sent, n)
            control = measures.control_task(*self.types, ytr, seed=run.seed)
            pred = measures.fit_probe(xt, control[0], alpha=settings.alpha, seed=run.seed).predict(xe)
            self.site_cache[concept, s] = (task, measures.sentence_hits(pred, control[1], sent, n), control)
        return self.site_cache[concept, s]


def layers_of(model: Any) -> list[int]:
    """The tables' residual indices 0..n_layers (0 = the embeddings, k = the stream after layer k-1,
    ``blocks.{k-1}.hook_resid_post``; `data.site`, `naming.residual_name`)."""
    return list(range(model.config.n_layers + 1))


def erase_layers(run: RunValues, settings: Any) -> list[int]:
    """The layers erased: `layers_to_erase` of the model (a log line names default layers it lacks)."""
    keep, dropped = layers_to_erase(settings, run.model.config.n_layers)
    if dropped:
        n = run.model.config.n_layers
        run.log(f"default erase_layers {dropped} left out: the model's residual indices are 0 (embeddings) .. {n} "
                f"(after layer {n - 1})")
    return keep


def layers_to_erase(settings: Any, n_layers: int) -> tuple[list[int], list[int]]:
    """(layers erased, default layers left out). Layers given with ``--set erasure.erase_layers`` are erased
    exactly, each one the model must have (``ValueError`` otherwise; the experiment's ``check`` refuses it before
    the run); the default layers a small model lacks are left out (layer 1 stays: every model has it)."""
    layers = list(dict.fromkeys(settings.erase_layers))
    outside = [k for k in layers if not 0 <= k <= n_layers]
    if outside and tuple(settings.erase_layers) != type(settings)().erase_layers:
        raise ValueError(f"erase layer {outside[0]} is outside 0..{n_layers} (0 = the embeddings, k = "
                         "after layer k-1)")
    return [k for k in layers if k not in outside], outside


def prepare(run: RunValues, settings: Any, split: Split, probed: tuple[str, ...]) -> Prepared:
    """Clean runs of both splits, concept labels, and the clean probes (word-level and structural) per layer."""
    model = run.model.eval()
    layers = layers_of(model)
    sites = [site(k) for k in layers]
    lt, le = [len(s) for s in split.train], [len(s) for s in split.eval]
    enc_t, enc_e = run.encode(split.train), run.encode(split.eval)
    subs = [at for _, _, at in sublayer_sites(model, settings)]  # probed only (the probing table)
    clean_t = measures.collect(model, enc_t, sites + subs, lt, corpus=split.train, capture=run.capture_train)
    clean_e = measures.collect(model, enc_e, sites + subs, le, mlm_every=settings.mlm_every, corpus=split.eval,
                               capture=run.capture_eval)
    labels = {}
    for c in dict.fromkeys(settings.concepts + probed):
        kw = {"max_position": settings.max_position, "max_depth": settings.max_depth}
        labels[c] = measures.label_ids(measures.word_labels(split.train, c, **kw),
                                       measures.word_labels(split.eval, c, **kw))
    types = (np.array([w.lower() for s in split.train for w in s.words]),
             np.array([w.lower() for s in split.eval for w in s.words]))
    sent_e = flat_sentence_index(le)
    probes, hits = {}, {}
    for k, s in zip(layers, sites, strict=True):
        fitted = measures.fit_probes(clean_t.words[s], [labels[c][0] for c in probed], alpha=settings.alpha)
        for c, probe in zip(probed, fitted, strict=True):
            probes[c, k] = probe
            hits[c, k] = measures.sentence_hits(probe.predict(clean_e.words[s]), labels[c][1], sent_e, len(le))
    rank = min(settings.structural_rank, model.config.d_model)
    structural = StructuralProbe("distance", rank=rank, max_epochs=settings.structural_epochs,
                                 seed=run.seed)
    structural.fit(_stack(clean_t.words, sites, lt), [list(s.heads) for s in split.train])
    punct = [np.array([u == "PUNCT" for u in s.upos]) for s in split.eval]
    return Prepared(enc_e, le, clean_t, clean_e, labels, types, probes, hits, structural,
                    [list(s.heads) for s in split.eval], punct)


def _stack(words: dict[str, np.ndarray], sites: list[str], lengths: list[int]) -> list[np.ndarray]:
    """Per sentence [n_sites, n_words, d] word vectors."""
    stacked = np.stack([words[s] for s in sites])  # [site, words, d]
    return list(np.split(stacked, np.cumsum(lengths)[:-1], axis=1))


def layers_of_sites(prep: Prepared) -> list[int]:
    """The layers the structural probe was trained at (all of them, embeddings included)."""
    return [k for k in range(len(prep.clean_eval.words)) if site(k) in prep.clean_eval.words]


def sublayer_sites(model: Any, settings: Any) -> list[tuple[int, str, str]]:
    """(layer, component, site) of the sublayer outputs the probing table also probes: block ``l``'s
    ``hook_{component}`` for each of ``settings.sublayers`` (``attn_out``, ``mlp_out``), numbered layer ``l + 1``
    (the layer whose residual output they feed)."""
    return [(b + 1, c, f"blocks.{b}.hook_{c}") for b in range(model.config.n_layers)
            for c in getattr(settings, "sublayers", ())]


def fit_erasers(run: RunValues, settings: Any, prep: Prepared, concept: str, layer: int) -> dict[str, LinearEraser]:
    """The methods' erasers of ``concept`` at ``layer``, fitted on the training sentences' pieces."""
    x = prep.clean_train.words[site(layer)].astype(np.float64)
    ytr, _, k = prep.labels[concept]
    z = ytr
    out: dict[str, LinearEraser] = {}
    for method in settings.methods:
        if method == "leace":
            out[method] = LeaceFitter.fit(x, z, n_classes=k).eraser
        elif method == "mean":
            out[method] = MeanProjection().fit(x, z)
        else:
            stream = np.random.default_rng([run.seed, 1, measures.CONCEPTS.index(concept), layer])  # INLP's rows
            rows = stream.permutation(len(x))[: settings.inlp_max_rows]
            out[method] = INLP(settings.inlp_classifier, settings.inlp_iterations, stop_at_majority=True,
                               seed=run.seed).fit(x[rows], z[rows])
    return out


def compute(run: RunValues, settings: Any, split: Split, probed: tuple[str, ...], info: dict) -> pd.DataFrame:
    """The long results table (see the experiment's ``COLUMNS``) and the probing table, in one frame with a
    ``table`` column ("results" / "probing")."""
    prep = prepare(run, settings, split, probed)
    probing = pd.DataFrame(probing_rows(run, settings, prep, probed, info)).assign(table="probing")
    model = run.model
    layers = layers_of(model)
    n_e = len(prep.lengths_eval)
    word_counts = np.bincount(flat_sentence_index(prep.lengths_eval), minlength=n_e).astype(np.float64)
    clean_struct = prep.structural.predict(_stack(prep.clean_eval.words, [site(k) for k in layers],
                                                  prep.lengths_eval))
    rows = _clean_rows(settings, prep, layers, probed, clean_struct, word_counts, info)
    jobs = [(c, layer) for c in settings.concepts for layer in erase_layers(run, settings)]
    for concept, layer in run.progress(jobs, "erase"):
        erasers = fit_erasers(run, settings, prep, concept, layer)
        mean = prep.clean_train.words[site(layer)].mean(0)
        controls = {e.rank: RandomSubspaceEraser(model.config.d_model, e.rank, seed=run.seed + e.rank, bias=mean)
                    for e in erasers.values()}
        runs = [(m, e) for m, e in erasers.items()] + [("random", e) for e in controls.values()]
        for method, eraser in runs:
            later = [k for k in layers if k >= layer]
            act = measures.collect(model, prep.encoded_eval, [site(k) for k in later], prep.lengths_eval,
                                   hooks=eraser.hook(model, site(layer)), mlm_every=settings.mlm_every)
            base = {**info, "concept": concept, "method": method, "erase_layer": layer, "rank": eraser.rank,
                    "selection": SELECTION}
            rows += _downstream_rows(settings, prep, act, later, probed, clean_struct, word_counts, base)
            rows += _site_rows(run, settings, prep, act, eraser, concept, layer, base)
    return pd.concat([pd.DataFrame(rows).assign(table="results"), probing], ignore_index=True)


def _clean_rows(settings: Any, prep: Prepared, layers: list[int], probed: tuple[str, ...], clean_struct: list,
                word_counts: np.ndarray, info: dict) -> list[dict]:
    base = {**info, "concept": "none", "method": "none", "erase_layer": 0, "rank": 0, "selection": SELECTION}
    boot = {"n_boot": settings.n_boot, "level": settings.ci}
    rows = []
    for c in probed:
        for k in layers:
            h = prep.clean_hits[c, k]
            r = measures.accuracy_with_change(h, h, word_counts, seed=1, **boot)
            rows.append({**base, "measure": "probe_accuracy", "target": c, "layer": k, **r})
    scores = prep.clean_structural_scores(clean_struct, boot)
    for name, (v, lo, hi) in scores.items():
        for i, k in enumerate(layers):
            rows.append({**base, "measure": name, "target": "tree", "layer": k, "value": float(v[i]),
                         "ci_low": float(lo[i]), "ci_high": float(hi[i]), "delta": 0.0})
    rows += _tree_baseline_rows(settings, prep, layers[-1], base)
    if prep.clean_eval.mlm is not None:
        hits, count = prep.clean_eval.mlm
        r = measures.accuracy_with_change(hits, hits, count, seed=4, **boot)
        rows.append({**base, "measure": "mlm_accuracy", "target": "token", "layer": layers[-1], **r})
    return rows


def _tree_baseline_rows(settings: Any, prep: Prepared, last: int, base: dict) -> list[dict]:
    """UUAS of trees that read no vectors, on the evaluation sentences (the structure experiment's baselines,
    `structure.measures.baselines`): ``uuas_random_tree`` (a uniformly random spanning tree, in expectation) and
    ``uuas_linear_chain`` (each word attached to the next); what an erased UUAS is read against."""
    from bertscope.experiments.structure.measures import baselines, resample_weights

    weights = resample_weights(len(prep.heads), settings.n_boot, [2, 0])
    rows = []
    for name, scored in baselines(prep.heads, prep.punct, weights, settings.ci).items():
        rows.append({**base, "measure": f"uuas_{name}", "target": "tree", "layer": last,
                     "value": float(scored.value), "ci_low": float(scored.ci_low), "ci_high": float(scored.ci_high),
                     "delta": 0.0})
    return rows


def _downstream_rows(settings: Any, prep: Prepared, act: measures.Activations, later: list[int],
                     probed: tuple[str, ...], clean_struct: list, word_counts: np.ndarray, base: dict) -> list[dict]:
    """(a) clean probes on the erased run, (b) structural probes, (c) embedding, (d) masked LM."""
    boot = {"n_boot": settings.n_boot, "level": settings.ci}
    sent = flat_sentence_index(prep.lengths_eval)
    rows = []
    for c in probed:
        for k in later:
            pred = prep.probes[c, k].predict(act.words[site(k)])
            h = measures.sentence_hits(pred, prep.labels[c][1], sent, len(prep.lengths_eval))
            r = measures.accuracy_with_change(h, prep.clean_hits[c, k], word_counts, seed=1, **boot)
            rows.append({**base, "measure": "probe_accuracy", "target": c, "layer": k, **r})
    all_layers = layers_of_sites(prep)
    words = {**prep.clean_eval.words, **act.words}  # layers before the erasure are the clean ones
    pred = prep.structural.predict(_stack(words, [site(k) for k in all_layers], prep.lengths_eval))
    later_idx = [all_layers.index(k) for k in later]
    scores = measures.structural_scores([p[later_idx] for p in pred], prep.heads, prep.punct, seed=2, **boot)
    clean = prep.clean_structural_scores(clean_struct, boot)
    for name, (v, lo, hi) in scores.items():
        for i, k in enumerate(later):
            rows.append({**base, "measure": name, "target": "tree", "layer": k, "value": float(v[i]),
                         "ci_low": float(lo[i]), "ci_high": float(hi[i]), "delta": float(v[i] - clean[name][0][k])})
    emb = measures.embedding_change(prep.clean_eval.embedding, act.embedding, seed=3, **boot)
    for name, (v, lo, hi) in emb.items():
        rows.append({**base, "measure": name, "target": "sentence", "layer": later[-1], "value": v, "ci_low": lo,
                     "ci_high": hi})
    if act.mlm is not None:
        hits, count = act.mlm
        r = measures.accuracy_with_change(hits, prep.clean_eval.mlm[0], count, seed=4, **boot)
        rows.append({**base, "measure": "mlm_accuracy", "target": "token", "layer": later[-1], **r})
    return rows


def _site_rows(run: RunValues, settings: Any, prep: Prepared, act: measures.Activations, eraser: LinearEraser,
               concept: str, layer: int, base: dict) -> list[dict]:
    """At the erased site: a fresh probe for the concept and a control task (word identity, Hewitt & Liang),
    each trained on the erased training words and scored on the erased evaluation words; the change is against
    the same probes on clean vectors (what the eraser removes besides the concept shows in the control)."""
    s = site(layer)
    boot = {"n_boot": settings.n_boot, "level": settings.ci}
    sent = flat_sentence_index(prep.lengths_eval)
    n = len(prep.lengths_eval)
    counts = np.bincount(sent, minlength=n).astype(np.float64)
    xt, xe = eraser(prep.clean_train.words[s].astype(np.float64)).astype(np.float32), act.words[s]
    ytr, yev, _ = prep.labels[concept]
    clean_task, clean_control, control = prep.site_clean(run, settings, concept, layer)
    task_probe, control_probe = measures.fit_probes(xt, [ytr, control[0]], alpha=settings.alpha)
    task = task_probe.predict(xe)
    r = measures.accuracy_with_change(measures.sentence_hits(task, yev, sent, n), clean_task, counts, seed=5, **boot)
    majority = float(np.mean(yev == np.bincount(ytr).argmax()))
    rows = [{**base, "measure": "site_probe_accuracy", "target": concept, "layer": layer, **r, "majority": majority}]
    pred = control_probe.predict(xe)
    r = measures.accuracy_with_change(measures.sentence_hits(pred, control[1], sent, n), clean_control, counts,
                                      seed=6, **boot)
    rows.append({**base, "measure": "site_control_accuracy", "target": "word_type", "layer": layer, **r})
    return rows


def probing_rows(run: RunValues, settings: Any, prep: Prepared, probed: tuple[str, ...], info: dict) -> list[dict]:
    """Word-level probes per layer on clean vectors (embeddings, every block output, and inside every block the
    attention and MLP outputs of ``settings.sublayers``; columns ``site``, ``component``): task accuracy, the
    Hewitt & Liang control task's and selectivity (task - control, paired interval over evaluation sentences),
    with the majority baseline (the training split's most frequent label, scored on the evaluation words)."""
    boot = {"n_boot": settings.n_boot, "level": settings.ci}
    sent = flat_sentence_index(prep.lengths_eval)
    counts = np.bincount(sent, minlength=len(prep.lengths_eval)).astype(np.float64)
    rows = []
    for c in probed:
        ytr, yev, _ = prep.labels[c]
        majority = float(np.mean(yev == np.bincount(ytr).argmax()))
        residual = [(k, "embed" if k == 0 else "resid_post", None) for k in layers_of(run.model)]
        for k, component, at in residual + sublayer_sites(run.model, settings):
            task, control, _ = prep.site_clean(run, settings, c, k, at)
            zero = np.zeros_like(task)
            t = measures.accuracy_with_change(task, zero, counts, seed=7, **boot)
            ctl = measures.accuracy_with_change(control, zero, counts, seed=7, **boot)
            sel = measures.accuracy_with_change(task, control, counts, seed=7, **boot)
            for label, r, value in (("task", t, t["value"]), ("control", ctl, ctl["value"]),
                                    ("selectivity", sel, sel["delta"])):
                lo, hi = (r["ci_low"], r["ci_high"]) if label != "selectivity" else (r["delta_ci_low"],
                                                                                      r["delta_ci_high"])
                rows.append({"model": info["model"], "train_corpus": info["train_corpus"],
                             "eval_corpus": info["eval_corpus"], "split": "eval", "target": c, "layer": k,
                             "site": at or site(k), "component": component,
                             "label": label, "value": value, "ci_low": lo, "ci_high": hi, "majority": majority,
                             "n_train": info["n_train"], "n_eval": info["n_eval"], "alpha": settings.alpha,
                             "selection": SELECTION})
    return rows


def summary(results: pd.DataFrame) -> pd.DataFrame:
    """Per concept, erasure layer and method: at the last layer, the change in the erased concept's probe
    accuracy (``same_delta``), the mean change over the other probed concepts (``other_delta``), the change in
    UUAS, the embedding cosine to clean; at the erased site the fresh probe's accuracy against the majority
    baseline and the control task's change; each with the random subspace of the same rank beside it
    (``random_*``)."""
    r = results[results["method"] != "none"]
    if r.empty:
        return pd.DataFrame()
    last = int(results["layer"].max())
    out = []
    for (concept, layer, method, rank), g in r.groupby(["concept", "erase_layer", "method", "rank"], sort=False):
        if method == "random":
            continue
        ctrl = r[(r["concept"] == concept) & (r["erase_layer"] == layer) & (r["method"] == "random")
                 & (r["rank"] == rank)]
        row = {"concept": concept, "erase_layer": layer, "method": method, "rank": rank, "layer": last}
        for prefix, frame in (("", g), ("random_", ctrl)):
            row.update({prefix + k: v for k, v in _summary_values(frame, concept, last).items()})
        out.append(row)
    return pd.DataFrame(out)


def _summary_values(g: pd.DataFrame, concept: str, last: int) -> dict[str, float]:
    def pick(measure: str, target: str | None = None, layer: int | None = None) -> pd.DataFrame:
        m = g[g["measure"] == measure]
        if target is not None:
            m = m[m["target"] == target]
        return m[m["layer"] == layer] if layer is not None else m

    out: dict[str, float] = {}
    same = pick("probe_accuracy", concept, last)
    for col in ("delta", "delta_ci_low", "delta_ci_high"):
        out[f"same_{col}"] = float(same[col].iloc[0]) if len(same) else np.nan
    others = g[(g["measure"] == "probe_accuracy") & (g["target"] != concept) & (g["layer"] == last)]
    out["other_delta"] = float(others["delta"].mean()) if len(others) else np.nan
    u = pick("uuas", "tree", last)
    for col in ("delta", "ci_low", "ci_high", "value"):
        out[f"uuas_{col}"] = float(u[col].iloc[0]) if len(u) else np.nan
    cos = pick("embedding_cosine")
    out["embedding_cosine"] = float(cos["value"].iloc[0]) if len(cos) else np.nan
    site = pick("site_probe_accuracy")
    out["site_accuracy"] = float(site["value"].iloc[0]) if len(site) else np.nan
    out["site_majority"] = float(site["majority"].iloc[0]) if len(site) and "majority" in site else np.nan
    ctl = pick("site_control_accuracy")
    out["site_control_delta"] = float(ctl["delta"].iloc[0]) if len(ctl) else np.nan
    return out
