"""Text in: the one step that turns what a caller passes to a model into ``(input_ids, attention_mask,
token_type_ids)``.

``Encoder.forward`` (and so ``run_with_cache`` and ``run_with_hooks``) accepts, as its first argument:

- a ``str`` or a list of ``str``: tokenised with the model's tokenizer (``[CLS] ... [SEP]``, padded on the
  right, the attention mask and token types taken from the tokenizer);
- a mapping such as ``model.to_tokens(...)`` or a tokenizer's ``BatchEncoding``: its ``input_ids``,
  ``attention_mask`` and ``token_type_ids`` entries;
- token ids ``[batch, pos]`` (a tensor), with the mask and token types as separate arguments.

Text and mappings already carry their mask and token types, so passing them again is an error (two sources
of truth would silently disagree).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

TextInput = str | list[str] | tuple[str, ...]
BATCH_KEYS = ("input_ids", "attention_mask", "token_type_ids")


def is_text(x: Any) -> bool:
    """True for a string or a non-empty list/tuple of strings."""
    return isinstance(x, str) or (isinstance(x, (list, tuple)) and len(x) > 0 and all(isinstance(t, str) for t in x))


def as_batch(
    model: Any,
    inputs: Any,
    attention_mask: torch.Tensor | None = None,
    token_type_ids: torch.Tensor | None = None,
) -> tuple[Any, torch.Tensor | None, torch.Tensor | None]:
    """``(input_ids, attention_mask, token_type_ids)`` from text, a mapping of those names, or token ids.

    Token ids pass through unchanged (the model checks them); text is tokenised with ``model.tokenize``.
    """
    if isinstance(inputs, (list, tuple)) and not is_text(inputs):
        if not inputs:
            raise ValueError("no text: got an empty list; give a string, a list of strings, or token ids")
        kinds = sorted({type(t).__name__ for t in inputs if not isinstance(t, str)})
        raise TypeError(f"a list input must hold strings (texts), got a list with {', '.join(kinds)}; give token ids "
                        "as a torch.Tensor [batch, pos] (e.g. torch.tensor([ids]))")  # fmt: skip
    if is_text(inputs):
        batch = model.tokenize(list(inputs) if isinstance(inputs, tuple) else inputs)
    elif isinstance(inputs, Mapping):
        unknown = sorted(set(inputs) - set(BATCH_KEYS))
        if "input_ids" not in inputs or unknown:
            raise ValueError(
                f"a mapping input needs 'input_ids' and only the keys {BATCH_KEYS}; got {sorted(inputs)}"
            )
        batch = dict(inputs)
    else:
        return inputs, attention_mask, token_type_ids
    if attention_mask is not None or token_type_ids is not None:
        raise ValueError(
            "text and token mappings carry their own attention_mask and token_type_ids; pass them only with "
            "token ids"
        )
    return batch["input_ids"], batch.get("attention_mask"), batch.get("token_type_ids")


def str_tokens(tokenizer: Any, inputs: Any) -> list[str] | list[list[str]]:
    """Word pieces as the model sees them (``[CLS]``, ``##ing`` markers kept), so positions map back to text.

    ``inputs``: a string -> ``list[str]``; a list of strings -> one list per text, without padding (position
    ``i`` of a text is position ``i`` of its row in the padded batch); token ids ``[pos]`` -> ``list[str]``;
    ``[batch, pos]`` -> one list per row, ``[PAD]`` included.
    """
    if tokenizer is None:
        raise RuntimeError("this model has no tokenizer; to_str_tokens needs one")
    if isinstance(inputs, str):
        return tokenizer.convert_ids_to_tokens(tokenizer(inputs)["input_ids"])
    if is_text(inputs):
        return [tokenizer.convert_ids_to_tokens(ids) for ids in tokenizer(list(inputs))["input_ids"]]
    if isinstance(inputs, Mapping):
        inputs = inputs["input_ids"]
    ids = torch.as_tensor(inputs)
    if ids.dim() == 1:
        return tokenizer.convert_ids_to_tokens(ids.tolist())
    if ids.dim() == 2:
        return [tokenizer.convert_ids_to_tokens(row) for row in ids.tolist()]
    raise ValueError(f"token ids must be [pos] or [batch, pos], got shape {tuple(ids.shape)}")
