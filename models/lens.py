"""TransformerLens-style conveniences on every bertscope encoder: ``model.cfg``, weights stacked across layers,
``add_hook``/``reset_hooks``, single-token helpers and factored ``QK``/``OV`` circuits.

``Encoder`` inherits :class:`LensMixin`; nothing here holds state of its own except the handles of hooks added
with ``add_hook``. Conventions are TransformerLens' (``HookedTransformer``, ``FactoredMatrix``):

- ``W_Q``/``W_K``/``W_V`` ``[layer, head, d_model, d_head]`` with ``q = x @ W_Q[l, h] + b_Q[l, h]`` where ``x`` is the
  attention sublayer's input (``hook_resid_pre`` in post-LN BERT, ``ln1``'s output in pre-LN models);
  ``W_O`` ``[layer, head, d_head, d_model]``, head ``h`` writes ``z_h @ W_O[l, h]``; ``b_O`` ``[layer, d_model]``.
- ``QK = W_Q @ W_K^T`` and ``OV = W_V @ W_O``, both ``[layer, head, d_model, d_model]``, kept factored.
- ``W_in`` ``[layer, d_model, d_mlp]``, ``W_out`` ``[layer, d_mlp, d_model]``: ``x @ W_in``, i.e. the transpose of
  ``nn.Linear``'s weight.

Shapes: ``l`` layer, ``h`` head, ``m`` d_model, ``d`` d_head, ``f`` d_mlp.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import Any, Literal

import torch

Tensor = torch.Tensor


# ====================================================================== cfg
class LensConfig:
    """TransformerLens' ``HookedTransformerConfig`` names, read live from a model's ``EncoderConfig`` (nothing is
    copied, so nothing can drift): ``model.cfg.n_layers is model.config.n_layers``.

    Every ``EncoderConfig`` field is also readable under its own name (``model.cfg.layer_norm_eps``). The object is
    read-only; change a model's shape by building a new ``EncoderConfig``.
    """

    #: TransformerLens name -> EncoderConfig attribute (same meaning, different spelling)
    ALIASES = {
        "d_vocab": "vocab_size",
        "d_vocab_out": "vocab_size",
        "n_ctx": "max_length",
        "act_fn": "activation",
        "eps": "layer_norm_eps",
        "normalization_placement": "norm_placement",
    }

    def __init__(self, model: Any) -> None:
        object.__setattr__(self, "_model", model)

    @property
    def _config(self) -> Any:
        return self._model.config

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        config = self._config
        target = self.ALIASES.get(name, name)
        try:
            return getattr(config, target)
        except AttributeError:
            raise AttributeError(
                f"model.cfg has no {name!r}: it offers TransformerLens' names {sorted(self.names())} and every "
                "EncoderConfig field"
            ) from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(
            f"model.cfg is a read-only view of model.config (an EncoderConfig); build a new config with "
            f"model.config.replace({name}=...) and a new model instead"
        )

    # names computed rather than renamed -------------------------------------------------------------------
    @property
    def normalization_type(self) -> str:
        """``"LN"``: every family normalises with a LayerNorm that has a learned scale (TransformerLens' name).
        Where it sits is ``normalization_placement`` (``"post"`` BERT, ``"pre"`` ModernBERT and the tutorials)."""
        return "LN"

    @property
    def positional_embedding_type(self) -> str:
        """``"standard"`` (learned table added to the embeddings), ``"sinusoidal"``, ``"rotary"`` (ModernBERT) or
        ``"relative"`` (DeBERTa's disentangled attention; ``"standard+relative"`` when it also adds a table)."""
        c = self._config
        if c.arch == "modernbert":
            return "rotary"
        if c.arch == "deberta-v2" and c.relative_attention:
            return "standard+relative" if c.position_biased_input else "relative"
        return "standard" if c.position_encoding == "learned" else "sinusoidal"

    @property
    def gated_mlp(self) -> bool:
        """True for ModernBERT's GeGLU MLP (then ``model.W_gate`` exists)."""
        return self._config.arch == "modernbert"

    @property
    def attn_only(self) -> bool:
        """Always False: every block has an MLP."""
        return False

    @property
    def original_architecture(self) -> str:
        """The checkpoint's ``model_type`` (``"bert"``, ``"roberta"``, ``"albert"``, ``"deberta-v2"``, ...)."""
        return self._config.model_type

    @property
    def model_name(self) -> str:
        """The model's name: the last folder of the checkpoint it was loaded from (never the full local path), a
        hub id as given, or ``"random initialisation ..."``."""
        source = str(getattr(self._model, "source", "") or type(self._model).__name__)
        kind, _, rest = source.partition(":")
        path = rest if rest and len(kind) < 16 and " " not in kind else source
        if path.startswith(("/", ".", "~")) or path.count("/") > 1:
            parts = [p for p in path.replace("\\", "/").split("/") if p not in ("", ".", "..", "~", "model")]
            return parts[-1] if parts else path
        return source

    @property
    def device(self) -> torch.device:
        """Where the parameters are (the model's, live)."""
        return self._model.device

    @property
    def dtype(self) -> torch.dtype:
        """The parameters' dtype (the model's, live)."""
        return self._model.dtype

    @property
    def d_head(self) -> int:
        """``d_model // n_heads``."""
        return self._config.d_head

    @classmethod
    def names(cls) -> list[str]:
        """TransformerLens names this view answers besides the ``EncoderConfig`` fields."""
        computed = [n for n, v in vars(cls).items() if isinstance(v, property) and not n.startswith("_")]
        return sorted(set(cls.ALIASES) | set(computed) | {"n_layers", "n_heads", "d_model", "d_mlp"})

    def to_dict(self) -> dict[str, Any]:
        """The TransformerLens names and their values (device and dtype as strings)."""
        return {n: (str(v) if isinstance(v, (torch.device, torch.dtype)) else v)
                for n in self.names() for v in [getattr(self, n)]}  # fmt: skip

    def __repr__(self) -> str:
        return "LensConfig(" + ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items()) + ")"


# ====================================================================== factored matrices
class FactoredMatrix:
    """A matrix kept as the product ``A @ B`` of ``A`` ``[..., ldim, mdim]`` and ``B`` ``[..., mdim, rdim]``
    (TransformerLens' ``FactoredMatrix`` conventions): the product is formed only when asked for (``AB``), and the
    SVD, eigenvalues and norm come from the small factors.

    Leading dimensions broadcast; indexing (``QK[3, 5]``) applies to them. ``svd()`` returns ``(U, S, Vh)`` with
    ``AB == U @ diag(S) @ Vh^T`` (TransformerLens' ``Vh`` is ``V``, not its transpose).
    """

    def __init__(self, A: Tensor, B: Tensor) -> None:
        if A.dim() < 2 or B.dim() < 2:
            raise ValueError(f"FactoredMatrix needs matrices, got A {tuple(A.shape)} and B {tuple(B.shape)}")
        if A.shape[-1] != B.shape[-2]:
            raise ValueError(f"inner dimensions differ: A {tuple(A.shape)} @ B {tuple(B.shape)}")
        lead = torch.broadcast_shapes(A.shape[:-2], B.shape[:-2])
        self.A = A.broadcast_to(*lead, *A.shape[-2:])
        self.B = B.broadcast_to(*lead, *B.shape[-2:])
        self.ldim, self.mdim, self.rdim = A.shape[-2], A.shape[-1], B.shape[-1]
        self.shape = torch.Size((*lead, self.ldim, self.rdim))

    @property
    def ndim(self) -> int:
        """Number of dimensions of the (unformed) product, leading ones included."""
        return len(self.shape)

    @property
    def AB(self) -> Tensor:
        """The product ``[..., ldim, rdim]`` (dense; can be large)."""
        return self.A @ self.B

    @property
    def BA(self) -> Tensor:
        """The reverse product ``[..., mdim, mdim]``; needs ``ldim == rdim``."""
        if self.ldim != self.rdim:
            raise ValueError(f"BA needs a square matrix, this one is {tuple(self.shape[-2:])}")
        return self.B @ self.A

    @property
    def T(self) -> FactoredMatrix:
        """The transpose, factored: ``B^T @ A^T``."""
        return FactoredMatrix(self.B.transpose(-2, -1), self.A.transpose(-2, -1))

    @cached_property
    def _svd(self) -> tuple[Tensor, Tensor, Tensor]:
        # SVD of each factor, then of the small [mdim, mdim] core between them: A B = Ua (Sa Va^T Ub Sb) Vb^T.
        Ua, Sa, Vha = torch.linalg.svd(self.A, full_matrices=False)
        Ub, Sb, Vhb = torch.linalg.svd(self.B, full_matrices=False)
        core = Sa[..., :, None] * (Vha @ Ub) * Sb[..., None, :]
        Uc, Sc, Vhc = torch.linalg.svd(core, full_matrices=False)
        return Ua @ Uc, Sc, Vhb.transpose(-2, -1) @ Vhc.transpose(-2, -1)

    def svd(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(U [..., ldim, mdim], S [..., mdim], Vh [..., rdim, mdim])``, ``AB == U @ diag(S) @ Vh^T``, singular
        values descending (TransformerLens' convention, computed without forming ``AB``)."""
        return self._svd

    @property
    def U(self) -> Tensor:
        """Left singular vectors ``[..., ldim, mdim]``."""
        return self._svd[0]

    @property
    def S(self) -> Tensor:
        """Singular values ``[..., mdim]``, descending."""
        return self._svd[1]

    @property
    def Vh(self) -> Tensor:
        """Right singular vectors ``[..., rdim, mdim]`` as columns (TransformerLens' name; ``AB = U diag(S) Vh^T``)."""
        return self._svd[2]

    @property
    def eigenvalues(self) -> Tensor:
        """Eigenvalues ``[..., mdim]`` (complex) of ``BA``, which are those of ``AB`` apart from zeros."""
        ba = self.BA
        if ba.dtype in (torch.float16, torch.bfloat16):
            ba = ba.float()
        return torch.linalg.eigvals(ba)

    def norm(self) -> Tensor:
        """Frobenius norm ``[...]``: the root of the sum of squared singular values."""
        return self.S.pow(2).sum(-1).sqrt()

    def __matmul__(self, other: Tensor | FactoredMatrix) -> Tensor | FactoredMatrix:
        """``self @ other``: a vector ``[rdim]`` gives a vector ``[..., ldim]``; a matrix gives a FactoredMatrix."""
        if isinstance(other, FactoredMatrix):
            return (self @ other.A) @ other.B
        if other.dim() < 2:
            return (self.A @ (self.B @ other.unsqueeze(-1))).squeeze(-1)
        if other.shape[-2] != self.rdim:
            raise ValueError(f"shapes do not chain: {tuple(self.shape)} @ {tuple(other.shape)}")
        return FactoredMatrix(self.A, self.B @ other) if self.rdim > self.mdim else FactoredMatrix(self.AB, other)

    def __rmatmul__(self, other: Tensor) -> Tensor | FactoredMatrix:
        """``other @ self``: a vector ``[ldim]`` gives ``[..., rdim]``; a matrix gives a FactoredMatrix."""
        if other.shape[-1] != self.ldim:
            raise ValueError(f"shapes do not chain: {tuple(other.shape)} @ {tuple(self.shape)}")
        if other.dim() < 2:
            return ((other.unsqueeze(-2) @ self.A) @ self.B).squeeze(-2)
        return FactoredMatrix(other @ self.A, self.B) if self.ldim > self.mdim else FactoredMatrix(other, self.AB)

    def __getitem__(self, idx: Any) -> FactoredMatrix:
        """Index the leading dimensions only (``QK[layer]``, ``QK[layer, head]``)."""
        idx = idx if isinstance(idx, tuple) else (idx,)
        if len([i for i in idx if i is not None and i is not Ellipsis]) > self.ndim - 2:
            raise IndexError(f"{idx} indexes past the leading dimensions of a FactoredMatrix of shape {self.shape}")
        return FactoredMatrix(self.A[idx], self.B[idx])

    def __repr__(self) -> str:
        return f"FactoredMatrix(shape={tuple(self.shape)}, mdim={self.mdim})"


# ====================================================================== the mixin
class LensMixin:
    """TransformerLens' model-level names on a bertscope encoder (see the module docstring for conventions)."""

    # ------------------------------------------------------------------ cfg
    @property
    def cfg(self) -> LensConfig:
        """TransformerLens-style config names (``n_layers``, ``n_heads``, ``d_model``, ``d_head``, ``d_mlp``,
        ``d_vocab``, ``n_ctx``, ``act_fn``, ``normalization_type``/``normalization_placement``, ``model_name``,
        ``device``, ``dtype``, ...), a read-only view of ``model.config``."""
        return LensConfig(self)

    # ------------------------------------------------------------------ stacked weights
    def _stack(self, get: Callable[[Any], Tensor]) -> Tensor:
        """``get(block)`` for every block, stacked on a new leading ``layer`` dimension."""
        return torch.stack([get(block) for block in self.blocks])  # type: ignore[attr-defined]

    @property
    def W_Q(self) -> Tensor:
        """``[layer, head, d_model, d_head]``: ``q[l, h] = x @ W_Q[l, h] + b_Q[l, h]`` (x: the attention input).
        ALBERT's shared layers repeat their group's matrix; raw attention (no projections) gives the fixed
        selection matrices that split ``d_model`` into heads."""
        return self._stack(lambda b: b.attn.W_Q)

    @property
    def W_K(self) -> Tensor:
        """``[layer, head, d_model, d_head]``."""
        return self._stack(lambda b: b.attn.W_K)

    @property
    def W_V(self) -> Tensor:
        """``[layer, head, d_model, d_head]``."""
        return self._stack(lambda b: b.attn.W_V)

    @property
    def W_O(self) -> Tensor:
        """``[layer, head, d_head, d_model]``: head h of layer l writes ``z[l, h] @ W_O[l, h]``."""
        return self._stack(lambda b: b.attn.W_O)

    @property
    def b_Q(self) -> Tensor:
        """``[layer, head, d_head]`` (zeros where the family has no attention biases: ModernBERT)."""
        return self._stack(lambda b: b.attn.b_Q)

    @property
    def b_K(self) -> Tensor:
        """``[layer, head, d_head]``."""
        return self._stack(lambda b: b.attn.b_K)

    @property
    def b_V(self) -> Tensor:
        """``[layer, head, d_head]``."""
        return self._stack(lambda b: b.attn.b_V)

    @property
    def b_O(self) -> Tensor:
        """``[layer, d_model]``: ``attn_out = sum_h z_h @ W_O[l, h] + b_O[l]``."""
        return self._stack(lambda b: b.attn.b_O)

    def _mlp_in(self, block: Any, half: int) -> Linear_:
        fc = block.mlp.fc_in
        w, b = fc.weight, fc.bias
        if self.cfg.gated_mlp:  # GeGLU: fc_in stacks [act input; gate]
            d = self.config.d_mlp  # type: ignore[attr-defined]
            w = w[half * d : (half + 1) * d]
            b = None if b is None else b[half * d : (half + 1) * d]
        elif half:
            raise ValueError(
                f"W_gate/b_gate exist only for gated MLPs (ModernBERT's GeGLU); this {self.cfg.original_architecture} "
                "model's MLP is act(x @ W_in + b_in) @ W_out + b_out"
            )
        return w, b

    @property
    def W_in(self) -> Tensor:
        """``[layer, d_model, d_mlp]``: ``mlp.hook_pre = x @ W_in + b_in`` (for GeGLU, the activation's input
        half; the gate half is ``W_gate``)."""
        return self._stack(lambda b: self._mlp_in(b, 0)[0].T)

    @property
    def W_gate(self) -> Tensor:
        """``[layer, d_model, d_mlp]``: ModernBERT's GeGLU gate, ``mlp.hook_gate = x @ W_gate + b_gate``."""
        return self._stack(lambda b: self._mlp_in(b, 1)[0].T)

    @property
    def b_in(self) -> Tensor:
        """``[layer, d_mlp]`` (zeros where the family's MLP has no biases)."""
        return self._stack(lambda b: _bias_or_zeros(*self._mlp_in(b, 0)))

    @property
    def b_gate(self) -> Tensor:
        """``[layer, d_mlp]``: the GeGLU gate's bias (zeros without MLP biases)."""
        return self._stack(lambda b: _bias_or_zeros(*self._mlp_in(b, 1)))

    @property
    def W_out(self) -> Tensor:
        """``[layer, d_mlp, d_model]``: ``mlp_out = mlp.hook_post @ W_out + b_out``."""
        return self._stack(lambda b: b.mlp.fc_out.weight.T)

    @property
    def b_out(self) -> Tensor:
        """``[layer, d_model]`` (zeros where the family's MLP has no biases)."""
        return self._stack(lambda b: _bias_or_zeros(b.mlp.fc_out.weight, b.mlp.fc_out.bias))

    @property
    def QK(self) -> FactoredMatrix:
        """``[layer, head, d_model, d_model]`` factored as ``W_Q @ W_K^T``: the bilinear form of each head's
        content score ``x_q @ QK @ x_k^T`` (before the ``1/sqrt(d_head)`` scale, without biases; DeBERTa's
        relative terms and ModernBERT's rotation are not in it)."""
        return FactoredMatrix(self.W_Q, self.W_K.transpose(-2, -1))

    @property
    def OV(self) -> FactoredMatrix:
        """``[layer, head, d_model, d_model]`` factored as ``W_V @ W_O``: what head h of layer l writes for a key
        position's input ``x``, weighted by attention (``x @ OV``, biases aside)."""
        return FactoredMatrix(self.W_V, self.W_O)

    # ------------------------------------------------------------------ hooks
    def add_hook(
        self,
        name: str | list[str] | Callable[[str], bool],
        hook: Callable[..., Tensor | None],
        dir: Literal["fwd", "bwd"] = "fwd",
        is_permanent: bool = False,
    ) -> None:
        """Add a forward hook ``hook(tensor, hook_point)`` to the hook point(s) ``name`` (an exact name, a glob
        like ``"blocks.*.attn.hook_pattern"``, a list, or a predicate on names) until ``reset_hooks()``.

        The same hooks as ``model.hooks(...)`` / ``run_with_hooks``, left in place instead of scoped to a block.
        ``is_permanent=True`` hooks survive ``reset_hooks()`` unless ``including_permanent=True``. Backward hooks
        (``dir="bwd"``) are not a second mechanism here: gradients at hook points come from
        ``run_with_cache(..., incl_bwd=True)``."""
        if dir != "fwd":
            raise NotImplementedError(
                f"add_hook(dir={dir!r}): bertscope has forward hooks only; for gradients at hook points use "
                "model.run_with_cache(inputs, names_filter=..., incl_bwd=True, loss_fn=...)"
            )
        handles = self.__dict__.setdefault("_lens_hooks", [])
        for n in self.select_hooks(name):  # type: ignore[attr-defined]
            handles.append((self.hook_dict[n].add_hook(hook), is_permanent))  # type: ignore[attr-defined]

    def reset_hooks(self, including_permanent: bool = False) -> None:
        """Remove the hooks added with ``add_hook`` (permanent ones too if ``including_permanent``). Hooks scoped
        by ``model.hooks(...)`` / ``run_with_hooks`` / ``run_with_cache`` remove themselves and are not touched."""
        kept = []
        for handle, permanent in self.__dict__.get("_lens_hooks", []):
            if permanent and not including_permanent:
                kept.append((handle, permanent))
            else:
                handle.remove()
        self.__dict__["_lens_hooks"] = kept

    # ------------------------------------------------------------------ tokens
    def _need_tokenizer(self, what: str) -> Any:
        tok = getattr(self, "tokenizer", None)
        if tok is None:
            raise RuntimeError(f"this model has no tokenizer; {what} needs one")
        return tok

    def to_single_token(self, string: str) -> int:
        """The id of ``string`` when the tokenizer makes it exactly one piece (no [CLS]/[SEP] added):
        ``to_single_token("cat")`` -> 4937. Raises ``ValueError`` naming the pieces when it makes several or none
        (e.g. ``"cats"`` in a vocabulary without it; a continuation piece is spelled ``"##s"``)."""
        tok = self._need_tokenizer("to_single_token")
        if not isinstance(string, str):
            raise TypeError(f"to_single_token takes a string, got {type(string).__name__}")
        if string in tok.get_vocab():  # a piece as the vocabulary spells it ("##s", "[MASK]", "Ġcat")
            return int(tok.convert_tokens_to_ids(string))
        ids = tok(string, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            pieces = tok.convert_ids_to_tokens(ids)
            raise ValueError(f"{string!r} is not a single token: the tokenizer makes {len(ids)} pieces {pieces}")
        return int(ids[0])

    def to_string(self, tokens: Tensor | list[int] | int) -> str | list[str]:
        """Decode ids to text: ``[pos]`` (or a list of ints, or one int) -> ``str``; ``[batch, pos]`` -> one
        string per row. As TransformerLens: special tokens kept (``"[CLS] the cat. [SEP]"``) and the tokenizer's
        ``decode`` with ``clean_up_tokenization_spaces=False``."""
        tok = self._need_tokenizer("to_string")
        ids = torch.as_tensor(tokens)
        if ids.dim() == 0:
            ids = ids[None]
        if ids.dim() == 1:
            return tok.decode(ids.tolist(), clean_up_tokenization_spaces=False)
        if ids.dim() == 2:
            return [tok.decode(row, clean_up_tokenization_spaces=False) for row in ids.tolist()]
        raise ValueError(f"to_string takes ids [pos] or [batch, pos], got shape {tuple(ids.shape)}")

    def get_token_position(
        self,
        single_token: str | int,
        input: str | Tensor,  # noqa: A002 (TransformerLens' name)
        mode: Literal["first", "last"] = "first",
    ) -> int:
        """Position of ``single_token`` (a string that is one piece, or an id) in ``input`` (text, tokenised as
        ``model(text)`` sees it, [CLS] at 0; or ids ``[pos]`` / ``[1, pos]``). ``mode`` picks the ``"first"`` or
        ``"last"`` occurrence. Raises ``ValueError`` when the token does not occur, or is several pieces."""
        if mode not in ("first", "last"):
            raise ValueError(f"mode must be 'first' or 'last', got {mode!r}")
        token = self.to_single_token(single_token) if isinstance(single_token, str) else int(single_token)
        if isinstance(input, str):
            ids = self.to_tokens(input)["input_ids"][0]  # type: ignore[attr-defined]
        else:
            ids = torch.as_tensor(input)
            if ids.dim() == 2:
                if ids.shape[0] != 1:
                    raise ValueError(f"get_token_position takes one sequence, got a batch of {ids.shape[0]}")
                ids = ids[0]
            if ids.dim() != 1:
                raise ValueError(f"input ids must be [pos] or [1, pos], got shape {tuple(ids.shape)}")
        where = (ids == token).nonzero().flatten()
        if where.numel() == 0:
            name = self.tokenizer.convert_ids_to_tokens(token) if self.tokenizer is not None else token  # type: ignore
            raise ValueError(f"token {name!r} (id {token}) does not occur in the input")
        return int(where[0] if mode == "first" else where[-1])


Linear_ = tuple[Tensor, Tensor | None]


def _bias_or_zeros(weight: Tensor, bias: Tensor | None) -> Tensor:
    """``bias`` or zeros ``[out_features]`` shaped like a missing one (ModernBERT has no biases)."""
    return bias if bias is not None else weight.new_zeros(weight.shape[0])
