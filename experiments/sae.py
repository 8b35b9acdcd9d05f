"""Sparse dictionaries on a model and a corpus: the one Python entry point (`train_sae`, `evaluate_sae`) and the
``bertscope sae train`` / ``bertscope sae eval`` commands (``docs/dictionaries.md``).

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
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from bertscope.experiments.activations import TOKEN_CLASSES, iter_activations
from bertscope.experiments.io import write_json, write_table
from bertscope.probes.dictionary import (
    ActivationBatch,
    Dictionary,
    DictionaryConfig,
    DictionaryFormatError,
    E2ESettings,
    TrainSettings,
    evaluate_dictionary,
    finetune_e2e,
    is_dictionary,
    load_dictionary,
    neuron_topk_dictionary,
    pca_topk_dictionary,
    save_dictionary,
    train_dictionaries,
)

#: The activations stage's special classes as the trainer names them (all left out by default).
STAGE_SPECIAL = ("cls", "sep", "padding")
#: Training rows the PCA and neuron-basis controls are fitted on (at most).
CONTROL_ROWS = 65536


class CorpusActivations:
    """A re-iterable source of training rows: each pass runs the activations stage over ``sentences`` (a live
    forward, or ``capture``) and yields :class:`~bertscope.probes.dictionary.ActivationBatch` rows of every real
    and special token (padding never), each with its class: ``word``, ``continuation``, ``punct`` for word pieces
    (from the tokenizer) and the stage's ``cls`` / ``sep`` for special tokens."""

    def __init__(self, model: Any, sentences: Sequence[Any], sites: Sequence[str], *, capture: Any = None,
                 batch_size: int = 32, max_length: int = 128) -> None:
        self.model, self.sentences, self.sites = model, sentences, list(sites)
        self.capture, self.batch_size, self.max_length = capture, batch_size, max_length

    def __iter__(self) -> Iterator[ActivationBatch]:
        pieces = _piece_classes(self.model.tokenizer)
        for acts in iter_activations(self.model, self.sentences, self.sites, capture=self.capture,
                                     batch_size=self.batch_size, max_length=self.max_length, include_special=True,
                                     device="cpu", dtype=torch.float32):
            keep = acts.keep()
            stage = acts.token_class[keep].numpy()
            ids = acts.batch.input_ids[keep].numpy()
            classes = np.where(stage == TOKEN_CLASSES.index("real"), pieces[ids], np.asarray(TOKEN_CLASSES)[stage])
            yield ActivationBatch({s: acts.flat(s) for s in self.sites}, classes.astype(object),
                                  np.asarray(acts.batch.sentence_index)[torch.nonzero(keep)[:, 0].numpy()])


def _piece_classes(tokenizer: Any) -> np.ndarray:
    """``word`` / ``continuation`` / ``punct`` for every vocabulary id."""
    import string

    vocab = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    punct = set(string.punctuation)
    out = np.empty(len(vocab), dtype=object)
    for i, piece in enumerate(vocab):
        bare = (piece or "").lstrip("Ġ▁")
        out[i] = "continuation" if piece and piece.startswith("##") else (
            "punct" if bare and all(ch in punct for ch in bare) else "word")
    return out


def parse_width(width: str | int, d_in: int) -> int:
    """``--width``: a multiple of the site's width (``8x``) or a number of latents (``3072``)."""
    text = str(width).strip().lower()
    try:
        return int(round(float(text[:-1]) * d_in)) if text.endswith("x") else int(text)
    except ValueError:
        raise ValueError(f"--width {width!r}: give a multiple such as 8x or a number of latents") from None


def site_width(model: Any, site: str) -> int:
    """The width of a token site's rows (``d_model`` or ``d_mlp``)."""
    if site not in model.hook_dict:
        raise KeyError(f"the model has no site {site!r}; `bertscope info` lists every hook name")
    if site.endswith(("mlp.hook_pre", "mlp.hook_post")):
        return int(model.config.d_mlp)
    if site.endswith(("attn.hook_pattern", "attn.hook_scores", "hook_scale")) or ".attn.hook_" in site:
        raise KeyError(f"site {site!r} is not a [batch, pos, d] site; dictionaries read residual, attention-output "
                       "or MLP sites")
    return int(model.config.d_model)


def train_sae(model: Any, sentences: Sequence[Any], sites: Sequence[str], out: str | Path, *, arch: str = "topk",
              k: int | None = 32, width: str | int = "8x", kind: str = "sae", site_out: str | None = None,
              settings: TrainSettings | None = None, capture: Any = None, batch_size: int = 32,
              max_length: int = 128, controls: bool = True, e2e: E2ESettings | None = None) -> dict[str, Dictionary]:
    """Train one dictionary per site on the activations of ``sentences`` (a corpus) and save each to
    ``out/<site>/`` (SAELens's format); returns site -> dictionary.

    ``kind="transcoder"`` / ``"skip_transcoder"`` trains on one site pair (``sites[0]`` read, ``site_out``
    predicted: e.g. ``blocks.3.hook_resid_mid`` -> ``blocks.3.hook_mlp_out`` in a post-LN BERT). ``capture``: a
    capture folder to read instead of running the model. ``settings`` (:class:`TrainSettings`): tokens, batch,
    buffer, seed, device, dtype, ... ``controls``: also save the PCA and neuron-basis controls at the same L0,
    fitted on the first training buffer. A checkpoint ``out/checkpoint.pt`` is written every
    ``settings.checkpoint_tokens`` tokens and resumed from when present. ``e2e``: then fine-tune each SAE end to
    end against the model's own objective on the same training ``sentences`` (never held-out ones;
    :func:`~bertscope.probes.dictionary.finetune_e2e`, Braun et al. 2024) before saving; its config records how
    (``metadata["e2e"]``). The controls stay fitted on the training rows.
    """
    settings = settings or TrainSettings()
    out = Path(out)
    sites = list(sites)
    configs = {}
    for site in sites:
        d_in = site_width(model, site)
        d_out = site_width(model, site_out) if site_out else None
        cfg = DictionaryConfig(d_in=d_in, d_sae=parse_width(width, d_in), arch=arch,
                               k=k if arch in ("topk", "batchtopk") else None, kind=kind,
                               d_out=d_out if kind != "sae" else None, site=site,
                               site_out=site_out if kind != "sae" else None,
                               metadata={"model": getattr(model, "source", None), "max_length": max_length})
        configs[site] = cfg
    source = CorpusActivations(model, sentences, sites + ([site_out] if site_out else []), capture=capture,
                               batch_size=batch_size, max_length=max_length)
    if settings.exclude_classes == TrainSettings().exclude_classes:
        settings = TrainSettings(**{**settings.__dict__, "exclude_classes": (*settings.exclude_classes,
                                                                              *STAGE_SPECIAL)})
    dicts = train_dictionaries(source, configs, settings, checkpoint_dir=out)
    if e2e is not None and e2e.steps > 0:
        if kind != "sae":
            raise ValueError("end-to-end fine-tuning is for SAEs (kind='sae')")
        dicts = {site: finetune_e2e(model, d, sentences, e2e) for site, d in dicts.items()}
    for site, d in dicts.items():
        save_dictionary(d, out / _folder(site))
    if controls and kind == "sae":
        _save_controls(source, dicts, settings, out)
    write_json(out / "training.json", {"sites": sites, "site_out": site_out, "arch": arch, "k": k, "kind": kind,
                                       "width": str(width), "sentences": len(sentences),
                                       "settings": {k_: v for k_, v in settings.__dict__.items()},
                                       "e2e": None if e2e is None else dict(e2e.__dict__)})
    (out / "checkpoint.pt").unlink(missing_ok=True)
    return dicts


def _folder(site: str) -> str:
    return site.replace("/", "_")


@torch.no_grad()
def _save_controls(source: CorpusActivations, dicts: dict[str, Dictionary], settings: TrainSettings,
                   out: Path) -> None:
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
        l0 = d.config.k if d.config.arch in ("topk", "batchtopk") else int(round(float((d.encode(x) > 0).sum(-1)
                                                                                         .float().mean())))
        l0 = max(1, min(l0, x.shape[1]))
        save_dictionary(pca_topk_dictionary(x, l0, site=s), out / "controls" / f"pca-{_folder(s)}")
        save_dictionary(neuron_topk_dictionary(x, l0, site=s), out / "controls" / f"neurons-{_folder(s)}")


def find_dictionaries(folder: str | Path) -> dict[str, Path]:
    """Dictionaries under ``folder``: the folder itself, or every sub-folder (and ``controls/*``) holding one;
    name -> path. Raises :class:`DictionaryFormatError` when there is none."""
    folder = Path(folder)
    if is_dictionary(folder):
        return {folder.name: folder}
    found = {p.name: p for p in sorted(folder.glob("*")) if p.is_dir() and is_dictionary(p)}
    found.update({f"controls/{p.name}": p for p in sorted(folder.glob("controls/*")) if is_dictionary(p)})
    if not found:
        raise DictionaryFormatError(f"{folder} is not a dictionary (no cfg.json + sae_weights.safetensors in it "
                                    "or its sub-folders); train one with `bertscope sae train`")
    return found


def evaluate_sae(model: Any, folder: str | Path, texts: Sequence[str], *, objective: str = "auto",
                 batch_size: int = 32, include_special: bool = False) -> pd.DataFrame:
    """Evaluate every dictionary under ``folder`` (see :func:`find_dictionaries`) on held-out ``texts``: the
    long table of :func:`~bertscope.probes.dictionary.evaluate_dictionary` with a ``dictionary`` column."""
    parts = []
    for name, path in find_dictionaries(folder).items():
        d = load_dictionary(path, device=model.device)
        site = d.config.site
        if site is None or site not in model.hook_dict or (d.config.site_out and d.config.site_out
                                                            not in model.hook_dict):
            raise KeyError(f"dictionary {name} reads site {site!r}, which the model lacks")
        table = evaluate_dictionary(model, d, texts, batch_size=batch_size, include_special=include_special,
                                    objective=objective)
        table.insert(0, "dictionary", name)
        table.insert(1, "site", site)
        table.insert(2, "arch", d.config.arch)
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
        lines.append(f"{site}: {d.config.arch} {d.config.kind}, {d.config.d_sae} latents, "
                     f"{m.get('tokens_trained', 0):,} tokens ({m.get('epochs_read', 0)} passes over the corpus)")
    return "\n".join(lines)


__all__ = [
    "CorpusActivations",
    "capture_sentences",
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


# ------------------------------------------------------------------------------------------------ the commands
def run_train_command(args: Any, options: Any) -> int:
    """``bertscope sae train``: check every input before anything is written (UsageError: one line, exit 2),
    train, save, print where."""
    from bertscope.experiments.capture.layout import CaptureError
    from bertscope.experiments.options import UsageError, prepare_inputs

    if args.tokens < args.train_batch:
        raise UsageError(f"--tokens {args.tokens} is fewer than one training batch ({args.train_batch}); "
                         "train on more tokens")
    inputs = prepare_inputs(options)
    model = inputs.model
    if args.kind != "sae" and len(args.site) == 1:
        try:
            site_in, site_out = transcoder_sites(model, args.site[0], args.site_out)
        except KeyError as e:
            raise UsageError(str(e.args[0])) from None
        args.site, args.site_out = [site_in], site_out
    sites = list(args.site) + ([args.site_out] if args.site_out else [])
    for site in sites:
        try:
            d_in = site_width(model, site)
        except KeyError as e:
            raise UsageError(str(e.args[0])) from None
        if site in args.site:
            width = _width_or_usage(args.width, d_in)
            if args.arch in ("topk", "batchtopk") and args.k >= width:
                raise UsageError(f"--k {args.k} must be smaller than the width ({width} latents)")
    if args.kind != "sae" and (not args.site_out or len(args.site) != 1):
        raise UsageError("a transcoder reads one --site and predicts --site-out (e.g. --site "
                         "blocks.3.hook_resid_mid --site-out blocks.3.hook_mlp_out)")
    e2e = _e2e_settings(args, model, options)
    if args.kind == "transcoder" and args.arch == "topk":
        raise UsageError("a transcoder is relu, jumprelu or batchtopk (SAELens's format has no TopK transcoder)")
    capture = None
    if args.activations is not None:
        from bertscope.experiments.activations import open_capture

        try:
            capture = open_capture(args.activations, model)
            capture.resolve(sites)
            missing = [s for s in sites if s not in capture.resolve(sites)]
        except (CaptureError, KeyError, FileNotFoundError) as e:
            raise UsageError(f"--activations {args.activations}: {' '.join(str(e).split())}") from None
        if missing:
            raise UsageError(f"--activations {args.activations} holds no site {missing[0]}")
    sentences = list(inputs.corpus)
    max_length = options.max_length
    if capture is not None:
        sentences, max_length = capture_sentences(capture, sentences, options.corpus, sites)
    available = corpus_tokens(model, sentences, max_length)
    if available < args.train_batch:
        raise UsageError(f"the corpus has {available} usable tokens (special tokens left out), fewer than one "
                         f"training batch ({args.train_batch}); use a larger --corpus")
    settings = TrainSettings(tokens=args.tokens, batch_size=args.train_batch, buffer_rows=args.buffer,
                             lr=args.lr, seed=options.seed, device=str(inputs.device),
                             dtype=str(inputs.dtype).removeprefix("torch."), include_special=args.include_special,
                             checkpoint_tokens=args.checkpoint_every, progress=not options.quiet,
                             l1_coefficient=args.l1, l0_coefficient=args.l0)
    dicts = train_sae(model, sentences, args.site, options.out, arch=args.arch, k=args.k, width=args.width,
                      kind=args.kind, site_out=args.site_out, settings=settings, capture=capture,
                      batch_size=options.batch_size, max_length=max_length, controls=not args.no_controls, e2e=e2e)
    if not options.quiet:
        print(describe(dicts))
        print(f"saved under {options.out} (SAELens format); evaluate with: bertscope sae eval {options.out} "
              "--corpus HELD_OUT")
    return 0


def _e2e_settings(args: Any, model: Any, options: Any) -> E2ESettings | None:
    """``--e2e-steps`` / ``--e2e-lambda`` / ``--e2e-lr`` as :class:`E2ESettings` (None without ``--e2e-steps``);
    UsageError (one line) for a transcoder or a bad value."""
    from bertscope.experiments.options import UsageError

    steps = getattr(args, "e2e_steps", None)
    if not steps:
        if getattr(args, "e2e_lambda", None) is not None or getattr(args, "e2e_lr", None) is not None:
            raise UsageError("--e2e-lambda and --e2e-lr need --e2e-steps N")
        return None
    if args.kind != "sae":
        raise UsageError("--e2e-steps fine-tunes SAEs end to end; a transcoder is not fine-tuned (use --kind sae)")
    kw = {"steps": steps, "seed": options.seed, "progress": not options.quiet,
          "include_special": args.include_special}
    if args.e2e_lambda is not None:
        kw["mse_coefficient"] = args.e2e_lambda
    if args.e2e_lr is not None:
        kw["lr"] = args.e2e_lr
    try:
        return E2ESettings(**kw)
    except ValueError as e:
        raise UsageError(f"--e2e: {e}") from None


def transcoder_sites(model: Any, site: str, site_out: str | None = None) -> tuple[str, str]:
    """A transcoder's (read, predicted) sites: ``site`` may name a block (``blocks.3``), read at its MLP input
    (post-LN BERT: ``blocks.3.hook_resid_mid``; pre-LN: ``blocks.3.ln2.hook_normalized``, the MLP input up to
    LayerNorm's affine map, which the encoder absorbs); ``site_out`` defaults to the same block's
    ``hook_mlp_out``. ``KeyError`` (one line) when ``site`` names no block."""
    import re

    match = re.fullmatch(r"blocks\.(\d+)(\..+)?", site)
    if match is None:
        raise KeyError(f"a transcoder reads a block's MLP input: give --site blocks.L (or a hook of block L), "
                       f"not {site!r}")
    layer = int(match.group(1))
    if match.group(2) is None:
        post_ln = getattr(model.config, "norm_placement", "post") == "post"
        site = f"blocks.{layer}.hook_resid_mid" if post_ln else f"blocks.{layer}.ln2.hook_normalized"
    return site, site_out or f"blocks.{layer}.hook_mlp_out"


def capture_sentences(capture: Any, sentences: Sequence[Any], corpus_name: str,
                      sites: Sequence[str]) -> tuple[list[Any], int]:
    """The sentences of ``--corpus`` that the capture holds, and the capture's ``--max-length`` (a capture of a
    subset, e.g. ``--max-sentences``, trains on that subset); ``UsageError`` (one line) when it holds none of
    them or was made by another model or dtype."""
    from bertscope.experiments.capture.layout import CaptureError
    from bertscope.experiments.options import UsageError

    held = [s for s in sentences if capture.locate(s) is not None]
    if not held:
        made_from = (capture.index.get("corpus") or {}).get("name", "another corpus")
        raise UsageError(f"--activations {capture.folder} holds none of the sentences of --corpus {corpus_name} "
                         f"(it was made from {made_from}); pass the corpus it was captured from")
    try:
        capture.check(capture.max_length, held, sites)
    except CaptureError as e:
        raise UsageError(" ".join(str(e).split())) from None
    return held, capture.max_length


def _width_or_usage(width: str, d_in: int) -> int:
    from bertscope.experiments.options import UsageError

    try:
        value = parse_width(width, d_in)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if value < 1:
        raise UsageError(f"--width {width} gives no latents")
    return value


def run_eval_command(args: Any, options: Any) -> int:
    """``bertscope sae eval DIR``: evaluate every dictionary under DIR on the corpus; write the tables."""
    from bertscope.experiments.options import UsageError, prepare_inputs

    try:
        found = find_dictionaries(args.folder)
        for path in found.values():
            load_dictionary(path)
    except DictionaryFormatError as e:
        raise UsageError(str(e)) from None
    inputs = prepare_inputs(options)
    texts = [s.text for s in inputs.corpus]
    try:
        table = evaluate_sae(inputs.model, args.folder, texts, objective=args.objective,
                             batch_size=options.batch_size, include_special=args.include_special)
    except KeyError as e:
        raise UsageError(str(e.args[0])) from None
    paths = write_evaluation(table, options.out)
    if not options.quiet:
        with pd.option_context("display.width", 160, "display.max_columns", 20):
            print(summary(table).to_string(index=False, float_format=lambda v: f"{v:.4f}"))
        print(f"tables: {', '.join(str(p) for ps in paths.values() for p in ps)}")
    return 0
