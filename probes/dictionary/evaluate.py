"""Judging a dictionary the way an encoder needs: on held-out sentences, per token class, spliced into the model.

- :func:`piece_classes`, :func:`token_classes`: each piece's class (``word``, ``continuation``, ``punct``,
  ``special``, ``mask``, ``pad``) from the tokenizer;
- :func:`collect_activations`: rows of one or several sites for texts, with their classes and sentences;
- :func:`spliced`: a context manager that replaces a site's activation by the dictionary's reconstruction (or
  by zero / a mean: the ablations) at the positions of chosen token classes, on every forward;
- :func:`splice_fidelity`: the model's own objective with the splice against the clean run and against zero-
  and mean-ablation of the site, with the fraction recovered ``(L_ablate - L_dict) / (L_ablate - L_clean)``;
- :func:`spliced_embeddings`: each sentence's pooled embedding per condition (clean, spliced, ablated), the
  per-sentence values behind the sentence objective (for sentence-bootstrap intervals, or pair scores such as
  STS-B's);
- :func:`evaluate_dictionary`: reconstruction and sparsity metrics (overall and per class) plus fidelity;
- :func:`pca_topk_dictionary`, :func:`neuron_topk_dictionary`: the controls at the same L0, as dictionaries.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import pandas as pd
import torch
from bertscope.hooks.hook_points import HookPoint
from bertscope.hooks.sites import last_block
from scipy.stats import spearmanr

from .architectures.relu import RELU
from .architectures.topk import TOPK
from .data import SPECIAL_CLASSES, _Rows, as_batch
from .metrics import metrics_table
from .models import Dictionary, DictionaryConfig

TOKEN_CLASSES = ("word", "continuation", "punct", "special", "mask", "pad")
_PUNCT = set(string.punctuation)


def piece_classes(tokenizer: Any) -> np.ndarray:
    """The class of every vocabulary id ``[vocab]`` as a word piece: ``continuation`` (a piece inside a word:
    WordPiece ``##``), ``punct`` (all punctuation, after a ``Ġ``/``▁`` word marker) or ``word`` (a word's first
    piece). The one place the dictionary's finer classes of real tokens come from (the activations stage's ``real``
    tokens and :func:`token_classes` both read it)."""
    vocab = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    out = np.empty(len(vocab), dtype=object)
    for i, piece in enumerate(vocab):
        bare = (piece or "").lstrip("Ġ▁")
        out[i] = "continuation" if piece and piece.startswith("##") else (
            "punct" if bare and all(ch in _PUNCT for ch in bare) else "word")
    return out


def token_classes(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> np.ndarray:
    """Class of every piece ``[batch, pos]``: ``pad`` (attention mask 0), ``special`` ([CLS], [SEP], <s>,
    </s>, ...), ``mask`` ([MASK]), else the piece's class (:func:`piece_classes`: ``continuation``, ``punct``,
    ``word``)."""
    tok = model.tokenizer
    table = _cached_piece_classes(tok)
    ids = input_ids.cpu().numpy()
    mask_id = getattr(tok, "mask_token_id", None)
    special = np.asarray(sorted(set(getattr(tok, "all_special_ids", [])) - {mask_id}), dtype=np.int64)
    out = table[np.clip(ids, 0, len(table) - 1)].astype(object)
    out[np.isin(ids, special)] = "special"
    if mask_id is not None:
        out[ids == mask_id] = "mask"
    out[attention_mask.cpu().numpy() == 0] = "pad"
    return out


def _cached_piece_classes(tokenizer: Any) -> np.ndarray:
    """:func:`piece_classes`, computed once per tokenizer."""
    cached = getattr(tokenizer, "_bertscope_piece_classes", None)
    if cached is None or len(cached) != len(tokenizer):
        cached = piece_classes(tokenizer)
        try:
            tokenizer._bertscope_piece_classes = cached
        except AttributeError:  # pragma: no cover - a tokenizer that takes no attributes
            pass
    return cached


def text_batches(model: Any, texts: Sequence[str], batch_size: int = 32) -> Iterator[dict[str, torch.Tensor]]:
    """Tokenised batches of ``texts`` (in order, padded per batch)."""
    for start in range(0, len(texts), batch_size):
        yield model.tokenize(list(texts[start : start + batch_size]))


@torch.no_grad()
def collect_activations(model: Any, texts: Sequence[str], sites: Sequence[str], *, batch_size: int = 32,
                        include_pad: bool = False) -> Iterator[_Rows]:
    """Plain rows (:func:`~.data.plain_rows`) per batch of texts: rows of every real token (padding left out unless
    ``include_pad``) at ``sites`` (hook names; a site the model lacks raises ``KeyError``), with token classes
    and sentence indices. The forward stops at the last block any site needs."""
    sites = list(sites)
    unknown = [s for s in sites if s not in model.hook_dict]
    if unknown:
        raise KeyError(f"the model has no hook {unknown[0]!r} (see `bertscope info`)")
    stop = last_block(sites)
    for b, start in enumerate(range(0, len(texts), batch_size)):
        batch = model.tokenize(list(texts[start : start + batch_size]))
        store: dict[str, torch.Tensor] = {}

        def save(t: torch.Tensor, hook: Any, store: dict = store) -> None:
            store[hook.name] = t.detach()

        with model.hooks([(sites, save)]):
            model(batch, stop_at_layer=stop)
        classes = token_classes(model, batch["input_ids"], batch["attention_mask"])
        keep = np.ones(classes.shape, dtype=bool) if include_pad else classes != "pad"
        flat = torch.from_numpy(keep.reshape(-1))
        sentence = np.broadcast_to(np.arange(start, start + classes.shape[0])[:, None], classes.shape)
        yield _Rows({s: store[s].reshape(-1, store[s].shape[-1])[flat].float().cpu() for s in sites},
                              classes.reshape(-1)[keep.reshape(-1)], sentence.reshape(-1)[keep.reshape(-1)])
        del b


#: The hook points a spliced dictionary adds under its site (SAELens's names): ``<site>.hook_sae_input`` the rows it
#: reads ``[batch, pos, d_in]``, ``<site>.hook_sae_acts_post`` its latent activations ``[batch, pos, d_sae]``,
#: ``<site>.hook_sae_recons`` its reconstruction ``[batch, pos, d_out]`` (before ``positions`` keeps clean rows).
SPLICE_HOOKS = ("hook_sae_input", "hook_sae_acts_post", "hook_sae_recons")


@contextmanager
def spliced(model: Any, dictionary: Dictionary | None, *, mode: str = "dictionary",
            positions: Callable[[], torch.Tensor | None] | None = None,
            mean: torch.Tensor | None = None) -> Iterator[Any]:
    """Replace the dictionary's output site on every forward inside the block (SAELens's ``run_with_saes``).

    ``mode``: ``"dictionary"`` (the reconstruction; a transcoder's prediction from its input site, read in the
    same forward), ``"zero"`` or ``"mean"`` (ablations: ``mean [d]``). ``positions()`` returns the bool
    ``[batch, pos]`` of positions to replace for the current forward (None: all); the others keep their clean
    activation.

    In ``"dictionary"`` mode the dictionary's own activations are hook points while the block lasts, named as
    SAELens names them (:data:`SPLICE_HOOKS`, under ``d.cfg.hook_name``): ``model.run_with_cache(...)`` inside the
    block returns ``"<site>.hook_sae_acts_post"`` ``[batch, pos, d_sae]`` (and ``hook_sae_input``,
    ``hook_sae_recons``), and a hook on them edits the latents the model then uses::

        with spliced(model, d):
            _, cache = model.run_with_cache(ids, names_filter="*.hook_sae_acts_post")
        acts = cache[f"{d.cfg.hook_name}.hook_sae_acts_post"]
    """
    cfg = dictionary.config
    site_in, site_out = cfg.site, cfg.site_out or cfg.site
    seen: dict[str, torch.Tensor] = {}
    # a stand-in that is only callable (the e2e trainer's recorder) gets no latent hook point
    latents = callable(getattr(dictionary, "encode", None)) and callable(getattr(dictionary, "decode", None))
    names = [n for n in SPLICE_HOOKS if latents or n != "hook_sae_acts_post"] if mode == "dictionary" else []
    points = {name: HookPoint() for name in names}

    def read(t: torch.Tensor, hook: Any) -> None:
        seen["x"] = t

    def replace(t: torch.Tensor, hook: Any) -> torch.Tensor:
        if mode == "dictionary":
            x = seen.pop("x", t) if site_in != site_out else t
            x = points["hook_sae_input"](x.to(dictionary.W_enc.dtype))
            if latents:
                new = dictionary.decode(points["hook_sae_acts_post"](dictionary.encode(x)), x)
            else:
                new = dictionary(x)
            new = points["hook_sae_recons"](new).to(t.dtype)
        elif mode == "zero":
            new = torch.zeros_like(t)
        elif mode == "mean":
            new = mean.to(device=t.device, dtype=t.dtype).expand_as(t)
        else:
            raise ValueError(f"mode must be dictionary, zero or mean, got {mode!r}")
        where = positions() if positions is not None else None
        if where is None:
            return new
        return torch.where(where.to(t.device)[..., None], new, t)

    hooks = [(site_in, read)] if (mode == "dictionary" and site_in != site_out) else []
    with _hook_points(model, site_out, {f"{site_in}.{n}": p for n, p in points.items()}):
        with model.hooks([*hooks, (site_out, replace)]):
            yield model


@contextmanager
def _hook_points(model: Any, after: str, points: dict[str, HookPoint]) -> Iterator[None]:
    """Add ``points`` (name -> hook point) to ``model.hook_dict`` right after ``after`` (forward order) while the
    block lasts; refused when a name is taken (a dictionary spliced twice at one site)."""
    if not points:
        yield
        return
    taken = [n for n in points if n in model.hook_dict]
    if taken:
        raise ValueError(f"{taken[0]} is already a hook point: one dictionary spliced at a site at a time")
    old = model.hook_dict
    new: dict[str, HookPoint] = {}
    for name, point in old.items():
        new[name] = point
        if name == after:
            new.update(points)
    for name, point in points.items():
        point.name = name
    model.hook_dict = new
    try:
        yield
    finally:
        model.hook_dict = old


def _pooled(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean over real tokens ``[b, p, m], [b, p] -> [b, m]`` (sentence-transformers' mean pooling, as
    ``bertscope.similarity`` pools; that layer sits above this one, so it is not imported here)."""
    m = attention_mask.to(hidden.dtype)[..., None]
    return (hidden * m).sum(1) / m.sum(1).clamp_min(1)


CONDITIONS = ("clean", "dictionary", "zero", "mean")


def _condition_outputs(model: Any, dictionary: Dictionary, batches: list[dict[str, torch.Tensor]],
                       conditions: Sequence[str], excluded: set[str],
                       mean: torch.Tensor | None) -> dict[str, list[Any]]:
    """The model's outputs on ``batches`` per condition: ``clean`` (no hook) or the site replaced at the positions
    of every token class but ``excluded`` by the dictionary's reconstruction (``dictionary``), zero or ``mean``."""
    current: dict[str, torch.Tensor] = {}
    outputs: dict[str, list[Any]] = {c: [] for c in conditions}
    for batch in batches:
        classes = token_classes(model, batch["input_ids"], batch["attention_mask"])
        current["where"] = torch.from_numpy(~np.isin(classes, list(excluded)))
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        for condition in conditions:
            if condition == "clean":
                outputs[condition].append(model(inputs))
                continue
            with spliced(model, dictionary, mode=condition, positions=lambda: current["where"], mean=mean):
                outputs[condition].append(model(inputs))
    return outputs


@torch.no_grad()
def spliced_embeddings(model: Any, dictionary: Dictionary, texts: Sequence[str], *,
                       conditions: Sequence[str] = CONDITIONS, batch_size: int = 32, include_special: bool = False,
                       mean: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Each sentence's pooled last hidden state per condition, ``{condition: [len(texts), d_model]}`` (float64,
    in the order of ``texts``): what :func:`splice_fidelity`'s sentence objective averages, kept per sentence.

    ``conditions``: any of ``clean``, ``dictionary`` (the dictionary's reconstruction spliced in), ``zero`` and
    ``mean`` (ablations), each replacing the site at the trained token classes only (all but special tokens,
    [MASK] and padding unless ``include_special``), as in :func:`splice_fidelity`; ``mean`` (the site's mean over
    those tokens) is estimated from ``texts`` when not given and needed. Pooling is the mean over real tokens (the
    bundled model's own, equal to ``bertscope.similarity.embed``'s). ``1 - cos(e[c][i], e["clean"][i])`` is
    sentence ``i``'s embedding loss.
    """
    unknown = [c for c in conditions if c not in CONDITIONS]
    if unknown:
        raise ValueError(f"conditions are {', '.join(CONDITIONS)}, got {unknown[0]!r}")
    excluded = set() if include_special else set(SPECIAL_CLASSES) | {"mask"}
    batches = list(text_batches(model, texts, batch_size))
    if mean is None and "mean" in conditions:
        mean = _site_mean(model, batches, dictionary.config.site_out or dictionary.config.site, excluded)
    outputs = _condition_outputs(model, dictionary, batches, list(conditions), excluded, mean)
    return {c: torch.cat([_pooled(h, b["attention_mask"]) for h, b in zip(hs, batches, strict=True)]).double()
            for c, hs in outputs.items()}


@torch.no_grad()
def splice_fidelity(model: Any, dictionary: Dictionary, texts: Sequence[str], *, objective: str = "auto",
                    batch_size: int = 32, include_special: bool = False, mean: torch.Tensor | None = None,
                    mask_fraction: float = 0.15, seed: int = 0,
                    head: Callable[[torch.Tensor], torch.Tensor] | None = None,
                    labels: Sequence[int] | None = None) -> pd.DataFrame:
    """The model's objective with the dictionary spliced in, against clean and ablated runs: a long table
    (``objective``, ``condition`` in clean / dictionary / zero / mean, ``metric``, ``value``) plus rows
    ``metric == "fraction_recovered"`` per ablation.

    ``objective``: ``"sentence"`` (mean-pooled sentence embedding: ``embedding_cosine`` to the clean one, mean
    over sentences; ``similarity_spearman`` of all pairwise sentence cosines against the clean ones; the loss
    for fraction recovered is ``1 - embedding_cosine``), ``"mlm"`` (``mask_fraction`` of the non-special pieces
    of every sentence replaced by [MASK], drawn with ``seed``; ``ce`` at those positions against the original
    pieces and ``kl`` = KL(clean || condition) of the MLM distribution, SAELens's ``_kl``; loss ``ce``),
    ``"classifier"`` (``head(hidden [batch, pos, d]) -> logits [batch, classes]``: ``kl`` on the class logits,
    ``accuracy`` against ``labels`` (or agreement with the clean prediction); loss ``kl``). ``"auto"``: mlm when
    the model has a masked-LM head, else sentence. Splicing touches the token classes the dictionary was trained
    on (all but special and padding unless ``include_special``); ``mean`` (the site's mean activation over those
    tokens, for mean-ablation) is estimated from ``texts`` when not given.
    """
    if objective == "auto":
        objective = "mlm" if getattr(model, "mlm_head", None) is not None else "sentence"
    if objective == "classifier" and head is None:
        raise ValueError("the classifier objective needs head(hidden) -> class logits")
    excluded = set() if include_special else set(SPECIAL_CLASSES) | {"mask"}
    site_out = dictionary.config.site_out or dictionary.config.site
    batches = list(text_batches(model, texts, batch_size))
    if objective == "mlm":
        batches = [_mask_batch(model, b, mask_fraction, seed + i) for i, b in enumerate(batches)]
    if mean is None:
        mean = _site_mean(model, batches, site_out, excluded)
    outputs = _condition_outputs(model, dictionary, batches, CONDITIONS, excluded, mean)
    rows = _objective_rows(objective, model, batches, outputs, head, labels)
    table = pd.DataFrame(rows)
    table.insert(0, "objective", objective)
    loss_metric = {"sentence": "embedding_loss", "mlm": "ce", "classifier": "kl"}[objective]
    loss = {r["condition"]: r["value"] for r in rows if r["metric"] == loss_metric}
    extra = [{"objective": objective, "condition": f"{abl}_ablation", "metric": "fraction_recovered",
              "value": fraction_recovered(loss["clean"], loss["dictionary"], loss[abl])} for abl in ("zero", "mean")]
    return pd.concat([table, pd.DataFrame(extra)], ignore_index=True)


def fraction_recovered(clean: float, spliced_loss: float, ablated: float) -> float:
    """``(L_ablate - L_dict) / (L_ablate - L_clean)``: 1 when splicing costs nothing, 0 when it is as bad as the
    ablation (NaN when the ablation costs nothing)."""
    denom = ablated - clean
    return float((ablated - spliced_loss) / denom) if denom != 0 else float("nan")


def _site_mean(model: Any, batches: list[dict[str, torch.Tensor]], site: str, excluded: set[str]) -> torch.Tensor:
    total, count = None, 0
    for batch in batches:
        got: dict[str, torch.Tensor] = {}
        def grab(t: torch.Tensor, hook: Any, got: dict = got) -> None:
            got["t"] = t.detach()

        with model.hooks([(site, grab)]):
            model({k: v for k, v in batch.items() if k != "labels"})
        classes = token_classes(model, batch["input_ids"], batch["attention_mask"])
        keep = torch.from_numpy(~np.isin(classes, list(excluded)))
        rows = got["t"][keep.to(got["t"].device)].double()
        total = rows.sum(0) if total is None else total + rows.sum(0)
        count += rows.shape[0]
    return (total / max(count, 1)).float()


def _mask_batch(model: Any, batch: dict[str, torch.Tensor], fraction: float, seed: int) -> dict[str, torch.Tensor]:
    classes = token_classes(model, batch["input_ids"], batch["attention_mask"])
    eligible = torch.from_numpy(np.isin(classes, ["word", "continuation", "punct"]))
    gen = torch.Generator().manual_seed(seed)
    chosen = (torch.rand(eligible.shape, generator=gen) < fraction) & eligible
    mask_id = model.tokenizer.mask_token_id
    out = dict(batch)
    out["labels"] = torch.where(chosen.to(batch["input_ids"].device), batch["input_ids"], -100)
    out["input_ids"] = torch.where(chosen.to(batch["input_ids"].device), mask_id, batch["input_ids"])
    return out


def _objective_rows(objective: str, model: Any, batches: list[dict[str, torch.Tensor]],
                    outputs: dict[str, list[torch.Tensor]], head: Callable | None,
                    labels: Sequence[int] | None) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    if objective == "sentence":
        emb = {c: torch.cat([_pooled(h, b["attention_mask"]) for h, b in zip(hs, batches, strict=False)]).double()
               for c, hs in outputs.items()}
        unit = {c: torch.nn.functional.normalize(e, dim=-1) for c, e in emb.items()}
        iu = torch.triu_indices(len(unit["clean"]), len(unit["clean"]), offset=1)
        sims_clean = (unit["clean"] @ unit["clean"].T)[iu[0], iu[1]].numpy()
        for c in outputs:
            cos = float((unit[c] * unit["clean"]).sum(-1).mean())
            sims = (unit[c] @ unit[c].T)[iu[0], iu[1]].numpy()
            rho = float(spearmanr(sims_clean, sims).statistic) if len(sims) > 1 else float("nan")
            rows += [{"condition": c, "metric": "embedding_cosine", "value": cos},
                     {"condition": c, "metric": "embedding_loss", "value": 1 - cos},
                     {"condition": c, "metric": "similarity_spearman", "value": rho}]
    elif objective == "mlm":
        logp = {c: [] for c in outputs}
        targets = []
        for i, b in enumerate(batches):
            sel = b["labels"] != -100
            targets.append(b["labels"][sel])
            for c in outputs:
                logp[c].append(torch.log_softmax(model.mlm_logits(outputs[c][i])[sel].double(), dim=-1))
        tgt = torch.cat(targets)
        lp = {c: torch.cat(v) for c, v in logp.items()}
        for c in outputs:
            ce = float(-lp[c].gather(1, tgt[:, None]).mean())
            kl = float((lp["clean"].exp() * (lp["clean"] - lp[c])).sum(-1).mean())
            rows += [{"condition": c, "metric": "ce", "value": ce}, {"condition": c, "metric": "kl", "value": kl},
                     {"condition": c, "metric": "n_masked", "value": float(tgt.numel())}]
    else:
        logits = {c: torch.cat([head(h) for h in hs]).double() for c, hs in outputs.items()}
        lp = {c: torch.log_softmax(v, dim=-1) for c, v in logits.items()}
        gold = torch.as_tensor(labels) if labels is not None else lp["clean"].argmax(-1)
        for c in outputs:
            kl = float((lp["clean"].exp() * (lp["clean"] - lp[c])).sum(-1).mean())
            acc = float((lp[c].argmax(-1) == gold).double().mean())
            rows += [{"condition": c, "metric": "kl", "value": kl},
                     {"condition": c, "metric": "accuracy", "value": acc}]
    return rows


@torch.no_grad()
def reconstruct(dictionary: Dictionary, batches: Sequence[Any], *,
                chunk: int = 8192) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, np.ndarray]:
    """Targets, reconstructions, latent activations and token classes of ``batches`` (rows of the dictionary's
    input and output sites): ``(y [n, d_out], y_hat [n, d_out], f [n, d_sae], classes [n])``."""
    cfg = dictionary.config
    xs = torch.cat([b.acts[cfg.site] for b in batches])
    ys = torch.cat([b.acts[cfg.site_out or cfg.site] for b in batches])
    classes = np.concatenate([b.classes() for b in batches])
    dev, dt = dictionary.W_enc.device, dictionary.W_enc.dtype
    fs, yh = [], []
    for start in range(0, xs.shape[0], chunk):
        x = xs[start : start + chunk].to(dev, dt)
        f = dictionary.encode(x)
        fs.append(f.float().cpu())
        yh.append(dictionary.decode(f, x).float().cpu())
    return ys.float(), torch.cat(yh), torch.cat(fs), classes


def evaluate_dictionary(model: Any, dictionary: Dictionary, texts: Sequence[str], *, batch_size: int = 32,
                        include_special: bool = False, objective: str = "auto", fidelity: bool = True,
                        mean: torch.Tensor | None = None, batches: Iterable[Any] | None = None,
                        **fidelity_kwargs: Any) -> pd.DataFrame:
    """Everything about one dictionary on held-out ``texts``: one long table with columns ``section``
    (``reconstruction`` or ``fidelity``), ``token_class`` (``all`` and each class; fidelity rows ``all``),
    ``condition``, ``metric``, ``value``. Reconstruction rows cover the trained token classes (special tokens
    and padding left out unless ``include_special``).

    ``batches``: the rows of the dictionary's sites for ``texts``, already collected: the activations stage's
    batches (the commands read them through it; classes derived by ``data.stage_classes``) or
    plain rows. Without it they are collected here (:func:`collect_activations`)."""
    cfg = dictionary.config
    sites = [cfg.site] + ([cfg.site_out] if cfg.site_out and cfg.site_out != cfg.site else [])
    if batches is None:
        batches = collect_activations(model, texts, sites, batch_size=batch_size)
    pieces = _cached_piece_classes(model.tokenizer) if getattr(model, "tokenizer", None) is not None else None
    batches = [as_batch(b, None, pieces) for b in batches]
    if not include_special:
        batches = [_drop(b, set(SPECIAL_CLASSES) | {"mask"}) for b in batches]
    y, y_hat, f, classes = reconstruct(dictionary, batches)
    table = metrics_table(y, y_hat, f, classes)
    table.insert(0, "section", "reconstruction")
    table["condition"] = "dictionary"
    parts = [table]
    if fidelity:
        fid = splice_fidelity(model, dictionary, texts, objective=objective, batch_size=batch_size,
                              include_special=include_special, mean=mean, **fidelity_kwargs)
        fid.insert(0, "section", "fidelity")
        fid["token_class"] = "all"
        parts.append(fid)
    return pd.concat(parts, ignore_index=True)


def _drop(batch: Any, excluded: set[str]) -> _Rows:
    keep = ~np.isin(batch.classes(), list(excluded))
    idx = torch.from_numpy(np.flatnonzero(keep))
    sent = None if batch.sentence is None else np.asarray(batch.sentence)[keep]
    return _Rows({s: t[idx] for s, t in batch.acts.items()}, batch.classes()[keep], sent)


# ---------------------------------------------------------------------------------------------- controls
@torch.no_grad()
def basis_topk_dictionary(basis: torch.Tensor, mean: torch.Tensor, k: int, *, site: str | None = None,
                          name: str = "basis") -> Dictionary:
    """A TopK dictionary that keeps, per token, the ``k`` largest ``|coefficients|`` of ``x - mean`` in the
    orthonormal ``basis [n, d]`` (rows): ``W_enc = [B^T, -B^T]`` (one of each pair is positive, so TopK over
    ``2n`` latents keeps the ``k`` largest magnitudes), ``W_dec = [B; -B]``, ``b_dec = mean``. L0 is ``k``."""
    n, d = basis.shape
    cfg = DictionaryConfig(d_in=d, d_sae=2 * n, arch=TOPK.name, k=k, site=site, metadata={"control": name})
    dic = Dictionary(cfg)
    dic.W_enc.copy_(torch.cat([basis.T, -basis.T], dim=1))
    dic.W_dec.copy_(torch.cat([basis, -basis], dim=0))
    dic.b_dec.copy_(mean)
    return dic.eval()


def pca_topk_dictionary(x: torch.Tensor, k: int, *, site: str | None = None) -> Dictionary:
    """The PCA control: principal directions of ``x [n, d]`` (training rows), ``k`` largest components kept
    per token (:func:`basis_topk_dictionary`)."""
    mean = x.double().mean(0)
    _, _, vh = torch.linalg.svd(x.double() - mean, full_matrices=False)
    return basis_topk_dictionary(vh.float(), mean.float(), k, site=site, name="pca")


def neuron_topk_dictionary(x: torch.Tensor, k: int, *, site: str | None = None) -> Dictionary:
    """The neuron-basis control: the ``k`` coordinates of ``x - mean`` largest in magnitude kept per token."""
    d = x.shape[1]
    return basis_topk_dictionary(torch.eye(d), x.double().mean(0).float(), k, site=site, name="neurons")


def identity_dictionary(d: int, *, site: str | None = None) -> Dictionary:
    """A ReLU "dictionary" that reconstructs exactly: ``W_enc = [I, -I]``, ``W_dec = [I; -I]``, biases 0, so
    ``x_hat = ReLU(x) - ReLU(-x) = x`` (the splice-identity check)."""
    cfg = DictionaryConfig(d_in=d, d_sae=2 * d, arch=RELU.name, site=site, metadata={"control": "identity"})
    dic = Dictionary(cfg)
    with torch.no_grad():
        eye = torch.eye(d)
        dic.W_enc.copy_(torch.cat([eye, -eye], dim=1))
        dic.W_dec.copy_(torch.cat([eye, -eye], dim=0))
    return dic.eval()
