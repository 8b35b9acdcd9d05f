"""What the features experiment reads and builds per site, on plain values (the template's ``data`` role; old name
``steps``, an alias of the stage module now): the sites, the activations of the train / dev / test sentences at
each, one dictionary per site (trained on the train sentences, or loaded and checked), the concept labels and the
per-site tables the stage (``steps``) assembles."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from bertscope.experiments.features import labels as L
from bertscope.experiments.features import measures as M
from bertscope.probes.dictionary.placement import site_folder

SELECTION = ("label, firing rule and best baseline unit chosen by MCC on dev sentences, scored on test sentences; "
             "k-sparse probes: units by mean difference and the probe fitted on train sentences, scored on test")


from bertscope.experiments.context import RunValues  # noqa: E402, F401 - one class, built by `Context.run_values`


@dataclass(frozen=True)
class Site:
    """One dictionary's place: ``name`` (the hook it reads), ``kind`` (``sae`` / ``transcoder``), ``site_out``
    (the hook a transcoder predicts), ``neurons`` (the hook whose coordinates are the neuron baseline) and
    ``layer`` (block index)."""

    name: str
    kind: str
    site_out: str | None
    neurons: str
    layer: int


def default_sites(n_layers: int, layers: Sequence[int] | None, transcoder_layer: int | None) -> list[Site]:
    """``hook_resid_post`` at a low, a middle and the last block (or ``layers``), and one MLP transcoder (block
    ``transcoder_layer``, default the middle one; -1: none) from ``hook_resid_mid`` to ``hook_mlp_out``."""
    chosen = list(dict.fromkeys(layers if layers else (0, n_layers // 2, n_layers - 1)))
    for layer in chosen:
        if not 0 <= layer < n_layers:
            raise ValueError(f"layer {layer} is outside 0..{n_layers - 1}")
    out = [Site(f"blocks.{lay}.hook_resid_post", "sae", None, f"blocks.{lay}.hook_resid_post", lay) for lay in chosen]
    t = n_layers // 2 if transcoder_layer is None else transcoder_layer
    if t >= 0:
        out.append(Site(f"blocks.{t}.hook_resid_mid", "transcoder", f"blocks.{t}.hook_mlp_out",
                        f"blocks.{t}.mlp.hook_post", t))
    return out


@dataclass
class Collected:
    """Activations of one split: ``acts`` hook -> ``[rows, d]`` float32 and the token rows."""

    acts: dict[str, np.ndarray]
    rows: L.TokenRows


@torch.no_grad()
def collect(model: Any, sentences: Sequence[Any], hooks: Sequence[str], *, max_length: int = 128,
            batch_size: int = 32) -> Collected:
    """Every token row (word pieces and special tokens) of ``sentences`` at ``hooks``."""
    from bertscope.experiments.activations import CLS, SEP, iter_activations

    acts: dict[str, list[np.ndarray]] = {h: [] for h in hooks}
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("sentence", "position", "token_id", "word", "cls", "sep")}
    for batch in iter_activations(model, list(sentences), list(hooks), batch_size=batch_size, max_length=max_length,
                                  include_special=True, device="cpu", dtype=torch.float32):
        for h in hooks:
            acts[h].append(batch.flat(h).numpy())
        keep = batch.keep()
        sent, pos = torch.nonzero(keep, as_tuple=True)
        cls = batch.token_class[keep].numpy()
        parts["sentence"].append(np.asarray(batch.batch.sentence_index)[sent.numpy()])
        parts["position"].append(pos.numpy())
        parts["token_id"].append(batch.batch.input_ids[sent, pos].numpy())
        parts["word"].append(batch.batch.word_ids[sent, pos].numpy())
        parts["cls"].append(cls == CLS)
        parts["sep"].append(cls == SEP)
    cat = {k: np.concatenate(v) for k, v in parts.items()}
    rows = L.TokenRows(cat["sentence"], cat["position"], cat["token_id"], cat["word"], cat["cls"], cat["sep"])
    return Collected({h: np.concatenate(v).astype(np.float32) for h, v in acts.items()}, rows)


def load_site_dictionaries(model: Any, folder: str | Path, sites: Sequence[Site]) -> dict[str, Any]:
    """``folder/<site>/`` for every site, loaded on the model's device and checked against the model and the site
    (``probes.dictionary.load_for_model``: a site the model has, its widths, and the weights it was trained on when
    it records them, ``metadata.weights_sha256``). ``ValueError`` (one line, naming the ``bertscope sae train``
    command that makes the missing one) otherwise."""
    from bertscope.probes.dictionary import is_dictionary, load_for_model

    root = Path(folder)
    if not root.is_dir():
        raise ValueError(f"--dictionaries {folder} is not a folder")
    out = {}
    for s in sites:
        sub = root / site_folder(s.name)
        if not is_dictionary(sub):
            how = (f"--site {s.name}" if s.kind == "sae"
                   else f"--kind transcoder --arch batchtopk --site {s.name} --site-out {s.site_out}")
            raise ValueError(f"--dictionaries {folder} has no dictionary for site {s.name} (no {sub.name}/cfg.json); "
                             f"train it with `bertscope sae train {how} --out {folder}`")
        try:
            d = load_for_model(sub, model)
        except ValueError as e:
            raise ValueError(f"--dictionaries {sub}: {e}") from None
        cfg = d.config
        fits = cfg.site == s.name and ((cfg.kind == "sae") if s.kind == "sae" else cfg.site_out == s.site_out)
        if not fits:
            made = cfg.site if cfg.kind == "sae" else f"{cfg.site} -> {cfg.site_out} ({cfg.kind})"
            want = s.name if s.kind == "sae" else f"{s.name} -> {s.site_out} (transcoder)"
            raise ValueError(f"--dictionaries {sub} is a dictionary of {made}; the features site needs {want}")
        out[s.name] = d
    return out


def save_site_dictionaries(dictionaries: dict[str, Any], folder: Path) -> None:
    """Each dictionary to ``folder/<site>/`` (SAELens's format, ``probes.dictionary.save_dictionary``)."""
    from bertscope.probes.dictionary import save_dictionary

    for site, d in dictionaries.items():
        save_dictionary(d, Path(folder) / site_folder(site))


def hooks_of(sites: Sequence[Site]) -> list[str]:
    """Every hook the sites read, predict, or use as neurons."""
    return list(dict.fromkeys(h for s in sites for h in (s.name, s.site_out, s.neurons) if h))


def train_site_dictionaries(train: Collected, sites: Sequence[Site], settings: Any, *, seed: int,
                            widths: dict[str, int], device: str = "cpu",
                            metadata: dict | None = None) -> dict[str, Any]:
    """One dictionary per site trained on the train split's non-special rows (`probes.dictionary`'s streaming
    trainer, SAELens conventions): TopK SAEs, BatchTopK transcoders; ``settings.tokens`` rows in all.
    ``metadata``: provenance saved with each (model, weights sha256)."""
    from bertscope.probes.dictionary import ActivationBatch, DictionaryConfig, TrainSettings, train_dictionaries

    special = train.rows.is_cls | train.rows.is_sep
    classes = np.where(special, "special", "word").astype(object)
    configs = {}
    for s in sites:
        d_in = train.acts[s.name].shape[1]
        configs[s.name] = DictionaryConfig(
            d_in=d_in, d_sae=widths[s.name], arch="topk" if s.kind == "sae" else "batchtopk", k=settings.k,
            kind=s.kind, d_out=train.acts[s.site_out].shape[1] if s.site_out else None, site=s.name,
            site_out=s.site_out, metadata={"experiment": "features", **(metadata or {})})
    hooks = list(dict.fromkeys([s.name for s in sites] + [s.site_out for s in sites if s.site_out]))
    n = len(classes)
    step = 4096
    source = [ActivationBatch({h: torch.from_numpy(train.acts[h][i:i + step]) for h in hooks}, classes[i:i + step],
                              train.rows.sentence[i:i + step]) for i in range(0, n, step)]
    # a batch never larger than the training tokens (a corpus that fits the buffer is read once, not cycled)
    batch = max(1, min(settings.batch_size, int((~special).sum())))
    ts = TrainSettings(tokens=max(settings.tokens, batch), batch_size=batch, buffer_rows=settings.buffer_rows,
                       lr=settings.lr, seed=seed, dead_tokens=max(batch, settings.tokens // 4), progress=False,
                       device=str(device))
    return train_dictionaries(source, configs, ts)


@torch.no_grad()
def encode(dictionary: Any, x: np.ndarray, chunk: int = 8192) -> np.ndarray:
    """Latent activations ``[rows, d_sae]`` (float32, on the CPU) of rows ``x`` (encoded on the dictionary's
    device)."""
    device = dictionary.W_enc.device
    out = [dictionary.encode(torch.from_numpy(x[i:i + chunk]).to(device)).float().cpu().numpy()
           for i in range(0, len(x), chunk)]
    return np.concatenate(out).astype(np.float32) if out else np.zeros((0, dictionary.config.d_sae), np.float32)


@dataclass
class Splits:
    """The three sentence splits' labels: concepts ``[rows, c]`` per split and their names."""

    y: dict[str, np.ndarray]
    names: list[str]


def concept_splits(data: dict[str, Collected], sentences: dict[str, list], tokens: Sequence[str], *,
                   syntax: bool, min_positives: int) -> Splits:
    """Concepts of every split, keeping those with at least ``min_positives`` positive and negative rows in each."""
    ys, names = {}, None
    for split, col in data.items():
        y, n = L.concept_matrix(col.rows, sentences[split], tokens, syntax=syntax)
        ys[split] = pd.DataFrame(y, columns=n)
        names = n if names is None else [c for c in names if c in n]
    keep = [c for c in names if all(min_positives <= ys[s][c].sum() <= len(ys[s]) - min_positives for s in ys)]
    return Splits({s: ys[s].reindex(columns=keep, fill_value=False).to_numpy(bool) for s in ys}, keep)


def label_table(a_dev: np.ndarray, a_test: np.ndarray, y: Splits, test_sentence: np.ndarray, *, sparse: bool,
                units: np.ndarray, n_boot: int, seed: int) -> tuple[pd.DataFrame, M.DevScores]:
    """Per unit (``units``: indices to label): the dev-chosen concept and rule, dev MCC, test MCC with interval."""
    dev = M.dev_scores(a_dev, y.y["dev"], sparse=sparse)
    u = units
    value, low, high = M.score_on_test(a_test, y.y["test"], u, dev.unit_concept[u], dev.unit_sign[u],
                                       dev.unit_threshold[u], test_sentence, n_boot=n_boot, seed=seed)
    concept = np.asarray(y.names, dtype=object)[dev.unit_concept[u]] if len(u) else np.zeros(0, dtype=object)
    table = pd.DataFrame({"unit": u.astype(int), "label": concept,
                          "family": [L.family_of(c) for c in concept],
                          "rule_sign": dev.unit_sign[u].astype(int), "rule_threshold": dev.unit_threshold[u],
                          "dev_mcc": dev.unit_mcc[u], "test_mcc": value, "ci_low": low, "ci_high": high})
    return table, dev


def baseline_scores(dev: M.DevScores, a_test: np.ndarray, y: Splits, test_sentence: np.ndarray, *, n_boot: int,
                    seed: int) -> pd.DataFrame:
    """Per concept: the best single unit of a baseline basis chosen on dev and its test MCC with interval."""
    c = np.arange(len(y.names))
    value, low, high = M.score_on_test(a_test, y.y["test"], dev.concept_unit, c, dev.concept_sign,
                                       dev.concept_threshold, test_sentence, n_boot=n_boot, seed=seed)
    return pd.DataFrame({"label": y.names, "unit": dev.concept_unit, "dev_mcc": dev.concept_mcc, "test_mcc": value,
                         "ci_low": low, "ci_high": high})


def top_contexts(a: np.ndarray, n_top: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of the ``n_top`` largest activations of every unit ``[m, n_top]`` and their values (0-padded rows
    are -1 where a unit fires on fewer rows)."""
    n = min(n_top, len(a))
    idx = np.argpartition(-a, n - 1, axis=0)[:n]  # [n, m]
    vals = np.take_along_axis(a, idx, 0)
    order = np.argsort(-vals, axis=0, kind="stable")
    idx, vals = np.take_along_axis(idx, order, 0).T, np.take_along_axis(vals, order, 0).T
    return np.where(vals > 0, idx, -1), np.where(vals > 0, vals, 0.0)


@torch.no_grad()
def promoted_tokens(model: Any, dictionary: Any, scale: np.ndarray, tokens: Sequence[str], n: int) -> list[str]:
    """Per latent, the ``n`` vocabulary items whose masked-LM logits rise most when the decoder direction
    (times the latent's mean non-zero activation ``scale``) is added to the decoder bias, through the model's
    own masked-LM head; ``[]`` when the model has none."""
    head = getattr(model, "mlm_head", None)
    if head is None:
        return []
    device = next(model.parameters()).device
    w = dictionary.W_dec.detach().float().to(device)
    base = dictionary.b_dec.detach().float().to(device)[None]
    out = []
    for i in range(0, w.shape[0], 256):
        x = base + w[i:i + 256] * torch.as_tensor(scale[i:i + 256], dtype=torch.float32, device=device)[:, None]
        delta = model.mlm_logits(x) - model.mlm_logits(base)
        top = delta.topk(n, dim=-1).indices.cpu().numpy()
        out += [" ".join(tokens[j] for j in row) for row in top]
    return out
