"""The autograd kernels and activation functions the built-in architectures share (no architecture's name here):
TopK and BatchTopK selections, the sparse TopK encode/decode, and the straight-through JumpReLU and step
functions. Shapes in each docstring; ``rows`` is the flattened token axis.
"""

from __future__ import annotations

from typing import Any

import torch


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
    float summation order (``tests/probes/test_dictionary.py``)."""

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


def warm_up(tokens: int, warm_up_tokens: int) -> float:
    """A coefficient's linear warm-up factor after ``tokens`` tokens (1 without warm-up)."""
    return 1.0 if warm_up_tokens <= 0 else min(1.0, (tokens + 1) / warm_up_tokens)


def auxk_loss(d: Any, h: torch.Tensor, y: torch.Tensor, y_hat: torch.Tensor, dead: torch.Tensor) -> torch.Tensor:
    """SAELens's TopK auxiliary loss without its coefficient: ``min(n_dead / k_aux, 1) * mean_rows sum_d
    (aux_acts @ W_dec + b_dec - (y - y_hat).detach())^2`` with ``k_aux = min(d_in // 2, n_dead)`` largest
    pre-activations ``h [rows, d_sae]`` among the ``dead`` latents (``[d_sae]`` bool)."""
    n_dead = int(dead.sum())
    if n_dead == 0:
        return h.new_zeros(())
    k_aux = d.config.d_in // 2
    scale = min(n_dead / k_aux, 1.0)
    k_aux = min(k_aux, n_dead)
    masked = torch.where(dead[None], h, torch.full_like(h, -torch.inf))
    top = masked.topk(k_aux, dim=-1, sorted=False)
    acts = torch.zeros_like(h).scatter_(-1, top.indices, top.values)
    recon = acts @ d.W_dec + d.b_dec
    return scale * (recon - (y - y_hat).detach()).pow(2).sum(-1).mean()


def auxk_on_dead(d: Any, h_dead: torch.Tensor, cols: torch.Tensor, y: torch.Tensor,
                 y_hat: torch.Tensor) -> torch.Tensor:
    """:func:`auxk_loss` from the dead latents' pre-activations ``h_dead [rows, n_dead]`` (latents ``cols``)."""
    n_dead = int(cols.numel())
    k_aux = d.config.d_in // 2
    scale = min(n_dead / k_aux, 1.0)
    top = h_dead.topk(min(k_aux, n_dead), dim=-1, sorted=False)
    recon = SparseDecodeFunction.apply(top.values, top.indices, d.W_dec[cols]) + d.b_dec
    return scale * (recon - (y - y_hat).detach()).pow(2).sum(-1).mean()


#: The AuxK conventions: ``saelens`` (SAELens's ``calculate_topk_aux_loss``, the default) and ``gao``
#: (openai/sparse_autoencoder's ``train.py``, the code of Gao et al. 2024).
AUXK_VARIANTS = ("saelens", "gao")
#: openai/sparse_autoencoder ``train.py``'s ``Config.auxk`` (dead latents kept per row) and ``auxk_coef``.
GAO_AUX_K, GAO_AUX_COEFFICIENT = 256, 1 / 32


def auxk_gao_on_dead(d: Any, h_dead: torch.Tensor, cols: torch.Tensor, y: torch.Tensor, y_hat: torch.Tensor,
                     aux_k: int = GAO_AUX_K) -> torch.Tensor:
    """Gao et al.'s AuxK without its coefficient, as openai/sparse_autoencoder's ``train.py`` computes it: the
    ``aux_k`` largest pre-activations ``h_dead [rows, n_dead]`` of the dead latents (``cols``), ReLU'd, decoded
    with the bias, against ``(y - y_hat).detach() + b_dec.detach()``, as a normalised MSE (its ``normalized_mse``):
    ``mean((e_hat - e)^2) / mean((e - mean_rows(e))^2)`` with ``e = y - y_hat`` (NaN -> 0). Unlike SAELens's
    (:func:`auxk_loss`): a fixed ``aux_k`` with no ``n_dead / k_aux`` scale, ReLU on the kept values, and the
    residual's variance as the unit."""
    top = h_dead.topk(min(aux_k, int(cols.numel())), dim=-1, sorted=False)
    recon = SparseDecodeFunction.apply(top.values.relu(), top.indices, d.W_dec[cols]) + d.b_dec
    target = (y - y_hat).detach() + d.b_dec.detach()
    mse = (recon - target).pow(2).mean()
    unit = (target - target.mean(0)).pow(2).mean()
    return (mse / unit).nan_to_num(0.0)


def auxk_gao(d: Any, h: torch.Tensor, y: torch.Tensor, y_hat: torch.Tensor, dead: torch.Tensor,
             aux_k: int = GAO_AUX_K) -> torch.Tensor:
    """:func:`auxk_gao_on_dead` from every latent's pre-activations ``h [rows, d_sae]`` and the ``dead [d_sae]``
    mask."""
    if int(dead.sum()) == 0:
        return h.new_zeros(())
    cols = dead.nonzero().squeeze(1)
    return auxk_gao_on_dead(d, h[:, cols], cols, y, y_hat, aux_k)


def auxk_dead_term(d: Any, h_dead: torch.Tensor, cols: torch.Tensor, y: torch.Tensor, y_hat: torch.Tensor,
                   settings: Any) -> torch.Tensor:
    """AuxK of the chosen convention (``settings.auxk``: ``saelens`` or ``gao``, its ``aux_k``) times
    ``settings.aux_coefficient``, from the dead latents' pre-activations."""
    if getattr(settings, "auxk", "saelens") == "gao":
        return settings.aux_coefficient * auxk_gao_on_dead(d, h_dead, cols, y, y_hat, settings.aux_k)
    return settings.aux_coefficient * auxk_on_dead(d, h_dead, cols, y, y_hat)


def auxk_term(d: Any, h: torch.Tensor, y: torch.Tensor, y_hat: torch.Tensor, dead: torch.Tensor | None,
              settings: Any) -> torch.Tensor | None:
    """AuxK with its coefficient (``settings.aux_coefficient``) when some latent is dead; None otherwise
    (``settings.auxk`` picks SAELens's convention or Gao et al.'s, :func:`auxk_dead_term`)."""
    if dead is None or int(dead.sum()) == 0:
        return None
    cols = dead.nonzero().squeeze(1)
    if getattr(settings, "auxk", "saelens") == "gao":
        return settings.aux_coefficient * auxk_gao_on_dead(d, h[:, cols], cols, y, y_hat, settings.aux_k)
    return settings.aux_coefficient * auxk_loss(d, h, y, y_hat, dead)
