"""Sparse dictionaries on a model and a corpus: the one Python entry point (`train_sae`, `evaluate_sae`); the
``bertscope sae train`` / ``bertscope sae eval`` commands are in ``experiments.cli.sae_command``
(``docs/dictionaries.md``).

The mechanics (architectures, streaming trainer, metrics, SAELens format, splicing) are in
``bertscope.probes.dictionary`` and work on plain tensors; this module feeds them from the activations stage
(`experiments.activations.iter_activations`: a live forward over a corpus, or a capture folder) and writes
folders::

    OUT/<site>/cfg.json, sae_weights.safetensors     one dictionary per site (SAELens's format)
    OUT/controls/pca-<site>/, neurons-<site>/        the PCA and neuron-basis controls at the same L0
    OUT/checkpoint.pt                                while training (kept on Ctrl-C; a rerun resumes from it)
    OUT/training.json                                what was trained on, and how
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from bertscope.experiments.activations import iter_activations
from bertscope.experiments.io import write_json, write_table
from bertscope.probes.dictionary import (
    RECIPE,
    Dictionary,
    DictionaryConfig,
    E2ESettings,
    TrainSettings,
    architectures,
    evaluate_dictionary,
    finetune_e2e,
    latent_samples,
    neuron_topk_dictionary,
    pca_topk_dictionary,
    piece_classes,
    save_dictionary,
    train_dictionaries,
)
from bertscope.probes.dictionary.data import SPECIAL_CLASSES, as_batch, stage_classes
from bertscope.probes.dictionary.placement import (
    find_dictionaries,
    load_for_model,
    model_sha256,
    site_folder,
    site_width,
    transcoder_sites,
)

#: The activations stage's special classes (the trainer calls them ``special``; kept for old imports).
STAGE_SPECIAL = ("cls", "sep", "padding")
#: Training rows the PCA and neuron-basis controls are fitted on (at most).
CONTROL_ROWS = 65536
#: sentences ``train_sae`` reads for each latent's top contexts and quantile samples (``latent_contexts.parquet``)
CONTEXT_SENTENCES = 2000
#: the file of :func:`write_latent_samples` in a dictionary's folder
LATENT_CONTEXTS = "latent_contexts.parquet"


def dictionary_classes(acts: Any, pieces: np.ndarray) -> np.ndarray:
    """The dictionary's token class of every row of a stage batch ``acts`` (``[rows]``, in ``acts.rows()``'s
    order): :func:`bertscope.probes.dictionary.data.stage_classes`, the one derivation from the stage's vocabulary
    (a ``real`` token is its piece's class, ``word`` / ``continuation`` / ``punct``; ``cls`` and ``sep`` are
    ``special``; padding is never a row)."""
    return stage_classes(acts, pieces)


class CorpusActivations:
    """A re-iterable source of rows: each pass runs the activations stage over ``sentences`` (a live forward, or
    ``capture``) and yields plain rows (``bertscope.probes.dictionary.plain_rows``) of every real and special
    token (padding never), each with its class (:func:`dictionary_classes`). ``token_pieces``: the tokenizer's
    piece classes (computed once)."""

    def __init__(self, model: Any, sentences: Sequence[Any], sites: Sequence[str], *, capture: Any = None,
                 batch_size: int = 32, max_length: int = 128) -> None:
        self.model, self.sentences, self.sites = model, sentences, list(sites)
        self.capture, self.batch_size, self.max_length = capture, batch_size, max_length
        self._pieces: np.ndarray | None = None

    @property
    def token_pieces(self) -> np.ndarray:
        """``piece_classes`` of the model's tokenizer ``[vocab]``."""
        if self._pieces is None:
            self._pieces = piece_classes(self.model.tokenizer)
        return self._pieces

    def stage_batches(self) -> Iterator[Any]:
        """The activations stage's own batches (``experiments.activations.ActivationBatch``) of one pass."""
        return iter_activations(self.model, self.sentences, self.sites, capture=self.capture,
                                batch_size=self.batch_size, max_length=self.max_length, include_special=True,
                                device="cpu", dtype=torch.float32)

    def __iter__(self) -> Iterator[Any]:
        for acts in self.stage_batches():
            yield as_batch(acts, None, self.token_pieces)


#: the old name of ``piece_classes``
_piece_classes = piece_classes


def parse_width(width: str | int, d_in: int) -> int:
    """``--width``: a multiple of the site's width (``8x``) or a number of latents (``3072``)."""
    text = str(width).strip().lower()
    try:
        return int(round(float(text[:-1]) * d_in)) if text.endswith("x") else int(text)
    except ValueError:
        raise ValueError(f"--width {width!r}: give a multiple such as 8x or a number of latents") from None


def train_sae(model: Any, sentences: Sequence[Any], sites: Sequence[str], out: str | Path, *,
              arch: str = architectures.DEFAULT,
              k: int | None = RECIPE.k, width: str | int = RECIPE.width, kind: str = "sae", site_out: str | None = None,
              settings: TrainSettings | None = None, capture: Any = None, batch_size: int = 32,
              max_length: int = 128, controls: bool = True, e2e: E2ESettings | None = None,
              corpus: dict[str, Any] | None = None, contexts: int = CONTEXT_SENTENCES) -> dict[str, Dictionary]:
    """Train one dictionary per site on the activations of ``sentences`` (a corpus) and save each to
    ``out/<site>/`` (SAELens's format); returns site -> dictionary.

    ``kind="transcoder"`` / ``"skip_transcoder"`` trains on one site pair (``sites[0]`` read, ``site_out``
    predicted: e.g. ``blocks.3.hook_resid_mid`` -> ``blocks.3.hook_mlp_out`` in a post-LN BERT). ``capture``: a
    capture folder to read instead of running the model. ``arch``, ``k``, ``width`` and ``settings``
    (:class:`TrainSettings`: tokens, batch, lr, buffer, seed, device, dtype, ...) default to the one recipe,
    :data:`~bertscope.probes.dictionary.RECIPE`. ``controls``: also save the PCA and neuron-basis controls at the
    same L0, fitted on the first training buffer. A checkpoint ``out/checkpoint.pt`` is written every
    ``settings.checkpoint_tokens`` tokens and resumed from when present. ``e2e``: then fine-tune each SAE end to
    end against the model's own objective on the same training ``sentences`` (never held-out ones;
    :func:`~bertscope.probes.dictionary.finetune_e2e`, Braun et al. 2024) before saving; its config records how
    (``metadata["e2e"]``). The controls stay fitted on the training rows. Every saved config records the model
    (``metadata.model``, ``metadata.weights_sha256``: readers refuse a dictionary of another model) and
    the training ``corpus`` when given (its name and sha256: ``sae eval`` says when it scores on it).
    ``contexts``: each dictionary's top activating contexts and quantile samples over the first ``contexts``
    training sentences, ``out/<site>/latent_contexts.parquet`` (:func:`write_latent_samples`; 0: none).
    """
    settings = settings or TrainSettings()
    out = Path(out)
    sites = list(sites)
    configs = {}
    for site in sites:
        d_in = site_width(model, site)
        d_out = site_width(model, site_out) if site_out else None
        cfg = DictionaryConfig(d_in=d_in, d_sae=parse_width(width, d_in), arch=arch,
                               k=k if architectures.get(arch).uses_k else None, kind=kind,
                               d_out=d_out if kind != "sae" else None, site=site,
                               site_out=site_out if kind != "sae" else None,
                               metadata=_provenance(model, max_length, corpus))
        configs[site] = cfg
    source = CorpusActivations(model, sentences, sites + ([site_out] if site_out else []), capture=capture,
                               batch_size=batch_size, max_length=max_length)
    dicts = train_dictionaries(source, configs, settings, checkpoint_dir=out)
    if e2e is not None and e2e.steps > 0:
        if kind != "sae":
            raise ValueError("end-to-end fine-tuning is for SAEs (kind='sae')")
        dicts = {site: finetune_e2e(model, d, sentences, e2e, rows=CorpusActivations(
            model, list(sentences)[: e2e.variance_sentences], [site], capture=capture, batch_size=batch_size,
            max_length=max_length).stage_batches()) for site, d in dicts.items()}
    for site, d in dicts.items():
        save_dictionary(d, out / site_folder(site))
        if contexts:
            write_latent_samples(model, d, list(sentences)[:contexts], out / site_folder(site), capture=capture,
                                 batch_size=batch_size, max_length=max_length, excluded=settings.excluded)
    if controls and kind == "sae":
        _save_controls(source, dicts, settings, out, _provenance(model, max_length, corpus))
    write_json(out / "training.json", {"sites": sites, "site_out": site_out, "arch": arch, "k": k, "kind": kind,
                                       "width": str(width), "sentences": len(sentences),
                                       "settings": {k_: v for k_, v in settings.__dict__.items()},
                                       "e2e": None if e2e is None else dict(e2e.__dict__)})
    (out / "checkpoint.pt").unlink(missing_ok=True)
    return dicts


def write_latent_samples(model: Any, dictionary: Dictionary, sentences: Sequence[Any], folder: str | Path, *,
                         capture: Any = None, batch_size: int = 32, max_length: int = 128,
                         excluded: Sequence[str] = SPECIAL_CLASSES, n_top: int = 8, n_bins: int = 4,
                         per_bin: int = 4, window: int = 8) -> Path:
    """``folder/latent_contexts.parquet``: per latent, its ``n_top`` top activating tokens and ``per_bin`` samples
    from each of ``n_bins`` equal intervals of its range (:func:`~bertscope.probes.dictionary.latent_samples`),
    over the rows of ``sentences`` at the dictionary's site (token classes in ``excluded`` left out, as in
    training). Columns: those of ``latent_samples`` plus ``sentence_index``, ``position``, ``token`` and
    ``context`` (the ``window`` word pieces either side, the token in ``[[ ]]``); ``bertscope explore "TEXT"
    --dictionary DIR --latent N`` shows a latent on any text. Written atomically; returns the path."""
    site = dictionary.config.site
    source = CorpusActivations(model, sentences, [site], capture=capture, batch_size=batch_size,
                               max_length=max_length)
    tok = model.tokenizer
    pieces: dict[int, list[str]] = {}

    def rows() -> Iterator[tuple[torch.Tensor, pd.DataFrame]]:
        for acts in source.stage_batches():
            meta = acts.rows()
            classes = stage_classes(acts, source.token_pieces)
            for s_idx, g in meta.groupby("sentence_index", sort=False):
                pieces[int(s_idx)] = tok.convert_ids_to_tokens(g["token_id"].tolist())
            keep = ~np.isin(classes, list(excluded))
            yield (acts.flat(site)[torch.from_numpy(keep)],
                   meta.loc[keep, ["sentence_index", "position"]].reset_index(drop=True))

    table = latent_samples(dictionary, rows(), n_top=n_top, n_bins=n_bins, per_bin=per_bin)
    tokens, contexts = [], []
    for s_idx, pos in zip(table.get("sentence_index", []), table.get("position", []), strict=True):
        toks = pieces[int(s_idx)]
        tokens.append(toks[pos])
        around = toks[max(0, pos - window):pos] + [f"[[{toks[pos]}]]"] + toks[pos + 1:pos + 1 + window]
        contexts.append(" ".join(around))
    table = table.assign(token=tokens, context=contexts)
    return write_table(table, Path(folder) / LATENT_CONTEXTS, formats=("parquet",))[0]


def _provenance(model: Any, max_length: int, corpus: dict[str, Any] | None) -> dict[str, Any]:
    """What a saved dictionary records of where it comes from: the model (source, weights sha256), the
    ``--max-length`` and the training corpus (``corpus``: its name and sha256, as the manifest describes it)."""
    meta = {"model": getattr(model, "source", None), "max_length": max_length,
            "weights_sha256": model_sha256(model)}
    if corpus:
        meta["corpus"] = {k: corpus.get(k) for k in ("name", "sha256", "n_sentences")}
    return meta


@torch.no_grad()
def _save_controls(source: CorpusActivations, dicts: dict[str, Dictionary], settings: TrainSettings,
                   out: Path, provenance: dict[str, Any] | None = None) -> None:
    """PCA and neuron-basis controls at each dictionary's L0 on the first ``min(buffer_rows, 65536)`` training
    rows."""
    rows: dict[str, list[torch.Tensor]] = {s: [] for s in dicts}
    n = 0
    for batch in source:
        keep = torch.from_numpy(~np.isin(batch.classes(), list(settings.excluded)))
        for s in dicts:
            rows[s].append(batch.acts[s][keep])
        n += int(keep.sum())
        if n >= min(settings.buffer_rows, CONTROL_ROWS):
            break
    for s, d in dicts.items():
        x = torch.cat(rows[s])[: min(settings.buffer_rows, CONTROL_ROWS)]
        l0 = d.config.k if d.spec.uses_k else int(round(float((d.encode(x) > 0).sum(-1).float().mean())))
        l0 = max(1, min(l0, x.shape[1]))
        for name, make in (("pca", pca_topk_dictionary), ("neurons", neuron_topk_dictionary)):
            control = make(x, l0, site=s)
            control.config = replace(control.config, metadata={**control.config.metadata, **(provenance or {})})
            save_dictionary(control, out / "controls" / f"{name}-{site_folder(s)}")


def evaluate_sae(model: Any, folder: str | Path, texts: Sequence[Any], *, objective: str = "auto",
                 batch_size: int = 32, include_special: bool = False, max_length: int = 128) -> pd.DataFrame:
    """Evaluate every dictionary under ``folder`` (see :func:`find_dictionaries`) on held-out ``texts`` (strings
    or corpus sentences): the long table of :func:`~bertscope.probes.dictionary.evaluate_dictionary` with a
    ``dictionary`` column. Each dictionary is checked against the model first (``ValueError``, one line: another
    model's, a site the model lacks); its rows are read through the activations stage (:class:`CorpusActivations`)."""
    parts = []
    strings = [str(getattr(t, "text", t)) for t in texts]
    for name, path in find_dictionaries(folder).items():
        d = load_for_model(path, model)
        cfg = d.config
        sites = [cfg.site] + ([cfg.site_out] if cfg.site_out and cfg.site_out != cfg.site else [])
        rows = CorpusActivations(model, list(texts), sites, batch_size=batch_size,
                                 max_length=max_length).stage_batches()
        table = evaluate_dictionary(model, d, strings, batch_size=batch_size, include_special=include_special,
                                    objective=objective, batches=rows)
        table.insert(0, "dictionary", name)
        table.insert(1, "site", cfg.site)
        table.insert(2, "arch", cfg.arch)
        parts.append(table)
    return pd.concat(parts, ignore_index=True)


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """One row per dictionary: L0, explained variance, dead fraction (all tokens), and the spliced objective's
    headline numbers (the dictionary condition, fraction recovered against zero and mean ablation)."""
    rec = table[(table.section == "reconstruction") & (table.token_class == "all")]
    wide = rec.pivot_table(index="dictionary", columns="metric", values="value", aggfunc="first")
    cols = [c for c in ("l0", "explained_variance", "mse", "cosine", "dead_fraction", "dense_fraction",
                        "relative_reconstruction_bias") if c in wide]
    out = wide[cols].copy()
    fid = table[table.section == "fidelity"]
    for metric in ("embedding_cosine", "similarity_spearman", "ce", "kl", "accuracy"):
        sel = fid[(fid.condition == "dictionary") & (fid.metric == metric)]
        if len(sel):
            out[f"spliced_{metric}"] = sel.set_index("dictionary")["value"]
    for abl in ("zero", "mean"):
        sel = fid[(fid.condition == f"{abl}_ablation") & (fid.metric == "fraction_recovered")]
        if len(sel):
            out[f"recovered_vs_{abl}"] = sel.set_index("dictionary")["value"]
    return out.reset_index()


def write_evaluation(table: pd.DataFrame, out: str | Path) -> dict[str, list[Path]]:
    """``out/evaluation.parquet|csv`` (the long table) and ``out/summary.csv`` (one row per dictionary), each
    written atomically."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return {"evaluation": write_table(table, out / "evaluation"),
            "summary": write_table(summary(table), out / "summary", formats=("csv",))}


def corpus_tokens(model: Any, sentences: Sequence[Any], max_length: int) -> int:
    """Word pieces of ``sentences`` that training would use (no special tokens), from the tokenizer alone."""
    tok = model.tokenizer
    total = 0
    for s in sentences:
        words = list(getattr(s, "words", None) or str(s).split())
        ids = tok(words, is_split_into_words=True, add_special_tokens=False)["input_ids"]
        total += min(len(ids), max_length - 2)
    return total


def describe(dicts: dict[str, Dictionary]) -> str:
    """One line per trained dictionary for the CLI."""
    lines = []
    for site, d in dicts.items():
        m = d.config.metadata
        epochs = m.get("epochs")
        over = (f"{epochs:.2f} epochs over the corpus's {m.get('unique_tokens', 0):,} tokens" if epochs is not None
                else f"{m.get('epochs_read', 0)} passes over the corpus")
        lines.append(f"{site}: {d.config.arch} {d.config.kind}, {d.config.d_sae} latents, "
                     f"{m.get('tokens_trained', 0):,} tokens ({over})")
    return "\n".join(lines)


__all__ = [
    "CONTEXT_SENTENCES",
    "LATENT_CONTEXTS",
    "CorpusActivations",
    "write_latent_samples",
    "dictionary_classes",
    "corpus_tokens",
    "evaluate_sae",
    "find_dictionaries",
    "parse_width",
    "site_width",
    "summary",
    "train_sae",
    "transcoder_sites",
    "write_evaluation",
]


