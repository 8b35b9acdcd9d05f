"""The logit lens for masked LMs: any layer's residual stream read through the family's own masked-LM head.

Layers are numbered as transformers' ``hidden_states``: stream ``0`` is the embeddings' output (the input of block 0,
``blocks.0.hook_resid_pre``), stream ``k`` (1..n_layers) is block ``k - 1``'s output (``blocks.{k-1}.hook_resid_post``).
A pre-LN model (ModernBERT, the pre-LN tutorial encoders) applies its final LayerNorm (``ln_final``) before the head,
as its forward pass does; a post-LN model (BERT, RoBERTa, ...) reads the stream as it is. So the last stream's lens
is ``model.mlm_logits(model(x))`` bit for bit.

The head is the family's (BERT's dense, GELU, LayerNorm and tied decoder; RoBERTa/XLM-R's ``lm_head``; DistilBERT's
``vocab_*``; ALBERT's and ELECTRA-generator's ``predictions``; DeBERTa's and ModernBERT's own), called through
``Encoder.mlm_logits``; ``bias=False`` leaves out its output bias (Kobayashi et al. 2023, "Transformer language models
handle word frequency in prediction head": the bias carries word frequency).

Shapes: ``s`` stream (n_layers + 1), ``b`` batch, ``p`` position, ``m`` d_model, ``v`` vocab.
"""

from __future__ import annotations

from typing import Any

import torch
from bertscope.models.text import as_batch


class NoMLMHeadError(ValueError):
    """The model has no masked-LM head (the bundled sentence encoder, an ELECTRA discriminator, a base model)."""


def require_mlm_head(model: Any, what: str = "this readout") -> None:
    """Raise ``NoMLMHeadError`` (one line) unless ``model`` has a masked-LM head."""
    if getattr(model, "mlm_head", None) is None:
        source = getattr(model, "source", "the model")
        raise NoMLMHeadError(
            f"{source} has no masked-LM head, which {what} needs: load a checkpoint saved from a *ForMaskedLM "
            "model (an ELECTRA discriminator or a sentence encoder has none)"
        )


def n_streams(model: Any) -> int:
    """Residual streams the lens reads: ``n_layers + 1`` (the embeddings, then every block's output)."""
    return model.config.n_layers + 1


def stream_hook(model: Any, stream: int) -> str:
    """The hook name of residual stream ``stream``: 0 is ``blocks.0.hook_resid_pre``, k is
    ``blocks.{k-1}.hook_resid_post``."""
    if not 0 <= stream < n_streams(model):
        raise ValueError(f"stream must be in 0..{n_streams(model) - 1}, got {stream}")
    return "blocks.0.hook_resid_pre" if stream == 0 else f"blocks.{stream - 1}.hook_resid_post"


@torch.no_grad()
def hidden_states(
    model: Any,
    input_ids: Any,
    attention_mask: torch.Tensor | None = None,
    token_type_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Every residual stream of one forward pass, ``[stream, batch, pos, d_model]`` (``stream`` = n_layers + 1).

    ``input_ids`` is what ``model`` takes (token ids ``[batch, pos]`` with their mask, text, or a mapping)."""
    input_ids, attention_mask, token_type_ids = as_batch(model, input_ids, attention_mask, token_type_ids)
    names = [stream_hook(model, s) for s in range(n_streams(model))]
    _, cache = model.run_with_cache(input_ids, attention_mask, token_type_ids, names_filter=names)
    return torch.stack([cache[n] for n in names])


def final_norm(model: Any, hidden: torch.Tensor) -> torch.Tensor:
    """What the model's forward applies after its last block: ``ln_final`` for pre-LN models, nothing for post-LN."""
    ln = getattr(model, "ln_final", None)
    return hidden if ln is None else ln(hidden)


def logit_lens(model: Any, hidden: torch.Tensor, *, bias: bool = True) -> torch.Tensor:
    """Read residual-stream vectors ``hidden`` ``[..., d_model]`` through the model's masked-LM head: logits
    ``[..., vocab]``. ``bias=False`` leaves out the head's output bias. Refuses a model without a head."""
    require_mlm_head(model, "the logit lens")
    if hidden.shape[-1] != model.config.d_model:
        raise ValueError(f"hidden must be [..., {model.config.d_model}], got {tuple(hidden.shape)}")
    return model.mlm_logits(final_norm(model, hidden), bias=bias)


@torch.no_grad()
def logit_lens_streams(
    model: Any,
    input_ids: Any,
    attention_mask: torch.Tensor | None = None,
    token_type_ids: torch.Tensor | None = None,
    *,
    bias: bool = True,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """Logit lens of every stream: ``[stream, batch, pos, vocab]``, or ``[stream, n, vocab]`` at the ``n`` positions
    where the boolean ``positions`` ``[batch, pos]`` is True (saves memory with a large vocabulary)."""
    require_mlm_head(model, "the logit lens")
    hidden = hidden_states(model, input_ids, attention_mask, token_type_ids)
    if positions is not None:
        hidden = hidden[:, positions.to(hidden.device)]
    return torch.stack([logit_lens(model, h, bias=bias) for h in hidden])
