"""How dictionaries are trained (:class:`TrainSettings`) and one dictionary's training state (:class:`TrainState`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .data import SPECIAL_CLASSES
from .models import Dictionary


@dataclass(frozen=True)
class Recipe:
    """The default dictionary recipe, read by every entry point that trains one (``TrainSettings``'s defaults,
    ``bertscope sae train``, ``experiments.dictionary.train_sae``, ``run features``) beside the default
    architecture (``architectures.DEFAULT``, TopK): ``k`` active latents,
    ``width`` (a multiple of the site's width), Adam ``lr``, ``batch_size`` tokens per step, ``tokens`` to train.

    Chosen on held-out data: docs/dictionaries.md, "More optimizer steps, chosen on held-out train sentences"
    (``benchmarks/dictionaries_steps.py``; rule: the highest spliced cosine on the last 1,000 EWT train sentences,
    held out of training, with explained variance >= 0.8) chose batch 1024 and lr 3e-3 among batches 256 to 1024 and
    lr 1e-3 to 3e-3. At 200k tokens it beats its PCA control on EWT dev, where SAELens's defaults (lr 3e-4, batch
    4096) do not ("The default recipe on EWT dev", ``benchmarks/dictionaries_default.py``). ``tokens`` is the
    README command's 2M (the sweep's 10M gains +0.002 held-out cosine for five times the steps).
    """

    k: int = 32
    width: str = "8x"
    lr: float = 3e-3
    batch_size: int = 1024
    tokens: int = 2_000_000


#: The one default recipe (:class:`Recipe`).
RECIPE = Recipe()


@dataclass(frozen=True)
class TrainSettings:
    """How to train (not saved into the dictionary's identity; recorded in its metadata).

    Sizes are in tokens (rows). ``buffer_rows`` bounds memory: a re-iterable source whose kept rows fit in it
    is read once (one pass of the model, or one read of a capture) and every epoch is a fresh shuffle of it in
    memory; a larger one streams through a shuffle buffer of that many rows. ``tokens``, ``batch_size`` and
    ``lr`` default to :data:`RECIPE` (the held-out-chosen recipe, not SAELens's lr 3e-4 / batch 4096). ``lr`` Adam's
    learning rate,
    warmed up linearly from 0 over ``lr_warm_up_tokens`` (SAELens and sparsify offer it; SAELens's default 0)
    and decayed linearly to 0 over the last ``lr_decay_fraction`` of ``tokens``; gradients clipped to norm 1
    (SAELens). ``l1_coefficient`` /
    ``l1_warm_up_tokens``: the ``relu`` penalty and its linear warm-up from 0; ``l0_coefficient`` /
    ``l0_warm_up_tokens``, ``jumprelu_bandwidth``, ``jumprelu_init_threshold``: JumpReLU (SAELens defaults 0.05
    and 0.01); ``aux_coefficient``: AuxK (SAELens 1.0); ``topk_threshold_lr``: BatchTopK's threshold average
    (SAELens 0.01). ``auxk``: the AuxK convention, ``"saelens"`` (SAELens's ``calculate_topk_aux_loss``:
    ``k_aux = d_in // 2``, scaled by ``min(n_dead / k_aux, 1)``, summed squared error) or ``"gao"`` (Gao et al.'s
    code, openai/sparse_autoencoder: ``aux_k`` dead latents, ReLU, MSE normalised by the residual's variance; its
    own coefficient is 1/32); ``architectures.kernels``. ``b_dec_init``: ``"geometric_median"``, ``"mean"`` or
    ``"zeros"``. ``normalise``: scale inputs to mean norm ``sqrt(d)`` while training (folded back at the end).
    ``include_special``: train on special tokens and padding too.
    """

    tokens: int = RECIPE.tokens
    batch_size: int = RECIPE.batch_size
    buffer_rows: int = 262_144
    lr: float = RECIPE.lr
    lr_decay_fraction: float = 0.2
    lr_warm_up_tokens: int = 0
    seed: int = 0
    device: str = "cpu"
    dtype: str = "float32"
    l1_coefficient: float = 5.0
    l1_warm_up_tokens: int = 0
    l0_coefficient: float = 1e-3
    l0_warm_up_tokens: int = 0
    jumprelu_bandwidth: float = 0.05
    jumprelu_init_threshold: float = 0.01
    aux_coefficient: float = 1.0
    auxk: str = "saelens"
    aux_k: int = 256
    topk_threshold_lr: float = 0.01
    dead_tokens: int = 200_000
    resample: bool = True
    b_dec_init: str = "geometric_median"
    normalise: bool = True
    include_special: bool = False
    exclude_classes: tuple[str, ...] = SPECIAL_CLASSES
    checkpoint_tokens: int | None = None
    progress: bool = True

    def __post_init__(self) -> None:
        if self.b_dec_init not in ("geometric_median", "mean", "zeros"):
            raise ValueError(f"b_dec_init must be geometric_median, mean or zeros, got {self.b_dec_init!r}")
        if self.auxk not in ("saelens", "gao") or self.aux_k < 1:
            raise ValueError(f"auxk must be saelens or gao and aux_k >= 1, got {self.auxk!r}, {self.aux_k}")
        if self.tokens < self.batch_size:
            raise ValueError(f"tokens ({self.tokens}) must be at least one batch ({self.batch_size})")

    @property
    def excluded(self) -> tuple[str, ...]:
        """Token classes left out of training."""
        return () if self.include_special else self.exclude_classes


@dataclass
class TrainState:
    """One dictionary's training state: the dictionary, its optimiser, the normalisation factors (input and
    output), tokens since each latent last fired ``[d_sae]``, and the last step's L0 / EV / dead fraction."""

    dictionary: Dictionary
    optimizer: torch.optim.Optimizer
    scale_in: float = 1.0
    scale_out: float = 1.0
    tokens_since_fired: torch.Tensor = field(default_factory=lambda: torch.zeros(0))
    last: dict[str, float] = field(default_factory=dict)
