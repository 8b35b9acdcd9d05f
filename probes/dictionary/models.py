"""Sparse dictionaries: sparse autoencoders and transcoders, one module for every architecture registered in
``architectures/`` (each architecture's own file holds its activation, losses, threshold and SAELens mapping).

Shapes: ``W_enc [d_in, d_sae]``, ``b_enc [d_sae]``, ``W_dec [d_sae, d_out]``, ``b_dec [d_out]``,
``W_skip [d_in, d_out]`` (skip transcoders only), ``threshold [d_sae]`` (architectures with an inference
threshold). An SAE has ``d_out == d_in`` and reads and predicts the same site; a transcoder reads a block's MLP
input and predicts its MLP output.

Conventions (SAELens 6.x, ``sae_lens/saes/*.py``): pre-activation ``h = (x - b_dec) @ W_enc + b_enc`` for SAEs
(SAELens ``apply_b_dec_to_input=True``), ``h = x @ W_enc + b_enc`` for transcoders (SAELens forbids
``apply_b_dec_to_input`` there); ``f = activate(h)`` (the architecture's); reconstruction
``x_hat = f @ W_dec + b_dec`` (``+ x @ W_skip`` for skip transcoders). Decoder rows are initialised (and, when the
architecture's ``unit_norm_decoder`` says so, kept) at unit norm, else at norm 0.1 (SAELens's
``decoder_init_norm``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from . import architectures
from .architectures import KINDS, Architecture
from .architectures.kernels import (  # noqa: F401 - kept importable from here (their old home)
    JumpReLUFunction,
    SparseDecodeFunction,
    StepFunction,
    TopKEncodeFunction,
    batch_topk_activation,
    topk_activation,
)


def __getattr__(name: str) -> Any:
    """``ARCHITECTURES`` and ``UNIT_NORM_DECODER`` (old names), read from the architecture table when asked for."""
    if name == "ARCHITECTURES":
        return architectures.names()
    if name == "UNIT_NORM_DECODER":
        return tuple(a.name for a in architectures.TABLE.values() if a.unit_norm_decoder)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class DictionaryConfig:
    """What a dictionary is (saved with it): sizes, architecture, and where it reads and writes.

    ``d_out`` defaults to ``d_in`` (an SAE). ``k`` is the number of active latents per token for ``topk`` and the
    average number for ``batchtopk`` (None otherwise). ``site`` is the hook the dictionary reads (a transcoder:
    its MLP input) and ``site_out`` the one it predicts (an SAE: the same). ``metadata`` holds free-form
    provenance (model, corpus, tokens, token classes trained on, normalisation factor folded in).
    """

    d_in: int
    d_sae: int
    arch: str = architectures.DEFAULT
    k: int | None = None
    kind: str = "sae"
    d_out: int | None = None
    site: str | None = None
    site_out: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.arch not in architectures.TABLE:
            raise ValueError(f"arch must be one of {architectures.names()}, got {self.arch!r}")
        spec = architectures.get(self.arch)
        if self.d_in < 1 or self.d_sae < 1:
            raise ValueError(f"d_in and d_sae must be positive, got {self.d_in} and {self.d_sae}")
        if spec.uses_k and (self.k is None or not 0 < self.k < self.d_sae):
            raise ValueError(f"{self.arch} needs 0 < k < d_sae (width {self.d_sae}), got k={self.k}")
        if self.kind == "sae" and self.d_out not in (None, self.d_in):
            raise ValueError(f"an SAE predicts its own input: d_out must equal d_in ({self.d_in}), got {self.d_out}")
        if self.kind not in spec.kinds:
            which = ", ".join(architectures.for_kind(self.kind))
            raise ValueError(f"a {self.kind.replace('_', ' ')} is {which} (SAELens's format has no {self.arch} "
                             f"{self.kind.replace('_', ' ')})")
        if self.kind == "sae" and self.site_out not in (None, self.site):
            raise ValueError("an SAE predicts its own site: site_out must equal site")

    @property
    def spec(self) -> Architecture:
        """The registered :class:`~.architectures.Architecture` of ``arch``."""
        return architectures.get(self.arch)

    @property
    def hook_name(self) -> str | None:
        """SAELens's name for ``site`` (``sae.cfg.hook_name``), the hook the dictionary reads."""
        return self.site

    @property
    def width_out(self) -> int:
        """``d_out``, or ``d_in`` for an SAE."""
        return self.d_in if self.d_out is None else self.d_out

    def to_dict(self) -> dict[str, Any]:
        """The config as plain JSON-able data."""
        return asdict(self)


class Dictionary(nn.Module):
    """A sparse autoencoder or transcoder (see the module docstring for the math and conventions).

    ``encode(x [..., d_in]) -> f [..., d_sae]`` (inference activation), ``decode(f, x) -> x_hat [..., d_out]``,
    ``forward(x) = decode(encode(x), x)``. Parameters are created at the config's sizes; ``init_weights`` draws
    them from a seeded generator.
    """

    def __init__(self, config: DictionaryConfig, *, device: torch.device | str | None = None,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.config = config
        d_in, d_sae, d_out = config.d_in, config.d_sae, config.width_out
        kw = {"device": device, "dtype": dtype}
        self.W_enc = nn.Parameter(torch.zeros(d_in, d_sae, **kw))
        self.b_enc = nn.Parameter(torch.zeros(d_sae, **kw))
        self.W_dec = nn.Parameter(torch.zeros(d_sae, d_out, **kw))
        self.b_dec = nn.Parameter(torch.zeros(d_out, **kw))
        self.W_skip = nn.Parameter(torch.zeros(d_in, d_out, **kw)) if config.kind == "skip_transcoder" else None
        # an architecture's own parameters or buffers (a JumpReLU's log_threshold, a BatchTopK's threshold)
        self.register_parameter("log_threshold", None)
        self.register_buffer("batch_threshold", None)
        if self.spec.setup is not None:
            self.spec.setup(self, kw)

    # ------------------------------------------------------------------ properties
    @property
    def arch(self) -> str:
        """The architecture's name (a key of ``architectures.TABLE``)."""
        return self.config.arch

    @property
    def spec(self) -> Architecture:
        """The registered architecture (its functions: activation, losses, threshold, SAELens mapping)."""
        return self.config.spec

    @property
    def cfg(self) -> DictionaryConfig:
        """``config`` under SAELens's name (``sae.cfg``; ``d.cfg.hook_name`` is ``d.config.site``)."""
        return self.config

    def extra_repr(self) -> str:
        """What ``repr(d)`` shows: architecture, kind, sizes, ``k``, sites, and the model it was trained on."""
        c = self.config
        parts = [f"arch={c.arch!r}", f"kind={c.kind!r}", f"d_in={c.d_in}", f"d_sae={c.d_sae}"]
        if c.kind != "sae":
            parts.append(f"d_out={c.width_out}")
        if c.k is not None:
            parts.append(f"k={c.k}")
        parts.append(f"site={c.site!r}")
        if c.kind != "sae":
            parts.append(f"site_out={c.site_out!r}")
        if c.metadata.get("model"):
            parts.append(f"model={str(c.metadata['model'])!r}")
        return ", ".join(parts)

    @property
    def is_sae(self) -> bool:
        """True when the dictionary reconstructs its own input (``kind == "sae"``)."""
        return self.config.kind == "sae"

    @property
    def threshold(self) -> torch.Tensor | None:
        """Per-latent inference threshold ``[d_sae]`` of architectures that have one (JumpReLU, BatchTopK); None
        otherwise."""
        return None if self.spec.threshold is None else self.spec.threshold(self)

    # ------------------------------------------------------------------ init
    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None, *, decoder_norm: float | None = None,
                     jumprelu_threshold: float = 0.01) -> None:
        """SAELens's initialisation: ``W_dec`` Kaiming-uniform, rows rescaled to ``decoder_norm`` (default 1 for
        unit-norm architectures, 0.1 for ``relu`` as SAELens's ``decoder_init_norm``), ``W_enc = W_dec.T`` for an
        SAE (a transcoder draws its own Kaiming-uniform ``W_enc``), biases and ``W_skip`` zero, JumpReLU
        thresholds at ``jumprelu_threshold`` (SAELens's ``jumprelu_init_threshold``)."""
        cfg = self.config
        if decoder_norm is None:
            decoder_norm = 1.0 if self.spec.unit_norm_decoder else 0.1
        w = _kaiming_uniform(cfg.d_sae, cfg.width_out, generator, self.W_dec)
        self.W_dec.copy_(w / w.norm(dim=-1, keepdim=True) * decoder_norm)
        if self.is_sae:
            self.W_enc.copy_(self.W_dec.T)
        else:
            self.W_enc.copy_(_kaiming_uniform(cfg.d_in, cfg.d_sae, generator, self.W_enc))
        self.b_enc.zero_()
        self.b_dec.zero_()
        if self.W_skip is not None:
            self.W_skip.zero_()
        if self.spec.init is not None:
            self.spec.init(self, jumprelu_threshold)

    # ------------------------------------------------------------------ forward
    def pre_activation(self, x: torch.Tensor) -> torch.Tensor:
        """``h [..., d_sae]``: ``(x - b_dec) @ W_enc + b_enc`` (SAE) or ``x @ W_enc + b_enc`` (transcoder)."""
        x = x.to(self.W_enc.dtype)
        if self.is_sae:
            x = x - self.b_dec
        return x @ self.W_enc + self.b_enc

    def activate(self, h: torch.Tensor) -> torch.Tensor:
        """Inference activation of pre-activations ``h [..., d_sae]`` (the architecture's ``activate``)."""
        return self.spec.activate(self, h)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Latent activations ``f [..., d_sae]`` of inputs ``x [..., d_in]``."""
        return self.activate(self.pre_activation(x))

    def decode(self, f: torch.Tensor, x: torch.Tensor | None = None) -> torch.Tensor:
        """Reconstruction ``[..., d_out]``: ``f @ W_dec + b_dec`` (plus ``x @ W_skip`` for a skip transcoder,
        which then needs its input ``x [..., d_in]``)."""
        out = f @ self.W_dec + self.b_dec
        if self.W_skip is not None:
            if x is None:
                raise ValueError("a skip transcoder's decode needs its input x")
            out = out + x.to(self.W_skip.dtype) @ self.W_skip
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``decode(encode(x), x)``: ``[..., d_in] -> [..., d_out]``."""
        return self.decode(self.encode(x), x)

    # ------------------------------------------------------------------ weight maintenance
    @torch.no_grad()
    def normalise_decoder(self) -> None:
        """Set every decoder row to unit norm (a no-op on rows of norm 0)."""
        norms = self.W_dec.norm(dim=-1, keepdim=True)
        self.W_dec.div_(torch.where(norms > 0, norms, torch.ones_like(norms)))

    @torch.no_grad()
    def remove_parallel_gradient(self) -> None:
        """Project out of ``W_dec``'s gradient its component along each (unit-norm) row, so that an Adam step
        followed by ``normalise_decoder`` moves rows on the sphere (dictionary_learning's
        ``remove_gradient_parallel_to_decoder_directions``)."""
        if self.W_dec.grad is None:
            return
        unit = self.W_dec / self.W_dec.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        self.W_dec.grad -= (self.W_dec.grad * unit).sum(-1, keepdim=True) * unit

    @torch.no_grad()
    def fold_scaling(self, scale_in: float, scale_out: float | None = None) -> None:
        """Fold an input normalisation into the weights: a dictionary trained on ``x * scale_in`` predicting
        ``y * scale_out`` becomes one that reads ``x`` and predicts ``y`` with the same latent activations
        (SAELens's ``fold_activation_norm_scaling_factor``: ``W_enc *= s``, ``W_dec /= s``, ``b_dec /= s``;
        thresholds unchanged). ``scale_out`` defaults to ``scale_in`` (an SAE)."""
        s_in, s_out = float(scale_in), float(scale_in if scale_out is None else scale_out)
        if self.is_sae and s_in != s_out:
            raise ValueError("an SAE reads and predicts one site: scale_in must equal scale_out")
        self.W_enc.mul_(s_in)
        self.W_dec.div_(s_out)
        self.b_dec.div_(s_out)
        if self.W_skip is not None:
            self.W_skip.mul_(s_in / s_out)


def _kaiming_uniform(rows: int, cols: int, generator: torch.Generator | None, like: torch.Tensor) -> torch.Tensor:
    """``nn.init.kaiming_uniform_`` (a = 0: bound ``sqrt(6 / fan_in)``, fan_in = ``cols``) drawn from
    ``generator`` on the CPU in float32, then moved to ``like``'s device and dtype (the same numbers everywhere)."""
    bound = math.sqrt(6.0 / cols)
    w = torch.rand(rows, cols, generator=generator, dtype=torch.float32) * (2 * bound) - bound
    return w.to(device=like.device, dtype=like.dtype)
