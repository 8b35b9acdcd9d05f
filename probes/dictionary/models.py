"""Sparse dictionaries: sparse autoencoders and transcoders, one module for every architecture.

Shapes: ``W_enc [d_in, d_sae]``, ``b_enc [d_sae]``, ``W_dec [d_sae, d_out]``, ``b_dec [d_out]``,
``W_skip [d_in, d_out]`` (skip transcoders only), ``threshold [d_sae]`` (JumpReLU, and BatchTopK at inference).
An SAE has ``d_out == d_in`` and reads and predicts the same site; a transcoder reads a block's MLP input and
predicts its MLP output.

Conventions (SAELens 6.x, ``sae_lens/saes/*.py``, read for each architecture):

- pre-activation ``h = (x - b_dec) @ W_enc + b_enc`` for SAEs (SAELens ``apply_b_dec_to_input=True``);
  ``h = x @ W_enc + b_enc`` for transcoders (SAELens forbids ``apply_b_dec_to_input`` there);
- ``relu``: ``f = ReLU(h)`` (SAELens ``standard``);
- ``topk``: keep the ``k`` largest entries of ``h`` per row, then ReLU (SAELens ``TopK``);
- ``batchtopk``: in training keep the ``k * rows`` largest entries of ``ReLU(h)`` over the whole batch (SAELens
  ``BatchTopK``); at inference ``f = ReLU(h) * (h > threshold)`` with one threshold for every latent, the running
  average of the smallest kept activation (SAELens saves it as a ``jumprelu`` SAE);
- ``jumprelu``: ``f = h * (h > threshold)``, ``threshold = exp(log_threshold) > 0`` (SAELens ``JumpReLU``);
- reconstruction ``x_hat = f @ W_dec + b_dec`` (``+ x @ W_skip`` for skip transcoders).

Decoder rows are kept at unit norm for ``topk``, ``batchtopk`` and ``jumprelu`` (OpenAI's TopK paper, Bussmann
et al.'s BatchTopK and Rajamanoharan et al.'s JumpReLU all constrain them); ``relu`` leaves them free and weights
its L1 penalty by them instead (SAELens ``standard``: ``sum_i f_i * ||W_dec[i]||``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

ARCHITECTURES = ("relu", "topk", "batchtopk", "jumprelu")
KINDS = ("sae", "transcoder", "skip_transcoder")
#: Architectures whose decoder rows are held at unit norm during training.
UNIT_NORM_DECODER = ("topk", "batchtopk", "jumprelu")


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
    arch: str = "topk"
    k: int | None = None
    kind: str = "sae"
    d_out: int | None = None
    site: str | None = None
    site_out: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.arch not in ARCHITECTURES:
            raise ValueError(f"arch must be one of {ARCHITECTURES}, got {self.arch!r}")
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.d_in < 1 or self.d_sae < 1:
            raise ValueError(f"d_in and d_sae must be positive, got {self.d_in} and {self.d_sae}")
        if self.arch in ("topk", "batchtopk"):
            if self.k is None or not 0 < self.k < self.d_sae:
                raise ValueError(f"{self.arch} needs 0 < k < d_sae (width {self.d_sae}), got k={self.k}")
        if self.kind == "sae" and self.d_out not in (None, self.d_in):
            raise ValueError(f"an SAE predicts its own input: d_out must equal d_in ({self.d_in}), got {self.d_out}")
        if self.kind == "transcoder" and self.arch == "topk":
            raise ValueError("a transcoder is relu, jumprelu or batchtopk (SAELens's format has no TopK transcoder)")
        if self.kind == "skip_transcoder" and self.arch != "relu":
            raise ValueError("a skip transcoder is relu (SAELens's skip_transcoder)")
        if self.kind == "sae" and self.site_out not in (None, self.site):
            raise ValueError("an SAE predicts its own site: site_out must equal site")

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
        # JumpReLU learns log(threshold); BatchTopK keeps its inference threshold as a buffer (not trained).
        if config.arch == "jumprelu":
            self.log_threshold = nn.Parameter(torch.full((d_sae,), math.log(0.01), **kw))
        else:
            self.register_parameter("log_threshold", None)
        self.register_buffer("batch_threshold", torch.zeros((), **kw) if config.arch == "batchtopk" else None)

    # ------------------------------------------------------------------ properties
    @property
    def arch(self) -> str:
        """The activation: ``relu``, ``topk``, ``batchtopk`` or ``jumprelu``."""
        return self.config.arch

    @property
    def is_sae(self) -> bool:
        """True when the dictionary reconstructs its own input (``kind == "sae"``)."""
        return self.config.kind == "sae"

    @property
    def threshold(self) -> torch.Tensor | None:
        """Per-latent threshold ``[d_sae]`` of a JumpReLU (or a BatchTopK at inference); None otherwise."""
        if self.arch == "jumprelu":
            return self.log_threshold.exp()
        if self.arch == "batchtopk":
            return self.batch_threshold.expand(self.config.d_sae)
        return None

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
            decoder_norm = 1.0 if cfg.arch in UNIT_NORM_DECODER else 0.1
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
        if self.log_threshold is not None:
            self.log_threshold.fill_(math.log(jumprelu_threshold))
        if self.batch_threshold is not None:
            self.batch_threshold.zero_()

    # ------------------------------------------------------------------ forward
    def pre_activation(self, x: torch.Tensor) -> torch.Tensor:
        """``h [..., d_sae]``: ``(x - b_dec) @ W_enc + b_enc`` (SAE) or ``x @ W_enc + b_enc`` (transcoder)."""
        x = x.to(self.W_enc.dtype)
        if self.is_sae:
            x = x - self.b_dec
        return x @ self.W_enc + self.b_enc

    def activate(self, h: torch.Tensor) -> torch.Tensor:
        """Inference activation of pre-activations ``h [..., d_sae]`` (BatchTopK: its threshold, per token)."""
        if self.arch == "relu":
            return h.relu()
        if self.arch == "topk":
            return topk_activation(h, self.config.k)
        return h.relu() * (h > self.threshold).to(h.dtype)

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


def topk_activation(h: torch.Tensor, k: int) -> torch.Tensor:
    """SAELens's ``TopK``: keep the ``k`` largest entries of ``h [..., d_sae]`` per row, ReLU them, zero the
    rest."""
    values, indices = torch.topk(h, k, dim=-1, sorted=False)
    return torch.zeros_like(h).scatter_(-1, indices, values.relu())


def batch_topk_activation(h: torch.Tensor, k: float) -> torch.Tensor:
    """SAELens's ``BatchTopK``: of ``ReLU(h) [rows, d_sae]`` keep the ``int(k * rows)`` largest entries over the
    whole batch."""
    acts = h.relu()
    flat = acts.flatten()
    kept = torch.topk(flat, int(k * acts.shape[:-1].numel()), dim=-1)
    return torch.zeros_like(flat).scatter(-1, kept.indices, kept.values).reshape(acts.shape)


class TopKEncodeFunction(torch.autograd.Function):
    """The ``k`` largest pre-activations per row, ``(values [rows, k], indices [rows, k])`` of
    ``h = (x - shift) @ W_enc + b_enc`` (an SAE: ``shift = b_dec``; a transcoder: ``shift = None``), with a sparse
    backward: only the ``rows * k`` selected entries carry gradient (as in the dense ``topk`` backward), so
    ``d/dW_enc = G^T (x - shift)`` comes from the sparse ``G [rows, d_sae]`` (``k`` entries a row) instead of a
    dense ``[rows, d_sae]`` matmul, and ``d/dshift = -(sum_rows G) W_enc^T`` (one vector-matrix product; the input
    ``x`` itself gets no gradient: it is data). The same numbers as ``torch.topk(h, k)`` and its autograd, to
    float summation order (``tests/test_dictionary.py``)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, shift: torch.Tensor | None, W_enc: torch.Tensor, b_enc: torch.Tensor,
                k: int) -> tuple[torch.Tensor, torch.Tensor]:
        x_in = x if shift is None else x - shift
        h = torch.addmm(b_enc, x_in, W_enc)
        values, indices = torch.topk(h, k, dim=-1, sorted=False)
        ctx.save_for_backward(x_in, W_enc, indices)
        ctx.mark_non_differentiable(indices)
        return values, indices

    @staticmethod
    def backward(ctx: Any, grad_values: torch.Tensor, _grad_indices: Any) -> tuple[Any, Any, Any, Any, None]:
        x_in, W_enc, indices = ctx.saved_tensors
        d_sae = W_enc.shape[1]
        flat_idx, flat_grad = indices.reshape(-1), grad_values.reshape(-1).contiguous()
        grad_W = grad_shift = None
        grad_b = torch.zeros(d_sae, dtype=grad_values.dtype, device=grad_values.device).index_add_(
            0, flat_idx, flat_grad)
        if ctx.needs_input_grad[2]:
            grad_W = _sparse_rows_t_mm(indices, grad_values, x_in, d_sae).T
        if ctx.needs_input_grad[1]:
            grad_shift = -(W_enc @ grad_b)
        return None, grad_shift, grad_W, grad_b if ctx.needs_input_grad[3] else None, None


class SparseDecodeFunction(torch.autograd.Function):
    """``y = sum_j values[r, j] * W_dec[indices[r, j]]`` per row (``values, indices [rows, k]`` -> ``[rows, d_out]``;
    ``embedding_bag`` in sum mode) with a sparse decoder gradient ``d/dW_dec = G^T grad_y`` (``G [rows, d_sae]``,
    ``k`` entries a row) and ``d/dvalues[r, j] = <W_dec[indices[r, j]], grad_y[r]>``: the same numbers as
    ``embedding_bag``'s autograd, without its dense backward."""

    @staticmethod
    def forward(ctx: Any, values: torch.Tensor, indices: torch.Tensor, W_dec: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(values, indices, W_dec)
        return torch.nn.functional.embedding_bag(indices, W_dec, per_sample_weights=values, mode="sum")

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor) -> tuple[Any, None, Any]:
        values, indices, W_dec = ctx.saved_tensors
        grad_y = grad_y.contiguous()
        grad_values = grad_W = None
        if ctx.needs_input_grad[0]:
            rows, k = indices.shape
            grad_values = _gathered_dot(grad_y, W_dec, indices).reshape(rows, k)
        if ctx.needs_input_grad[2]:
            grad_W = _sparse_rows_t_mm(indices, values, grad_y, W_dec.shape[0])
        return grad_values, None, grad_W


def _sparse_rows_t_mm(indices: torch.Tensor, values: torch.Tensor, dense: torch.Tensor, n_cols: int) -> torch.Tensor:
    """``G^T @ dense`` for the sparse ``G [rows, n_cols]`` holding ``values [rows, k]`` at ``indices [rows, k]``:
    ``[n_cols, d]``."""
    rows, k = indices.shape
    row_ids = torch.arange(rows, device=indices.device).repeat_interleave(k)
    Gt = torch.sparse_coo_tensor(torch.stack([indices.reshape(-1), row_ids]), values.reshape(-1).to(dense.dtype),
                                 (n_cols, rows), check_invariants=False)
    return torch.sparse.mm(Gt, dense)


def _gathered_dot(grad_y: torch.Tensor, W: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """``<W[indices[r, j]], grad_y[r]>`` flattened ``[rows * k]``: ``embedding_bag``'s own per-sample-weight
    backward kernel where torch has it, a gather otherwise."""
    rows, k = indices.shape
    flat = indices.reshape(-1)
    op = getattr(torch.ops.aten, "_embedding_bag_per_sample_weights_backward", None)
    if op is not None:
        try:
            offsets = torch.arange(0, rows * k, k, device=indices.device)
            bag = torch.arange(rows, device=indices.device).repeat_interleave(k)
            return op(grad_y, W, flat, offsets, bag, 0, -1)
        except (RuntimeError, TypeError):  # pragma: no cover - another torch's signature
            pass
    return torch.einsum("rkd,rd->rk", W[indices], grad_y).reshape(-1)  # pragma: no cover


def _rectangle(x: torch.Tensor) -> torch.Tensor:
    return ((x > -0.5) & (x < 0.5)).to(x)


class JumpReLUFunction(torch.autograd.Function):
    """``h * (h > t)`` with SAELens's straight-through threshold gradient: ``d/dt = -(t / bandwidth) *
    rect((h - t) / bandwidth)`` summed over rows; the gradient to ``h`` is ``(h > t)`` (no STE on ``h``)."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, threshold: torch.Tensor, bandwidth: float) -> torch.Tensor:
        ctx.save_for_backward(h, threshold)
        ctx.bandwidth = bandwidth
        return h * (h > threshold).to(h)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        h, threshold = ctx.saved_tensors
        bw = ctx.bandwidth
        grad_h = (h > threshold).to(h) * grad
        grad_t = (-(threshold / bw) * _rectangle((h - threshold) / bw) * grad).sum(dim=0)
        return grad_h, grad_t, None


class StepFunction(torch.autograd.Function):
    """``(h > t)`` with SAELens's straight-through threshold gradient ``-(1 / bandwidth) * rect((h - t) /
    bandwidth)`` (the L0 penalty of a JumpReLU SAE, ``jumprelu_sparsity_loss_mode="step"``)."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, threshold: torch.Tensor, bandwidth: float) -> torch.Tensor:
        ctx.save_for_backward(h, threshold)
        ctx.bandwidth = bandwidth
        return (h > threshold).to(h)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, torch.Tensor, None]:
        h, threshold = ctx.saved_tensors
        bw = ctx.bandwidth
        return None, (-(1.0 / bw) * _rectangle((h - threshold) / bw) * grad).sum(dim=0), None


def _kaiming_uniform(rows: int, cols: int, generator: torch.Generator | None, like: torch.Tensor) -> torch.Tensor:
    """``nn.init.kaiming_uniform_`` (a = 0: bound ``sqrt(6 / fan_in)``, fan_in = ``cols``) drawn from
    ``generator`` on the CPU in float32, then moved to ``like``'s device and dtype (the same numbers everywhere)."""
    bound = math.sqrt(6.0 / cols)
    w = torch.rand(rows, cols, generator=generator, dtype=torch.float32) * (2 * bound) - bound
    return w.to(device=like.device, dtype=like.dtype)
