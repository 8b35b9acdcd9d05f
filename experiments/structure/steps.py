"""Training passes of the structure experiment and their scores.

A pass trains every probe it names (`probes.structural_fit.ProbeSpec`: kind and rank) at every one of its sites in
one batched `fit_probes` call: the *residual* pass holds the trained model's residual sites with the full-rank
distance and depth probes and the distance rank sweep; the *random_weights* pass the random-weights model's residual
sites with the full-rank probes; the *sublayer* pass the trained model's sites inside the blocks (``resid_mid``;
also ``attn_out`` and ``mlp_out`` with ``Settings(sublayers=True)``) with the full-rank probes. Each pass is one
cached step (its projections and stopping record), so an interrupted run resumes after the passes it finished.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import pandas as pd
import torch
from bertscope.experiments.jobs import Job, JobService
from bertscope.experiments.structure import data, measures
from bertscope.probes.structural_fit import KINDS, ProbeSpec, Regimen, Sentences, fit_probes, project_all, squared


@dataclass(frozen=True)
class Pass:
    """One batched training pass: its ``name``, its sites as ``(encoder, site)`` pairs, and its probes."""

    name: str
    sites: tuple[tuple[str, str], ...]
    specs: tuple[ProbeSpec, ...]


def pass_words(p: Pass, vectors: dict[str, data.WordVectors], site_names: dict[str, list[str]],
               rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(words [n_pass_sites, n_words, d], lengths)`` of the sentences ``rows`` at the pass's sites."""
    parts, lengths = [], None
    for encoder in dict.fromkeys(e for e, _ in p.sites):
        idx = [site_names[encoder].index(s) for e, s in p.sites if e == encoder]
        words, lengths = vectors[encoder].take(rows, idx)
        parts.append(words)
    return np.concatenate(parts, axis=0), lengths


def train(jobs: JobService, settings: Any, ps: list[Pass], vectors: dict, site_names: dict, parts: dict,
          heads: list, *, seed: int, device: Any = "cpu") -> list[dict[str, np.ndarray]]:
    """Every pass's fitted probes, each pass one job of the run's job service (`experiments.jobs`), cached as
    it arrives: per probe ``i``: ``proj{i}`` ``[n_sites, d, k]``, ``best_epoch{i}``, ``n_epochs{i}``,
    ``early_stopped{i}``, ``dev_loss{i}`` (each ``[n_sites]``). ``seed`` seeds the regimen; ``device`` is where
    the probes train.

    With several workers, the passes not cached yet train side by side on forked one-thread processes
    (costliest first): a pass is a chain of small batched products that two threads speed up only 1.5-fold, so
    two passes at once on one thread each finish sooner. A probe's trajectory does not depend on the other
    probes or passes, and a pass gets the same thread count in a worker and in this process, so the results do
    not depend on which ran it."""
    regimen = Regimen(lr=settings.lr, batch_size=settings.batch_size, max_epochs=settings.max_epochs,
                      patience=settings.patience, seed=seed)

    def fit(p: Pass) -> dict[str, np.ndarray]:
        sets = {}
        for name in ("train", "dev"):
            words, lengths = pass_words(p, vectors, site_names, parts[name])
            sets[name] = Sentences(words, lengths, [heads[i] for i in parts[name]], device)
        out = {}
        for i, r in enumerate(fit_probes(sets["train"], sets["dev"], p.specs, regimen)):
            out.update({f"proj{i}": r.proj.cpu().numpy(), f"best_epoch{i}": r.best_epoch,
                        f"n_epochs{i}": r.n_epochs, f"early_stopped{i}": r.early_stopped,
                        f"dev_loss{i}": r.dev_loss})
        return out

    d = next(iter(vectors.values())).words.shape[-1]
    return jobs.run([Job("probes", pass_key(p), partial(fit, p), cost=_cost(p, d), kind="arrays") for p in ps],
                    "training passes")  # fmt: skip


def pass_key(p: Pass) -> dict[str, Any]:
    """The step key of a pass's cached probes: its name, sites and probe specs."""
    return dict(group=p.name, sites=[list(s) for s in p.sites], specs=[[s.kind, s.rank] for s in p.specs])


def _cost(p: Pass, d: int) -> int:
    """A pass's relative training cost: sites times the probes' widths (a full-rank probe is ``d`` wide)."""
    return len(p.sites) * sum(s.rank or d for s in p.specs)


def predictions(p: Pass, arrays: dict, test: Sentences, kind: str) -> tuple[list[int], list[np.ndarray]]:
    """The pass's probes of ``kind`` (their indices) and per test sentence their predictions stacked:
    ``[n_probes, n_sites, n, n]`` (distance) or ``[n_probes, n_sites, n]`` (depth)."""
    idx = [i for i, s in enumerate(p.specs) if s.kind == kind]
    per_probe = []
    with torch.no_grad():
        for i in idx:
            t = project_all(test, torch.as_tensor(arrays[f"proj{i}"]))
            per_probe.append([squared(x, kind).double().cpu().numpy() for x in t])
    return idx, [np.stack(ps) for ps in zip(*per_probe, strict=True)]


def score(p: Pass, arrays: dict, test: Sentences, heads: list, punct: list, weights: np.ndarray, ci: float,
          info: dict) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """Long rows (every probe, site and metric with intervals), the training record of every probe, and the
    per-sentence distance predictions of the full-rank probes (``{(encoder, site): [[n, n], ...]}``)."""
    rows, training, full = [], [], {}
    for kind in KINDS:
        idx, pred = predictions(p, arrays, test, kind)
        scored = measures.score(pred, heads, punct, kind, weights, ci)
        for a, i in enumerate(idx):
            rank = int(arrays[f"proj{i}"].shape[-1])
            for j, (encoder, site) in enumerate(p.sites):
                layer, component = data.site_layer(site)
                where = {**info, "encoder": encoder, "site": site, "layer": layer, "component": component,
                         "kind": kind, "rank": rank}
                for metric, sc in scored.items():
                    rows.append({**where, "metric": metric, "value": float(sc.value[a, j]),
                                 "ci_low": float(sc.ci_low[a, j]), "ci_high": float(sc.ci_high[a, j]),
                                 "n_sentences": len(pred)})
                training.append({"encoder": encoder, "kind": kind, "site": site, "layer": layer,
                                 "component": component, "rank": rank,
                                 "best_epoch": int(arrays[f"best_epoch{i}"][j]),
                                 "stopped_epoch": int(arrays[f"n_epochs{i}"][j]),
                                 "early_stopped": bool(arrays[f"early_stopped{i}"][j]),
                                 "dev_loss": float(arrays[f"dev_loss{i}"][j])})
                if kind == "distance" and p.specs[i].rank is None:
                    full[(encoder, site)] = [x[a, j] for x in pred]
    return pd.DataFrame(rows), pd.DataFrame(training), full


def score_splits(p: Pass, arrays: dict, vectors: dict[str, data.WordVectors], site_names: dict[str, list[str]],
                 scored: dict[str, tuple[list[int], np.ndarray]], heads: list, punct: list, ci: float, info: dict,
                 device: Any) -> dict[str, tuple]:
    """Pass ``p``'s trained ``arrays`` scored on each split of ``scored`` (name -> (local sentence indices,
    bootstrap weights)), in that order: name -> :func:`score`'s ``(rows, training, predictions)``."""
    out = {}
    for name, (idx, weights) in scored.items():
        words, lengths = pass_words(p, vectors, site_names, idx)
        out[name] = score(p, arrays, Sentences(words, lengths, None, device), [heads[i] for i in idx],
                          [punct[i] for i in idx], weights, ci, {**info, "split": name})
    return out
