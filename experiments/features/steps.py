"""The features experiment's stage (the template's ``steps`` role; old name ``compute``), end to end on plain
values: activations, dictionaries, labels, k-sparse probing and
the browser's tables, returned as one long frame (column ``table`` names each table) for the step cache."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from bertscope.experiments.features import data as S
from bertscope.experiments.features import labels as L
from bertscope.experiments.features import measures as M
from bertscope.experiments.features.data import (  # noqa: F401 (the names `steps` held before `data`)
    SELECTION,
    Collected,
    RunValues,
    Site,
    Splits,
    baseline_scores,
    collect,
    concept_splits,
    default_sites,
    encode,
    hooks_of,
    label_table,
    load_site_dictionaries,
    promoted_tokens,
    save_site_dictionaries,
    top_contexts,
    train_site_dictionaries,
)
from bertscope.experiments.registry import CannotRun

FAMILIES = tuple(L.FAMILIES)


def compute(run: S.RunValues, settings: Any, split: dict[str, list], sites: Sequence[S.Site],
            info: dict) -> pd.DataFrame:
    """Every table of the experiment (see ``experiment``'s docstring)."""
    model = run.model
    tokens = model.tokenizer.convert_ids_to_tokens(list(range(len(model.tokenizer))))
    hooks = S.hooks_of(sites)
    encoders = {"trained": model}
    if settings.reinit:
        from bertscope.models import random_encoder

        encoders["reinit"] = random_encoder(model.config, seed=run.seed, tokenizer=model.tokenizer,
                                            device=next(model.parameters()).device)
    data = {}
    for name, net in encoders.items():
        data[name] = {s: S.collect(net, split[s], hooks, max_length=run.max_length) for s in ("train", "dev", "test")}
        run.log(f"{name}: activations of {sum(len(c.rows) for c in data[name].values())} token rows")
    y = S.concept_splits(data["trained"], split, tokens, syntax=info["syntax"], min_positives=settings.min_positives)
    if not y.names:
        raise CannotRun(f"no concept has {settings.min_positives} positive and {settings.min_positives} negative "
                        "token rows in each of the train, dev and test sentences; use a larger --corpus or "
                        "--max-sentences, or a smaller --set features.min_positives")
    run.log(f"{len(y.names)} concepts")
    test_sentence = data["trained"]["test"].rows.sentence
    base = {"model": info["model"], "corpus": info["corpus"], "threshold": settings.threshold, "split": "test",
            "selection": S.SELECTION}
    rng = np.random.default_rng([run.seed, 7])
    shuffled = S.Splits({k: v[rng.permutation(len(v))] for k, v in y.y.items()}, y.names)
    results, baselines, probing, browser_latents, contexts = [], [], [], [], []
    trained: dict[str, Any] = {}
    for enc_name in encoders:
        dicts = _dictionaries(data[enc_name]["train"], sites, settings, run, enc_name, match=trained)
        if enc_name == "trained":
            trained = dicts
        for site in run.progress(sites, desc=f"labelling ({enc_name})"):
            d = data[enc_name]
            latents = {s: S.encode(dicts[site.name], d[s].acts[site.name]) for s in ("train", "dev", "test")}
            bases = {"latent": latents}
            if enc_name == "trained":
                bases["neuron"] = {s: d[s].acts[site.neurons] for s in ("train", "dev", "test")}
                mean, comps = M.pca_basis(d["train"].acts[site.name])
                bases["pca"] = {s: (d[s].acts[site.name] - mean) @ comps for s in ("train", "dev", "test")}
            density = M.densities(latents["train"])
            alive = np.flatnonzero(density > 0)
            where = {**base, "encoder": enc_name, "site": site.name, "kind": site.kind, "layer": site.layer,
                     "d_sae": int(dicts[site.name].config.d_sae),
                     "tokens_trained": int(dicts[site.name].config.metadata.get("tokens_trained") or 0)}
            best = {}
            for basis, a in bases.items():
                sparse = basis == "latent"
                units = alive if sparse else np.arange(a["dev"].shape[1])
                table, dev = S.label_table(a["dev"], a["test"], y, test_sentence, sparse=sparse, units=units,
                                           n_boot=settings.n_boot, seed=run.seed)
                table = table.assign(basis=basis, density=M.densities(a["train"])[units] if sparse else np.nan)
                best[basis] = S.baseline_scores(dev, a["test"], y, test_sentence, n_boot=settings.n_boot,
                                                seed=run.seed)
                baselines.append(best[basis].assign(**where, basis=basis))
                results.append((basis, table.assign(**where)))
            if enc_name == "trained":
                shuf, _ = S.label_table(latents["dev"], latents["test"], shuffled, test_sentence, sparse=True,
                                        units=alive, n_boot=0, seed=run.seed)
                results.append(("latent_shuffled_labels", shuf.assign(**where, basis="latent_shuffled_labels",
                                                                      density=density[alive])))
                browser_latents.append(_browser_latents(results, best, where, density, latents, dicts[site.name],
                                                        run, settings, tokens, site))
                contexts.append(_contexts(latents["test"], data["trained"]["test"].rows, settings.n_top, where))
            for basis, a in bases.items():
                probing += _probe(a, y, d, settings, run, {**where, "source": basis if enc_name == "trained"
                                                           else "reinit_latent"})
    table = _results(results, baselines, settings)
    summary = _summary(table, settings)
    probing_t = pd.DataFrame(probing)
    probing_summary = _probing_summary(probing_t, settings, run.seed)
    probing_t = probing_t.drop(columns="_part") if len(probing_t) else probing_t
    tok = _tokens(data["trained"]["test"].rows, tokens)
    parts = {"results": table, "summary": summary, "baselines": pd.concat(baselines, ignore_index=True),
             "sparse_probing": probing_t, "sparse_probing_summary": probing_summary,
             "browser_latents": pd.concat(browser_latents, ignore_index=True) if browser_latents else pd.DataFrame(),
             "browser_contexts": pd.concat(contexts, ignore_index=True) if contexts else pd.DataFrame(),
             "browser_tokens": tok}
    return pd.concat([t.assign(table=name) for name, t in parts.items()], ignore_index=True)


def control_recipe(settings: Any, dictionary: Any) -> tuple[Any, int]:
    """The settings and width a control dictionary is trained with so that it matches ``dictionary`` (a loaded
    one): its width (``d_sae``), ``k``, and its training budget as its metadata records it (``tokens_trained``;
    ``train_settings``' learning rate and batch size); what the metadata lacks stays ``settings``'."""
    import dataclasses

    cfg = dictionary.config
    meta = cfg.metadata or {}
    recorded = meta.get("train_settings") or {}
    changes = {"tokens": int(meta.get("tokens_trained") or settings.tokens)}
    if cfg.k:
        changes["k"] = int(cfg.k)
    for name in ("lr", "batch_size"):
        if recorded.get(name):
            changes[name] = type(getattr(settings, name))(recorded[name])
    return dataclasses.replace(settings, **changes), int(cfg.d_sae)


def _dictionaries(train: S.Collected, sites: Sequence[S.Site], settings: Any, run: S.RunValues,
                  enc_name: str, match: dict[str, Any] | None = None) -> dict[str, Any]:
    """Loaded from ``settings.dictionaries`` (trained model) when given, else trained on the train split.
    ``match``: the trained model's dictionaries per site; the re-initialised model's control is trained with
    each one's width and training budget (`control_recipe`), so a loaded 3,072-latent dictionary trained on 2M
    tokens gets a 3,072-latent control trained on 2M tokens."""
    if settings.dictionaries and enc_name == "trained":
        try:
            return S.load_site_dictionaries(run.model, settings.dictionaries, sites)
        except ValueError as e:  # `check` found none of this up front only if the folder changed since
            raise CannotRun(str(e)) from None
    from bertscope.experiments.dictionary import parse_width

    device = next(run.model.parameters()).device
    meta = {"model": getattr(run.model, "source", None), "weights_sha256": getattr(run.model, "weights_sha256", None),
            "max_length": run.max_length} if enc_name == "trained" else {"model": "re-initialised"}
    recipes: dict[str, tuple[Any, int]] = {}
    for s in sites:
        if match and s.name in match:
            recipes[s.name] = control_recipe(settings, match[s.name])
        else:
            recipes[s.name] = (settings, parse_width(settings.width, train.acts[s.name].shape[1]))
    out: dict[str, Any] = {}
    groups: dict[tuple, list[S.Site]] = {}
    for s in sites:  # sites sharing a recipe train together (one pass over the rows)
        st, _ = recipes[s.name]
        groups.setdefault((st.tokens, st.k, st.lr, st.batch_size), []).append(s)
    for group in groups.values():
        st = recipes[group[0].name][0]
        widths = {s.name: recipes[s.name][1] for s in group}
        run.log(f"training {len(group)} dictionaries on the {enc_name} model ({st.tokens} rows each, widths "
                f"{sorted(set(widths.values()))})")
        trained = S.train_site_dictionaries(train, group, st, seed=run.seed, widths=widths, device=device,
                                            metadata=meta)
        out.update({k: v.eval() for k, v in trained.items()})
    out = {s.name: out[s.name] for s in sites}
    if enc_name == "trained" and run.save_dictionaries is not None:
        S.save_site_dictionaries(out, run.save_dictionaries)
        run.log(f"dictionaries saved to {run.save_dictionaries}/<site>/ (bertscope explore --dictionary DIR "
                "--latent N colours tokens by one)")
    return out


def _results(results: list, baselines: list, settings: Any) -> pd.DataFrame:
    """One row per unit with its label and, for latents, the best neuron / PCA unit for the same label."""
    frames = [t for _, t in results]
    table = pd.concat(frames, ignore_index=True)
    table["labelled"] = table["test_mcc"] >= settings.threshold
    b = pd.concat(baselines, ignore_index=True)
    for basis in ("neuron", "pca"):
        ref = b[b["basis"] == basis][["site", "label", "test_mcc"]].rename(columns={"test_mcc": f"{basis}_test_mcc"})
        table = table.merge(ref, on=["site", "label"], how="left")
    table["beats_baselines"] = ((table["test_mcc"] > table["neuron_test_mcc"])
                                & (table["test_mcc"] > table["pca_test_mcc"]))
    return table


def _summary(r: pd.DataFrame, settings: Any) -> pd.DataFrame:
    """Per site, encoder and basis: units, labelled units per family, the share beating both baselines, and the
    width and training rows of the site's dictionary (``d_sae``, ``tokens_trained``: the control's must match)."""
    rows = []
    for (enc, site, basis), g in r.groupby(["encoder", "site", "basis"], sort=False):
        row = {"encoder": enc, "site": site, "kind": g["kind"].iloc[0], "layer": int(g["layer"].iloc[0]),
               "basis": basis, "n_units": len(g), "threshold": settings.threshold,
               "d_sae": int(g["d_sae"].iloc[0]), "tokens_trained": int(g["tokens_trained"].iloc[0])}
        for fam in FAMILIES:
            row[f"n_{fam}"] = int((g["labelled"] & (g["family"] == fam)).sum())
        row["n_labelled"] = int(g["labelled"].sum())
        row["share_beating_neuron_and_pca"] = float(g["beats_baselines"].mean())
        row["median_test_mcc"] = float(g["test_mcc"].median())
        rows.append(row)
    return pd.DataFrame(rows)


def _probe(a: dict, y: S.Splits, d: dict, settings: Any, run: S.RunValues, where: dict) -> list[dict]:
    rows = []
    for j, concept in enumerate(y.names):
        if L.variable_of(concept) not in settings.probe_variables:
            continue
        parts = M.sparse_probe(a["train"], y.y["train"][:, j], a["test"], y.y["test"][:, j],
                               d["test"].rows.sentence, settings.ks, seed=run.seed,
                               max_per_class=settings.max_per_class)
        for p in parts:
            rows.append({**where, "variable": L.variable_of(concept), "concept": concept, "k": p["k"],
                         "accuracy": p["accuracy"], "units": " ".join(map(str, p["units"])), "_part": p})
    return rows


def _probing_summary(p: pd.DataFrame, settings: Any, seed: int) -> pd.DataFrame:
    """Mean balanced test accuracy over each variable's concepts, per site, source and k, with a bootstrap over
    test sentences (all concepts resampled together)."""
    if p.empty:
        return p
    rows = []
    keys = ["encoder", "site", "kind", "layer", "source", "variable", "k"]
    for vals, g in p.groupby(keys, sort=False):
        value, low, high = M.mean_accuracy_interval(list(g["_part"]), n_boot=settings.n_boot, seed=seed,
                                                    ci=settings.ci)
        rows.append({**dict(zip(keys, vals, strict=True)), "n_concepts": len(g), "accuracy": value, "ci_low": low,
                     "ci_high": high, "model": g["model"].iloc[0], "corpus": g["corpus"].iloc[0], "split": "test"})
    return pd.DataFrame(rows)


def _browser_latents(results: list, best: dict, where: dict, density: np.ndarray, latents: dict, dictionary: Any,
                     run: S.RunValues, settings: Any, tokens: Sequence[str], site: S.Site) -> pd.DataFrame:
    """Per latent of a site: density, label, test MCC, activation histogram (test rows) and promoted tokens."""
    lab = [t for basis, t in results if basis == "latent" and t["site"].iloc[0] == site.name
           and t["encoder"].iloc[0] == "trained"][-1].set_index("unit") if results else pd.DataFrame()
    test = latents["test"]
    m = test.shape[1]
    hist = [" ".join(map(str, M.histogram(test[:, i]))) for i in range(m)]
    scale = np.array([test[:, i][test[:, i] > 0].mean() if (test[:, i] > 0).any() else 0.0 for i in range(m)])
    last = site.kind == "sae" and site.layer == run.model.config.n_layers - 1
    promoted = S.promoted_tokens(run.model, dictionary, scale, tokens, settings.n_promoted) if last else []
    out = pd.DataFrame({"site": site.name, "latent": np.arange(m), "density": density,
                        "max_value": test.max(0) if len(test) else 0.0, "histogram": hist,
                        "promoted": promoted if promoted else [""] * m})
    folder = (Path(settings.dictionaries) if settings.dictionaries else run.save_dictionaries)
    out["dictionary"] = str(folder / S.site_folder(site.name)) if folder is not None else ""
    out["label"] = out["latent"].map(lab["label"]) if len(lab) else None
    out["test_mcc"] = out["latent"].map(lab["test_mcc"]) if len(lab) else np.nan
    out["labelled"] = out["test_mcc"] >= settings.threshold
    return out.assign(encoder=where["encoder"], model=where["model"])


def _contexts(a: np.ndarray, rows: L.TokenRows, n_top: int, where: dict) -> pd.DataFrame:
    idx, vals = S.top_contexts(a, n_top)
    latent = np.repeat(np.arange(a.shape[1]), idx.shape[1])
    flat, v = idx.reshape(-1), vals.reshape(-1)
    keep = flat >= 0
    return pd.DataFrame({"site": where["site"], "latent": latent[keep],
                         "rank": np.tile(np.arange(idx.shape[1]), idx.shape[0])[keep],
                         "sentence": rows.sentence[flat[keep]], "position": rows.position[flat[keep]],
                         "value": v[keep].astype(np.float32)})


def _tokens(rows: L.TokenRows, tokens: Sequence[str]) -> pd.DataFrame:
    return pd.DataFrame({"sentence": rows.sentence, "position": rows.position,
                         "token": [tokens[i] for i in rows.token_id]})
