"""End-to-end fine-tuning of a trained dictionary against the model's own objective.

Braun, Taylor, Goldowsky-Dill and Sharkey (2024), "Identifying functionally important features with end-to-end
sparse dictionary learning" (arXiv:2405.12241; code ApolloResearch/e2e_sae, ``e2e_sae/losses.py`` at commit
cddef939b8099ca303453b8044f4e8b56ffc8c20) train a dictionary spliced into a frozen model so that the model's
output with the splice matches the clean run: their ``e2e`` loss is ``LogitsKLLoss``, ``F.kl_div(log_softmax(new),
log_softmax(orig), log_target=True, reduction="batchmean")``, which is KL(clean || spliced) of the output
distribution averaged over positions, and ``e2e+ds`` adds ``F.mse_loss`` of downstream residuals. Here the stage
starts from a dictionary trained on MSE (architecture, ``k`` and width unchanged) and, with the model frozen,
minimises on training sentences only

    L = L_model + lambda * FVU

- ``L_model`` for a sentence-embedding model (``objective="sentence"``, the bundled one): the mean over sentences
  of ``1 - cos(e_spliced, e_clean)``, ``e`` the mean-pooled last hidden state over the attention mask (as
  :func:`~.evaluate.splice_fidelity` measures it; the normalised embedding has the same cosine). It is computed as
  ``0.5 * ||u_spliced - u_clean||^2`` with ``u = e / ||e||`` (equal to ``1 - cos`` for unit vectors), whose
  gradient is exactly zero when the splice changes nothing.
- ``L_model`` for a masked LM (``objective="mlm"``): KL(clean || spliced) of the MLM distribution at masked
  positions (``mask_fraction`` of the non-special pieces of each sentence, drawn per step from the seed), the mean
  over masked positions: Braun et al.'s KL at the positions where an encoder predicts. It is computed in the
  generalised form ``sum p_c log(p_c / p_s) - p_c + p_s`` (the same value for normalised distributions), whose
  gradient is exactly zero when the splice changes nothing (the plain form leaves ``p_c (sum p_c - 1)``, rounding
  noise that Adam would amplify).
- ``FVU`` (the normalised MSE at the site, a fraction of variance unexplained): ``sum ||x_hat - x||^2`` over the
  spliced positions of the batch divided by ``(positions * V)``, ``V = mean ||x - mean(x)||^2`` the site's total
  variance per token on the kept tokens of (up to ``variance_sentences``) training sentences, estimated once before
  fine-tuning. On a batch it is ``1 - explained variance`` up to the fixed denominator.
- ``relu`` dictionaries add ``l1_coefficient * mean_tokens sum_i f_i ||W_dec[i]||`` (their training penalty; the
  other architectures keep their sparsity: TopK exactly ``k``, JumpReLU and BatchTopK their thresholds, frozen).

The splice is the one :func:`~.evaluate.splice_fidelity` uses (:func:`~.evaluate.spliced`): the site's activation
is replaced by the reconstruction at the positions of the trained token classes (special tokens, [MASK] and padding
keep their clean values unless ``include_special``), and the gradient flows through the frozen upper layers into
the dictionary. The fine-tune runs in the training normalisation: the dictionary reads ``x * s`` and predicts
``x_hat * s`` with ``s = sqrt(d_in) / mean ||x||`` (rounded to a power of two, so the scaling is exact), folded back
into the saved weights at the end, as training does. Decoder rows of unit-norm architectures stay at their norm
(unit in that normalisation; ``1 / s`` once folded): the parallel gradient is removed before each Adam step and
every row is rescaled to its norm after. Adam, learning rate decayed linearly to 0 over the last ``lr_decay_fraction``
of the steps, gradients clipped to norm 1. Deterministic per ``seed`` (sentence order and masks from seeded
generators) on one device and thread count. SAEs only (a transcoder's splice target is another site).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from .data import SPECIAL_CLASSES, as_batch
from .evaluate import _cached_piece_classes, _mask_batch, _pooled, collect_activations, spliced, token_classes
from .models import Dictionary

#: The default weight of the site's FVU (chosen on a held-out slice of EWT train, never on dev:
#: benchmarks/dictionaries_e2e.py, docs/dictionaries.md "End-to-end fine-tuning").
DEFAULT_MSE_COEFFICIENT = 0.01
PAPER = "Braun et al. 2024, arXiv:2405.12241 (ApolloResearch/e2e_sae, e2e_sae/losses.py @ cddef939)"


@dataclass(frozen=True)
class E2ESettings:
    """How to fine-tune end to end (recorded in the dictionary's metadata under ``e2e``).

    ``steps`` Adam steps of ``batch_sentences`` training sentences each (sentences reshuffled every pass, batches
    made of sentences of similar length);
    ``mse_coefficient`` the lambda of the site's FVU; ``lr`` Adam's learning rate, decayed linearly to 0 over the
    last ``lr_decay_fraction`` of the steps; ``objective`` ``"sentence"``, ``"mlm"`` or ``"auto"`` (mlm when the
    model has a masked-LM head); ``mask_fraction`` of non-special pieces masked per sentence (mlm);
    ``variance_sentences`` training sentences the site's total variance is estimated on; ``l1_coefficient`` the
    sparsity penalty of ``relu`` dictionaries; ``include_special`` splice special tokens too (as the dictionary
    was trained); ``device`` / ``dtype`` of the dictionary while fine-tuning (None: the model's device, float32).
    """

    steps: int = 400
    mse_coefficient: float = DEFAULT_MSE_COEFFICIENT
    lr: float = 1e-4
    lr_decay_fraction: float = 0.2
    batch_sentences: int = 32
    objective: str = "auto"
    mask_fraction: float = 0.15
    variance_sentences: int = 512
    l1_coefficient: float = 0.0
    include_special: bool = False
    seed: int = 0
    device: str | None = None
    dtype: str = "float32"
    progress: bool = True

    def __post_init__(self) -> None:
        if self.steps < 0:
            raise ValueError(f"steps must be >= 0, got {self.steps}")
        if not self.mse_coefficient >= 0 or not math.isfinite(self.mse_coefficient):
            raise ValueError(f"mse_coefficient (lambda) must be a finite number >= 0, got {self.mse_coefficient}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.batch_sentences < 1:
            raise ValueError(f"batch_sentences must be >= 1, got {self.batch_sentences}")
        if self.objective not in ("auto", "sentence", "mlm"):
            raise ValueError(f"objective must be auto, sentence or mlm, got {self.objective!r}")
        if not 0 < self.mask_fraction < 1:
            raise ValueError(f"mask_fraction must be in (0, 1), got {self.mask_fraction}")


def resolve_objective(model: Any, objective: str) -> str:
    """``"auto"`` -> ``"mlm"`` when the model has a masked-LM head, else ``"sentence"``; ``"mlm"`` on a model
    without one raises ``ValueError``."""
    has_head = getattr(model, "mlm_head", None) is not None
    if objective == "auto":
        return "mlm" if has_head else "sentence"
    if objective == "mlm" and not has_head:
        raise ValueError("the mlm objective needs a model with a masked-LM head")
    return objective


class _Recorder:
    """Stands in for the dictionary inside :func:`spliced`: the same reconstruction, remembering the site's input
    ``x`` and the latents ``f`` of the last call (for the FVU and the L1 term)."""

    def __init__(self, dictionary: Dictionary, scale: float = 1.0) -> None:
        self.dictionary, self.config, self.W_enc = dictionary, dictionary.config, dictionary.W_enc
        self.scale = scale
        self.x: torch.Tensor | None = None
        self.x_hat: torch.Tensor | None = None
        self.f: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.f = self.dictionary.encode(x * self.scale)
        self.x, self.x_hat = x, self.dictionary.decode(self.f, x * self.scale) / self.scale
        return self.x_hat


@contextmanager
def frozen(model: Any) -> Iterator[Any]:
    """The model in eval mode with every parameter's ``requires_grad`` off; both restored on exit."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    was_training = model.training
    for p, _ in flags:
        p.requires_grad_(False)
    model.eval()
    try:
        yield model
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)
        model.train(was_training)


def _excluded(include_special: bool) -> list[str]:
    return [] if include_special else [*SPECIAL_CLASSES, "mask"]


@torch.no_grad()
def site_variance(model: Any, dictionary: Dictionary, texts: Sequence[str], *, include_special: bool = False,
                  batch_size: int = 32) -> float:
    """The site's total variance per token, ``mean ||x - mean(x)||^2`` over the kept tokens of ``texts`` (float64):
    the FVU's denominator."""
    return _site_rows_stats(model, dictionary, texts, include_special=include_special, batch_size=batch_size)[0]


@torch.no_grad()
def _site_rows_stats(model: Any, dictionary: Dictionary, texts: Sequence[str], *, include_special: bool = False,
                     batch_size: int = 32, batches: Iterable[Any] | None = None) -> tuple[float, float]:
    """``(total variance per token, mean norm)`` of the site's kept rows on ``texts`` (``batches``: those rows
    already collected: the activations stage's batches, or plain rows)."""
    excluded = _excluded(include_special)
    rows = []
    if batches is None:
        batches = collect_activations(model, texts, [dictionary.config.site], batch_size=batch_size)
    pieces = _cached_piece_classes(model.tokenizer) if getattr(model, "tokenizer", None) is not None else None
    for b in (as_batch(item, None, pieces) for item in batches):
        keep = torch.from_numpy(~np.isin(b.classes(), excluded))
        rows.append(b.acts[dictionary.config.site][keep].double())
    x = torch.cat(rows)
    if x.shape[0] < 2:
        raise ValueError("the site's variance needs at least two kept tokens")
    return float((x - x.mean(0)).pow(2).sum(-1).mean()), float(x.norm(dim=-1).mean())


def power_of_two_scale(d_in: int, mean_norm: float) -> float:
    """The training normalisation ``sqrt(d_in) / mean ||x||`` (SAELens's ``expected_average_only_in``) rounded to
    the nearest power of two, so that scaling by it and back is exact in floating point."""
    if not mean_norm > 0:
        return 1.0
    return float(2.0 ** round(math.log2(math.sqrt(d_in) / mean_norm)))


def e2e_terms(model: Any, dictionary: Dictionary, batch: dict[str, torch.Tensor], *, objective: str,
              variance: float, include_special: bool = False, l1_coefficient: float = 0.0,
              scale: float = 1.0) -> dict[str, torch.Tensor]:
    """The loss terms on one tokenised ``batch`` (with ``labels`` for mlm: -100 where not masked): ``model`` (the
    e2e term), ``fvu``, ``l1`` (relu only, else 0) and ``n`` (sentences, or masked positions for mlm). Gradients
    reach the dictionary's parameters through the frozen model. ``scale``: the dictionary reads ``x * scale`` and
    predicts ``x_hat * scale`` (the training normalisation; 1 for a dictionary that reads raw activations)."""
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    classes = token_classes(model, batch["input_ids"], batch["attention_mask"])
    where = torch.from_numpy(~np.isin(classes, _excluded(include_special)))
    with torch.no_grad():
        clean = model(inputs)
    rec = _Recorder(dictionary, scale)
    with spliced(model, rec, mode="dictionary", positions=lambda: where):
        out = model(inputs)
    if objective == "sentence":
        u_clean = torch.nn.functional.normalize(_pooled(clean, batch["attention_mask"]).double(), dim=-1)
        u_new = torch.nn.functional.normalize(_pooled(out, batch["attention_mask"]).double(), dim=-1)
        per = 0.5 * (u_new - u_clean).pow(2).sum(-1)  # = 1 - cos for unit vectors
        term, n = per.mean(), per.shape[0]
    else:
        sel = batch["labels"] != -100
        lp_clean = torch.log_softmax(model.mlm_logits(clean)[sel].double(), dim=-1)
        lp_new = torch.log_softmax(model.mlm_logits(out)[sel].double(), dim=-1)
        n = int(sel.sum())
        p_clean, p_new = lp_clean.exp(), lp_new.exp()
        kl = (p_clean * (lp_clean - lp_new) - p_clean + p_new).sum(-1)  # generalised KL: = KL when both sum to 1
        term = kl.mean() if n else out.sum() * 0.0
    w = where.to(rec.x.device)
    err = (rec.x_hat - rec.x.to(rec.x_hat.dtype))[w]
    fvu = err.double().pow(2).sum() / (max(err.shape[0], 1) * variance)
    l1 = torch.zeros((), dtype=torch.float64, device=fvu.device)
    if dictionary.spec.e2e_penalty is not None and l1_coefficient:
        l1 = dictionary.spec.e2e_penalty(dictionary, rec.f[w]).double()
    return {"model": term, "fvu": fvu, "l1": l1, "n": torch.tensor(float(n))}


@torch.no_grad()
def e2e_loss(model: Any, dictionary: Dictionary, texts: Sequence[str], *, objective: str = "auto",
             mse_coefficient: float = DEFAULT_MSE_COEFFICIENT, variance: float | None = None,
             include_special: bool = False, batch_size: int = 32, mask_fraction: float = 0.15,
             seed: int = 0) -> dict[str, float]:
    """The fine-tuning loss on ``texts`` (held-out sentences, no gradient): ``{"model", "fvu", "loss"}`` with
    ``model`` the e2e term averaged over sentences (mlm: over masked positions), ``fvu`` over all spliced tokens
    and ``loss = model + mse_coefficient * fvu``. ``variance`` defaults to the site's on ``texts``; masks (mlm)
    are drawn with ``seed + batch index`` as :func:`~.evaluate.splice_fidelity` draws them."""
    objective = resolve_objective(model, objective)
    if variance is None:
        variance = site_variance(model, dictionary, texts, include_special=include_special, batch_size=batch_size)
    with frozen(model):
        tot_m = tot_n = 0.0
        sq, count = 0.0, 0
        for i, start in enumerate(range(0, len(texts), batch_size)):
            batch = model.tokenize(list(texts[start : start + batch_size]))
            if objective == "mlm":
                batch = _mask_batch(model, batch, mask_fraction, seed + i)
            classes = token_classes(model, batch["input_ids"], batch["attention_mask"])
            kept = int((~np.isin(classes, _excluded(include_special))).sum())
            t = e2e_terms(model, dictionary, batch, objective=objective, variance=variance,
                          include_special=include_special)
            tot_m += float(t["model"]) * float(t["n"])
            tot_n += float(t["n"])
            sq += float(t["fvu"]) * kept
            count += kept
    m, f = tot_m / max(tot_n, 1.0), sq / max(count, 1)
    return {"model": m, "fvu": f, "loss": m + mse_coefficient * f}


def _bucketed_order(lengths: Sequence[int], batch: int, seed: int, group: int = 16) -> list[int]:
    """One pass over the sentences in batches of similar length (less padding): a seeded permutation, cut into
    groups of ``group * batch`` sentences, each sorted by length and cut into batches, the batches shuffled."""
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(lengths), generator=gen).tolist()
    batches = []
    for g in range(0, len(perm), group * batch):
        part = sorted(perm[g : g + group * batch], key=lambda i: (lengths[i], i))
        batches += [part[b : b + batch] for b in range(0, len(part), batch)]
    return [i for b in torch.randperm(len(batches), generator=gen).tolist() for i in batches[b]]


def finetune_e2e(model: Any, dictionary: Dictionary, sentences: Sequence[str],
                 settings: E2ESettings | None = None, *, rows: Iterable[Any] | None = None) -> Dictionary:
    """A copy of ``dictionary`` fine-tuned end to end on ``sentences`` (training sentences: never the ones it
    will be scored on) with the model frozen (see the module docstring for the loss). The copy's
    ``config.metadata["e2e"]`` records the objective, lambda and its normalisation, steps, learning rate, batch,
    seed, sentences, the site variance and the loss terms at the first and last steps; the input dictionary is
    unchanged. ``steps == 0`` returns an unchanged copy (still recorded). ``rows``: the site's rows of the first
    ``settings.variance_sentences`` sentences, already collected (the command reads them through the activations
    stage's batches, or plain rows); without it they are collected here."""
    s = settings or E2ESettings()
    if dictionary.config.kind != "sae":
        raise ValueError("end-to-end fine-tuning is for SAEs (a transcoder's spliced site is another site)")
    site = dictionary.config.site
    if site is None or site not in model.hook_dict:
        raise ValueError(f"the dictionary reads site {site!r}, which the model lacks")
    texts = [str(getattr(t, "text", t)) for t in sentences]
    if not texts:
        raise ValueError("end-to-end fine-tuning needs training sentences")
    objective = resolve_objective(model, s.objective)
    device = torch.device(s.device) if s.device is not None else model.device
    dtype = getattr(torch, s.dtype)
    d = copy.deepcopy(dictionary).to(device=device, dtype=dtype).train()
    variance, mean_norm = _site_rows_stats(model, d, texts[: s.variance_sentences], include_special=s.include_special,
                                           batches=rows)
    # Fine-tune in the training normalisation (inputs at mean norm ~sqrt(d)), where Adam's lr means what it meant
    # in training and a folded unit-norm decoder has unit rows again; folded back at the end.
    scale = power_of_two_scale(d.config.d_in, mean_norm)
    d.fold_scaling(1.0 / scale)
    row_norms = d.W_dec.detach().norm(dim=-1, keepdim=True).clone()
    params = [p for name, p in d.named_parameters() if name != "log_threshold"]
    for name, p in d.named_parameters():
        p.requires_grad_(name != "log_threshold")
    opt = torch.optim.Adam(params, lr=s.lr)
    decay_start = int(s.steps * (1 - s.lr_decay_fraction))

    def lr_at(step: int) -> float:
        if step < decay_start or s.steps == decay_start:
            return 1.0
        return max(0.0, (s.steps - step) / (s.steps - decay_start))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    n = len(texts)
    lengths = [len(t) for t in texts]
    per_pass = math.ceil(n / s.batch_sentences)
    history: list[dict[str, float]] = []
    order: list[int] = []
    bar = tqdm(range(s.steps), desc="e2e fine-tuning", unit="step", disable=not s.progress)
    with frozen(model):
        for step in bar:
            if step % per_pass == 0:
                order = _bucketed_order(lengths, s.batch_sentences, s.seed * 1_000_003 + step // per_pass)
            at = (step % per_pass) * s.batch_sentences
            batch = model.tokenize([texts[i] for i in order[at : at + s.batch_sentences]])
            if objective == "mlm":
                batch = _mask_batch(model, batch, s.mask_fraction, s.seed * 1_000_003 + step)
            t = e2e_terms(model, d, batch, objective=objective, variance=variance, include_special=s.include_special,
                          l1_coefficient=s.l1_coefficient, scale=scale)
            loss = t["model"] + s.mse_coefficient * t["fvu"] + s.l1_coefficient * t["l1"]
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if d.spec.unit_norm_decoder:
                d.remove_parallel_gradient()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            if d.spec.unit_norm_decoder:
                with torch.no_grad():  # every row back to its norm (unit in the training normalisation)
                    d.W_dec.mul_(row_norms / d.W_dec.norm(dim=-1, keepdim=True).clamp_min(1e-30))
            history.append({"model": float(t["model"].detach()), "fvu": float(t["fvu"].detach()),
                            "loss": float(loss.detach())})
            bar.set_postfix({"e2e": f"{history[-1]['model']:.4f}", "fvu": f"{history[-1]['fvu']:.4f}"},
                            refresh=False)
    bar.close()
    d.fold_scaling(scale)
    tail = history[-max(1, len(history) // 10):] if history else []
    record = {
        "paper": PAPER,
        "objective": objective,
        "loss": ("mean over sentences of 1 - cos(pooled spliced, pooled clean)" if objective == "sentence"
                 else "KL(clean || spliced) of the MLM distribution, mean over masked positions")
        + " + mse_coefficient * FVU"
        + (" + l1_coefficient * L1" if d.spec.e2e_penalty is not None and s.l1_coefficient else ""),
        "mse_normalisation": "FVU = sum ||x_hat - x||^2 over the spliced tokens / (tokens * site variance); site "
                             "variance = mean ||x - mean x||^2 over the kept tokens of the first "
                             f"{min(n, s.variance_sentences)} training sentences",
        "site_variance": variance,
        "input_scale": scale,
        "training_sentences": n,
        **{k: v for k, v in dataclasses.asdict(s).items() if k not in ("progress", "objective")},
        "first_step": history[0] if history else None,
        "last_steps_mean": ({k: float(np.mean([h[k] for h in tail])) for k in tail[0]} if tail else None),
    }
    cfg = dataclasses.replace(d.config, metadata={**d.config.metadata, "e2e": record})
    out = Dictionary(cfg, device=device, dtype=dtype)
    with torch.no_grad():
        out.load_state_dict(d.state_dict())
    for p in out.parameters():
        p.requires_grad_(True)
    return out.eval()


__all__ = ["DEFAULT_MSE_COEFFICIENT", "E2ESettings", "e2e_loss", "e2e_terms", "finetune_e2e", "frozen",
           "resolve_objective", "site_variance"]
