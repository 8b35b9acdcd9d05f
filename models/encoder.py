"""A BERT-family encoder written from scratch, with a hook point on every tensor worth studying.

Real BERT is post-LayerNorm with learned positions and learned Q/K/V/O projections; the tutorials'
pre-LayerNorm, sinusoidal and raw-attention variants are switches on ``EncoderConfig``.

Shapes: ``b`` batch, ``p`` position (``q``/``k`` for query/key positions), ``h`` head, ``d`` d_head,
``m`` d_model, ``f`` d_mlp.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from bertscope.hooks.hook_points import HookedModule, HookPoint
from bertscope.hooks.sites import parse_site
from bertscope.models.config import EncoderConfig
from bertscope.models.lens import LensMixin
from bertscope.models.text import as_batch, str_tokens
from einops import rearrange
from torch import nn

AttentionImpl = Literal["auto", "explicit"]


class Encoder(LensMixin, HookedModule):
    """BERT encoder: embeddings, ``n_layers`` blocks, optional pooler and masked-LM head.

    ``forward`` returns the last hidden state ``[batch, pos, d_model]``. Hooks: see ``hook_names()`` and
    ``docs/hooks.md``. Built at random initialisation; ``models.load`` fills it from a checkpoint.
    """

    def __init__(self, config: EncoderConfig, *, pooler: bool = False, mlm_head: bool = False) -> None:
        super().__init__()
        self.config = config
        self.embed = Embeddings(config)
        self.blocks = nn.ModuleList([Block(config) for _ in range(config.n_layers)])
        _share_layer_groups(self.blocks, config)
        self.ln_final = LayerNorm(config.d_model, config.layer_norm_eps) if config.norm_placement == "pre" else None
        self.pooler = Pooler(config) if pooler else None
        self.mlm_head = MLMHead(config) if mlm_head else None
        self._finish_init(lambda names: sorted(names, key=lambda name: _forward_rank(name, config)))

    def _finish_init(self, forward_order: Callable[[list[str]], list[str]]) -> None:
        """The end of every encoder's ``__init__`` (this class's, DeBERTa's, ModernBERT's), once its modules exist:
        no tokenizer or weight files yet, hook points named and listed in the order ``forward_order`` gives (hook
        names -> the same names in the order the forward pass reaches them), BERT's initialisation."""
        self.tokenizer: Any = None
        self.current_attention_mask: torch.Tensor | None = None  # set while blocks run: [batch, pos] or None
        self.source: str = "random initialisation"
        self.weight_files: list[Path] = []
        self._weights_sha256: str | None = None
        self.setup_hooks()
        self.hook_dict = {name: self.hook_dict[name] for name in forward_order(list(self.hook_dict))}
        self.init_weights()

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        input_ids: torch.Tensor | str | list[str] | dict[str, torch.Tensor],
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        *,
        stop_at_layer: int | None = None,
    ) -> torch.Tensor:
        """Last hidden state ``[batch, pos, d_model]``.

        ``input_ids`` ``[batch, pos]``; ``attention_mask`` ``[batch, pos]`` (1 = real token, 0 = padding);
        ``token_type_ids`` ``[batch, pos]`` (segment A = 0, B = 1). ``stop_at_layer=k`` runs blocks
        ``0..k`` inclusive and returns block k's ``hook_resid_post`` (no final LayerNorm in pre-LN models).
        ``input_ids`` may also be text (``str`` or ``list[str]``) or a mapping like ``to_tokens``' result.
        """
        input_ids, attention_mask, token_type_ids = as_batch(self, input_ids, attention_mask, token_type_ids)
        input_ids, attention_mask, token_type_ids = self._check_inputs(input_ids, attention_mask, token_type_ids)
        return self.forward_from(0, self.embed(input_ids, token_type_ids), attention_mask, stop_at_layer=stop_at_layer)

    def forward_from(
        self,
        layer: int,
        resid_pre: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        stop_at_layer: int | None = None,
    ) -> torch.Tensor:
        """Finish a forward pass from ``blocks.{layer}.hook_resid_pre`` ``[batch, pos, d_model]``.

        Runs blocks ``layer..`` (through ``stop_at_layer`` inclusive, if given) with their hooks; useful to
        re-run only the layers an intervention can change. ``attention_mask`` ``[batch, pos]`` as in ``forward``.
        """
        self._check_layer("layer", layer)
        last = self.config.n_layers - 1 if stop_at_layer is None else self._check_layer("stop_at_layer", stop_at_layer)
        if resid_pre.dim() != 3 or resid_pre.shape[-1] != self.config.d_model:
            raise ValueError(f"resid_pre must be [batch, pos, {self.config.d_model}], got {tuple(resid_pre.shape)}")
        if attention_mask is not None and attention_mask.shape != resid_pre.shape[:2]:
            raise ValueError(
                f"attention_mask shape {tuple(attention_mask.shape)} != [batch, pos] {tuple(resid_pre.shape[:2])}"
            )
        ctx = self.context(resid_pre, attention_mask)
        x = resid_pre
        self.current_attention_mask = attention_mask  # the run's padding, for hooks (see ablate_heads "uniform")
        try:
            for block in self.blocks[layer : last + 1]:
                x = block(x, ctx)
        finally:
            self.current_attention_mask = None
        if self.ln_final is not None and stop_at_layer is None:
            x = self.ln_final(x)
        return x

    def context(self, x: torch.Tensor, attention_mask: torch.Tensor | None) -> Any:
        """What every block of one run needs besides its input ``x`` ``[batch, pos, d_model]``: here the key mask
        ``[batch, 1, 1, key]`` (None when nothing is padded). Architectures with more per-run state (relative
        positions, rotary tables, local windows) override this; ``forward_from`` is the same for all."""
        return _key_mask(None if attention_mask is None else attention_mask.to(x.device))

    def pool(self, hidden: torch.Tensor) -> torch.Tensor:
        """BERT's pooler output ``tanh(W h_[CLS] + b)`` ``[batch, d_model]`` (needs a checkpoint with a pooler)."""
        if self.pooler is None:
            raise RuntimeError("this model has no pooler (the checkpoint carried no pooler.dense weights)")
        return self.pooler(hidden)

    def mlm_logits(self, hidden: torch.Tensor, *, bias: bool = True) -> torch.Tensor:
        """Masked-LM logits ``[batch, pos, vocab]`` (needs a checkpoint with a masked-LM head); ``bias=False``
        leaves out the decoder's output bias (Kobayashi et al. 2023: it carries word frequency)."""
        if self.mlm_head is None:
            raise RuntimeError(
                "this model has no masked-LM head: load a checkpoint saved from a *ForMaskedLM (or BERT/ALBERT "
                "*ForPreTraining) model to get one"
            )
        return self.mlm_head(hidden, self.embed.word.weight, bias=bias)

    # ------------------------------------------------------------------ conveniences
    def tokenize(
        self, texts: str | list[str], pairs: str | list[str] | None = None, *, padding: bool = True
    ) -> dict[str, torch.Tensor]:
        """Tokenise with the checkpoint's tokenizer: ``{"input_ids", "attention_mask", "token_type_ids"}``
        on the model's device (no token types for models without them). Texts longer than
        ``config.max_length`` raise (no silent truncation)."""
        if self.tokenizer is None:
            raise RuntimeError("this model has no tokenizer; pass input ids directly")
        enc = self.tokenizer(texts, pairs, padding=padding, truncation=False, return_tensors="pt")
        if enc["input_ids"].shape[1] > self.config.max_length:
            raise ValueError(
                f"a text is {enc['input_ids'].shape[1]} tokens long; the model takes at most "
                f"{self.config.max_length}. Shorten or split it."
            )
        keys = ("input_ids", "attention_mask", "token_type_ids") if self.config.type_vocab_size else (
            "input_ids", "attention_mask")
        return {k: enc[k].to(self.device) for k in keys if k in enc}

    @property
    def special_token_ids(self) -> dict[str, int]:
        """The tokenizer's special tokens that are set, by role: ``{"cls", "sep", "pad", "mask", "unk",
        "bos", "eos"} -> id`` ([CLS]/[SEP] in BERT's vocabulary, ``<s>``/``</s>`` in RoBERTa's, ...)."""
        if self.tokenizer is None:
            raise RuntimeError("this model has no tokenizer, so no special tokens")
        roles = ("cls", "sep", "pad", "mask", "unk", "bos", "eos")
        ids = {role: getattr(self.tokenizer, f"{role}_token_id", None) for role in roles}
        return {role: int(i) for role, i in ids.items() if i is not None}

    @property
    def device(self) -> torch.device:
        return self.embed.word.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.word.weight.dtype

    @property
    def weights_sha256(self) -> str:
        """sha256 over the weight file(s) the model was loaded from (of the parameters if none)."""
        if self._weights_sha256 is None:
            import hashlib

            h = hashlib.sha256()
            if self.weight_files:
                for path in self.weight_files:
                    with open(path, "rb") as f:
                        for chunk in iter(lambda: f.read(1 << 22), b""):
                            h.update(chunk)
            else:
                for name, t in self.state_dict().items():
                    h.update(name.encode())
                    h.update(t.detach().cpu().float().numpy().tobytes())
            self._weights_sha256 = h.hexdigest()
        return self._weights_sha256

    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def set_attention_impl(self, impl: AttentionImpl) -> None:
        """``"auto"`` (fused SDPA unless scores/patterns are hooked or attention dropout is active) or
        ``"explicit"`` (always materialise scores and patterns)."""
        if impl not in ("auto", "explicit"):
            raise ValueError(f"attention impl must be 'auto' or 'explicit', got {impl!r}")
        for block in self.blocks:
            block.attn.impl = impl

    # weights as tables and per-head views
    @property
    def W_E(self) -> torch.Tensor:
        """Token embeddings ``[vocab, d_embed]`` (``d_embed`` = ``d_model`` unless the embeddings are projected)."""
        return self.embed.word.weight

    @property
    def W_pos(self) -> torch.Tensor:
        """Position table ``[max_positions, d_embed]`` (learned or sinusoidal). With RoBERTa's padding-aware
        ids the first token uses row ``config.position_offset``."""
        return self.embed.position_table()

    @property
    def W_pos_tokens(self) -> torch.Tensor | None:
        """``[max_length, d_embed]``: the position-table row each input position reads (row ``i`` for the ``i``-th
        token; RoBERTa's rows below ``position_offset`` dropped). None for families without an absolute table
        (ModernBERT's rotary positions, DeBERTa-v3's relative ones)."""
        table = self.W_pos
        if table is None:
            return None
        offset = self.config.position_offset
        return table[offset : offset + self.config.max_length]

    @property
    def W_type(self) -> torch.Tensor | None:
        """Token-type (segment) embeddings ``[type_vocab, d_embed]``; None for models without them."""
        return None if self.embed.token_type is None else self.embed.token_type.weight

    # ------------------------------------------------------------------ text
    def to_tokens(self, texts: str | list[str], pairs: str | list[str] | None = None) -> dict[str, torch.Tensor]:
        """Tokenise text: ``{"input_ids": [batch, pos], "attention_mask": [batch, pos], "token_type_ids":
        [batch, pos]}`` on the model's device (a dict, unlike TransformerLens' ids-only tensor, because a padded
        batch is wrong without its mask). ``model(model.to_tokens(texts))`` and ``model(texts)`` are the same."""
        return self.tokenize(texts, pairs)

    def to_str_tokens(self, inputs: str | list[str] | torch.Tensor) -> list[str] | list[list[str]]:
        """Word pieces as the model sees them, ``##`` continuation markers kept: ``"The cat sat."`` ->
        ``["[CLS]", "the", "cat", "sat", ".", "[SEP]"]``. A list of texts gives one list per text (no padding);
        ids ``[pos]`` or ``[batch, pos]`` (or ``to_tokens``' dict) are converted as they are."""
        return str_tokens(self.tokenizer, inputs)

    # ------------------------------------------------------------------ helpers
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """BERT's initialisation: N(0, 0.02) weights, zero biases, unit LayerNorm."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02, generator=generator)
                if isinstance(module, nn.Linear) and module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, LayerNorm):
                nn.init.ones_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, MLMHead):
                nn.init.zeros_(module.bias)

    def _check_layer(self, what: str, layer: int) -> int:
        if not 0 <= layer < self.config.n_layers:
            raise ValueError(f"{what} must be in 0..{self.config.n_layers - 1}, got {layer}")
        return layer

    def _check_inputs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        token_type_ids: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        cfg = self.config
        if not isinstance(input_ids, torch.Tensor):
            raise TypeError(f"input_ids must be a torch.Tensor [batch, pos], got {type(input_ids).__name__}")
        if input_ids.dim() != 2:
            raise ValueError(
                f"input_ids must be 2-D [batch, pos], got shape {tuple(input_ids.shape)}; "
                "add a batch dimension with input_ids[None]"
            )
        if input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool:
            raise TypeError(f"input_ids must be integer token ids, got dtype {input_ids.dtype}")
        n_pos = input_ids.shape[1]
        if n_pos == 0:
            raise ValueError("input_ids has no positions")
        if n_pos > cfg.max_length:
            raise ValueError(
                f"sequence length {n_pos} exceeds the position table ({cfg.max_length} tokens); "
                f"truncate or split inputs to at most {cfg.max_length} tokens"
            )
        lo, hi = int(input_ids.min()), int(input_ids.max())
        if lo < 0 or hi >= cfg.vocab_size:
            raise ValueError(
                f"token ids must be in [0, {cfg.vocab_size}); got range [{lo}, {hi}] "
                "(was the input tokenised with this model's tokenizer?)"
            )
        device = self.device
        input_ids = input_ids.to(device)
        if attention_mask is not None:
            if attention_mask.shape != input_ids.shape:
                raise ValueError(
                    f"attention_mask shape {tuple(attention_mask.shape)} != input_ids shape "
                    f"{tuple(input_ids.shape)}"
                )
            attention_mask = attention_mask.to(device)
            if not bool(((attention_mask == 0) | (attention_mask == 1)).all()):
                raise ValueError("attention_mask must hold only 0 (padding) and 1 (real token)")
        if token_type_ids is not None and cfg.type_vocab_size == 0:
            token_type_ids = None  # no segment embeddings (DistilBERT): segments are not an input of the model
        if token_type_ids is not None:
            if token_type_ids.shape != input_ids.shape:
                raise ValueError(
                    f"token_type_ids shape {tuple(token_type_ids.shape)} != input_ids shape "
                    f"{tuple(input_ids.shape)}"
                )
            token_type_ids = token_type_ids.to(device)
            lo, hi = int(token_type_ids.min()), int(token_type_ids.max())
            if lo < 0 or hi >= max(cfg.type_vocab_size, 1):
                raise ValueError(f"token_type_ids must be in [0, {cfg.type_vocab_size}), got [{lo}, {hi}]")
        return input_ids, attention_mask, token_type_ids


# ====================================================================== modules
class Embeddings(nn.Module):
    """``LN(word + type + position)``, then dropout, then (ALBERT, ELECTRA) a projection ``d_embed -> d_model``.

    Positions are 0, 1, ... or RoBERTa's padding-aware ids (``config.position_ids``); models without token
    types (DistilBERT) have no type embedding and no ``hook_type``.
    """

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        e = cfg.d_vocab_embed
        self.word = nn.Embedding(cfg.vocab_size, e)
        if cfg.position_encoding == "learned":
            self.pos = nn.Embedding(cfg.max_positions, e)
        else:
            self.pos = None
            self.register_buffer("sinusoid", sinusoidal_table(cfg.max_positions, e), persistent=False)
        self.ln = LayerNorm(e, cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout)
        self.hook_word = HookPoint()  # [batch, pos, d_embed]
        self.hook_pos = HookPoint()  # [batch, pos, d_embed]
        if cfg.type_vocab_size > 0:
            self.token_type = nn.Embedding(cfg.type_vocab_size, e)
            self.hook_type = HookPoint()  # [batch, pos, d_embed]
        else:
            self.token_type = self.hook_type = None
        if cfg.d_embed is not None:
            self.proj = nn.Linear(e, cfg.d_model)
            self.hook_proj_in = HookPoint()  # [batch, pos, d_embed]
        else:
            self.proj = self.hook_proj_in = None
        self.hook_out = HookPoint()  # [batch, pos, d_model]

    def position_table(self) -> torch.Tensor:
        return self.pos.weight if self.pos is not None else self.sinusoid

    def position_ids(self, input_ids: torch.Tensor) -> torch.Tensor | None:
        """``[batch, pos]`` position of each token, or None for the plain 0, 1, ... of every row."""
        if self.cfg.position_ids == "sequential":
            return None
        real = (input_ids != self.cfg.pad_token_id).long()
        return torch.cumsum(real, dim=1) * real + self.cfg.pad_token_id

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None) -> torch.Tensor:
        b, p = input_ids.shape
        word = self.hook_word(self.word(input_ids))
        ids = self.position_ids(input_ids)
        table = self.position_table().to(word.dtype)
        pos = self.hook_pos(table[:p].expand(b, p, -1) if ids is None else F.embedding(ids, table))
        x = word
        if self.token_type is not None:
            types = token_type_ids if token_type_ids is not None else torch.zeros_like(input_ids)
            x = x + self.hook_type(self.token_type(types))
        x = x + pos  # BERT's order: (word + type) + position
        x = self.dropout(self.ln(x))
        if self.proj is not None:
            x = self.proj(self.hook_proj_in(x))
        return self.hook_out(x)


class Attention(nn.Module):
    """Multi-head self-attention with fused Q/K/V weights.

    ``qkv.weight`` is ``[3 * d_model, d_model]`` stacking BERT's query, key and value matrices; per-head
    access (``W_Q`` etc.) is a view. With ``attention_projections=False`` Q = K = V = the input split into
    heads, and the head outputs are concatenated without an output projection.
    """

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.n_heads, self.d_head = cfg.n_heads, cfg.d_head
        self.projected = cfg.attention_projections
        if self.projected:
            self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
            self.out = nn.Linear(cfg.d_model, cfg.d_model)
        self.dropout_p = cfg.attention_dropout
        self.impl: AttentionImpl = "auto"
        self.hook_q = HookPoint()  # [batch, pos, head, d_head]
        self.hook_k = HookPoint()  # [batch, pos, head, d_head]
        self.hook_v = HookPoint()  # [batch, pos, head, d_head]
        self.hook_scores = HookPoint()  # [batch, head, query, key]
        self.hook_pattern = HookPoint()  # [batch, head, query, key]
        self.hook_z = HookPoint()  # [batch, pos, head, d_head]
        self.hook_result = HookPoint()  # [batch, pos, head, d_model]

    def forward(self, x: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        """``x`` ``[batch, pos, d_model]``; ``keep`` ``[batch, 1, 1, key]`` bool (True = real key) or None."""
        dropout_p = self.dropout_p if self.training else 0.0
        explicit = (
            self.impl == "explicit" or self.hook_scores.is_hooked or self.hook_pattern.is_hooked or dropout_p > 0
        )
        # under torch.func (vmap/jvp: bertscope.similarity's projections) the broadcast below would be materialised
        if self.projected and explicit and not torch._C._functorch.is_functorch_wrapped_tensor(x):
            # Heads first, [three, head, batch, pos, d_head]: the batched matmuls below read q, k and v in place
            # (q, k, v and the hooks' [batch, pos, head, d_head] are views of it), with no copy of any.
            q, k, v = qkv_heads_first(x, self.qkv.weight, self.qkv.bias, self.n_heads)
        elif self.projected:
            q, k, v = rearrange(self.qkv(x), "b p (three h d) -> three b p h d", three=3, h=self.n_heads)
        else:
            q = k = v = rearrange(x, "b p (h d) -> b p h d", h=self.n_heads)
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)

        if explicit:
            batch = max(t.shape[0] for t in (q, k, v))  # a fork_batch hook may have made one of them copies
            q3, k3, v3 = (heads_first(t, batch) for t in (q, k, v))  # [(head batch), pos, d_head]
            scores3 = torch.baddbmm(q3.new_zeros(()), q3, k3.transpose(1, 2), beta=0.0, alpha=self.d_head**-0.5)
            scores = rearrange(scores3, "(h b) q k -> b h q k", h=self.n_heads)  # a view: [batch, head, query, key]
            if keep is not None:
                scores = scores.masked_fill_(~keep, torch.finfo(scores.dtype).min)  # fresh from the matmul: in place
            scores = self.hook_scores(scores)
            pattern = self.hook_pattern(softmax_keys(scores))
            if dropout_p > 0:  # the mask drawn in [batch, head, query, key] order, as transformers draws it
                pattern = F.dropout(pattern.contiguous(), dropout_p, self.training)
            batch = max(pattern.shape[0], v.shape[0])
            z3 = torch.bmm(heads_first(pattern, batch, "b h q k -> (h b) q k"), heads_first(v, batch))
            z = rearrange(z3, "(h b) p d -> b p h d", h=self.n_heads)  # a view of [head, batch, pos, d_head]
        else:
            # Fused kernel: nothing needs the [query, key] matrices, so never materialise them.
            q, k, v = (rearrange(t, "b p h d -> b h p d") for t in (q, k, v))
            z = rearrange(F.scaled_dot_product_attention(q, k, v, attn_mask=keep), "b h p d -> b p h d")
        z = self.hook_z(z)

        if self.hook_result.is_hooked:
            # Per-head writes cost an extra [batch, pos, head, d_model] tensor: only when someone asks.
            result = head_results(z, self.W_O)
            hooked = self.hook_result(result)
            if hooked is not result:  # a hook replaced some head's write: rebuild the sum from the heads
                return hooked.sum(dim=2) + self.b_O
        flat = rearrange(z, "b p h d -> b p (h d)")
        return self.out(flat) if self.projected else flat

    # per-head weight views ------------------------------------------------
    def _in_proj(self, i: int) -> torch.Tensor:
        if not self.projected:
            return self._selection()
        w = self.qkv.weight[i * self.cfg.d_model : (i + 1) * self.cfg.d_model]
        return rearrange(w, "(h d) m -> h m d", h=self.n_heads)

    def _in_bias(self, i: int) -> torch.Tensor:
        if not self.projected:
            return torch.zeros(self.n_heads, self.d_head, device=self._device(), dtype=self._dtype())
        b = self.qkv.bias[i * self.cfg.d_model : (i + 1) * self.cfg.d_model]
        return rearrange(b, "(h d) -> h d", h=self.n_heads)

    @property
    def W_Q(self) -> torch.Tensor:
        """``[head, d_model, d_head]``: ``q_h = x @ W_Q[h] + b_Q[h]``."""
        return self._in_proj(0)

    @property
    def W_K(self) -> torch.Tensor:
        """``[head, d_model, d_head]``."""
        return self._in_proj(1)

    @property
    def W_V(self) -> torch.Tensor:
        """``[head, d_model, d_head]``."""
        return self._in_proj(2)

    @property
    def b_Q(self) -> torch.Tensor:
        """``[head, d_head]``."""
        return self._in_bias(0)

    @property
    def b_K(self) -> torch.Tensor:
        return self._in_bias(1)

    @property
    def b_V(self) -> torch.Tensor:
        return self._in_bias(2)

    @property
    def W_O(self) -> torch.Tensor:
        """``[head, d_head, d_model]``: head h writes ``z_h @ W_O[h]``; ``attn_out = sum_h ... + b_O``."""
        if not self.projected:
            return rearrange(self._selection(), "h m d -> h d m")
        return rearrange(self.out.weight, "m (h d) -> h d m", h=self.n_heads)

    @property
    def b_O(self) -> torch.Tensor:
        """``[d_model]``."""
        if not self.projected:
            return torch.zeros(self.cfg.d_model, device=self._device(), dtype=self._dtype())
        return self.out.bias

    def _selection(self) -> torch.Tensor:
        """Raw attention's fixed 'projection': head h reads (and writes) its slice of d_model.
        ``[head, d_model, d_head]``."""
        eye = torch.eye(self.cfg.d_model, device=self._device(), dtype=self._dtype())
        return rearrange(eye, "m (h d) -> h m d", h=self.n_heads)

    def _device(self) -> torch.device:
        p = next(iter(self.parameters()), None)
        return p.device if p is not None else torch.device("cpu")

    def _dtype(self) -> torch.dtype:
        p = next(iter(self.parameters()), None)
        return p.dtype if p is not None else torch.get_default_dtype()


class MLP(nn.Module):
    """``fc_out(act(fc_in(x)))``."""

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.fc_in = nn.Linear(cfg.d_model, cfg.d_mlp)
        self.fc_out = nn.Linear(cfg.d_mlp, cfg.d_model)
        self.act = activation(cfg.activation)
        self.hook_pre = HookPoint()  # [batch, pos, d_mlp]
        self.hook_post = HookPoint()  # [batch, pos, d_mlp]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc_out(self.hook_post(self.act(self.hook_pre(self.fc_in(x)))))


class Block(nn.Module):
    """One encoder layer.

    post-LN (BERT): ``mid = LN1(x + attn(x))``, ``out = LN2(mid + mlp(mid))``.
    pre-LN (tutorials): ``mid = x + attn(LN1(x))``, ``out = mid + mlp(LN2(mid))``.
    """

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.post_ln = cfg.norm_placement == "post"
        self.ln1 = LayerNorm(cfg.d_model, cfg.layer_norm_eps)
        self.attn = Attention(cfg)
        self.ln2 = LayerNorm(cfg.d_model, cfg.layer_norm_eps)
        self.mlp = MLP(cfg)
        self.dropout = nn.Dropout(cfg.hidden_dropout)
        self.hook_resid_pre = HookPoint()  # [batch, pos, d_model]
        self.hook_attn_out = HookPoint()  # [batch, pos, d_model]
        self.hook_resid_mid = HookPoint()  # [batch, pos, d_model]
        self.hook_mlp_out = HookPoint()  # [batch, pos, d_model]
        self.hook_resid_post = HookPoint()  # [batch, pos, d_model]

    def forward(self, x: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        x = self.hook_resid_pre(x)
        if self.post_ln:
            attn_out = self.hook_attn_out(self.dropout(self.attn(x, keep)))
            mid = self.hook_resid_mid(self.ln1(x + attn_out))
            mlp_out = self.hook_mlp_out(self.dropout(self.mlp(mid)))
            return self.hook_resid_post(self.ln2(mid + mlp_out))
        attn_out = self.hook_attn_out(self.dropout(self.attn(self.ln1(x), keep)))
        mid = self.hook_resid_mid(x + attn_out)
        mlp_out = self.hook_mlp_out(self.dropout(self.mlp(self.ln2(mid))))
        return self.hook_resid_post(mid + mlp_out)


class LayerNorm(nn.Module):
    """LayerNorm with hooks on its scale ``sqrt(var + eps)`` ``[batch, pos, 1]`` and normalised input.

    The output comes from the fused kernel unless a hook replaces the scale or the normalised input.
    """

    def __init__(self, d: int, eps: float, *, bias: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d)) if bias else None
        self.hook_scale = HookPoint()  # [batch, pos, 1]
        self.hook_normalized = HookPoint()  # [batch, pos, d_model]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.hook_scale.is_hooked or self.hook_normalized.is_hooked):
            return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)
        if torch.is_grad_enabled() and x.requires_grad:  # the internals must be nodes of the autograd graph
            fused = F.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)
            centred = x - x.mean(dim=-1, keepdim=True)
            scale = (centred.pow(2).mean(dim=-1, keepdim=True) + self.eps).sqrt()
        else:  # the fused kernel's own mean and 1/scale: one pass over x instead of five
            fused, mean, rstd = torch.native_layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)
            mean, rstd = mean.to(x.dtype), rstd.to(x.dtype)  # CUDA keeps a half input's statistics in float32
            scale, centred = rstd.reciprocal(), None
        hooked_scale = self.hook_scale(scale)
        if centred is None and hooked_scale is scale:
            normalized = torch.addcmul(-mean * rstd, x, rstd)  # (x - mean) / scale in one pass over x
        else:
            normalized = (x - mean if centred is None else centred) / hooked_scale
        hooked_normalized = self.hook_normalized(normalized)
        if hooked_scale is scale and hooked_normalized is normalized:
            return fused  # only observed: keep the fused kernel's exact numbers
        out = hooked_normalized * self.weight
        return out + self.bias if self.bias is not None else out


class Pooler(nn.Module):
    """``tanh(dense(h[:, 0]))``: BERT's [CLS] pooler."""

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(hidden[:, 0]))


class MLMHead(nn.Module):
    """The family's masked-LM head: ``LN(act(dense(h))) @ W_dec^T + bias``, ``dense: d_model -> d_embed``.

    One shape covers BERT's ``cls.predictions``, RoBERTa's ``lm_head``, DistilBERT's ``vocab_*``, ALBERT's
    ``predictions`` and ELECTRA's generator head. The decoder is tied to the word embeddings unless the
    checkpoint stores a different matrix (then ``decoder`` holds it)."""

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.d_model, cfg.d_vocab_embed)
        self.act = activation(cfg.mlm_activation or cfg.activation)
        self.ln = LayerNorm(cfg.d_vocab_embed, cfg.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))
        self.decoder: nn.Parameter | None = None

    def forward(self, hidden: torch.Tensor, tied: torch.Tensor, *, bias: bool = True) -> torch.Tensor:
        """``hidden`` ``[..., d_model]`` -> logits ``[..., vocab]``; ``bias=False`` drops the output bias."""
        h = self.ln(self.act(self.dense(hidden)))
        return F.linear(h, self.decoder if self.decoder is not None else tied, self.bias if bias else None)


# ====================================================================== functions
def sinusoidal_table(n_positions: int, d_model: int, base: float = 10000.0) -> torch.Tensor:
    """``PE[p, 2i] = sin(p / base^(2i/d))``, ``PE[p, 2i+1] = cos(p / base^(2i/d))``; ``[n_positions, d_model]``."""
    pos = torch.arange(n_positions, dtype=torch.float64)[:, None]
    freq = base ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    table = torch.zeros(n_positions, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq[: d_model // 2])
    return table.float()


def qkv_heads_first(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, n_heads: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fused Q/K/V projection ``x @ weight^T + bias`` laid out heads first: ``x`` ``[batch, pos, d_model]``,
    ``weight`` ``[3 * d_model, d_model]`` -> ``q, k, v`` ``[batch, pos, head, d_head]``, views of one contiguous
    ``[three, head, batch, pos, d_head]`` tensor, so that ``heads_first`` reads them without a copy.

    One batched matmul over the ``3 * head`` column blocks of the weight, each ``[batch * pos, d_model] @ [d_model,
    d_head]`` with ``x`` broadcast (not copied): every number is the dot product ``nn.Linear`` computes (the same
    kernel on the same rows and columns; ``test_qkv_heads_first_is_the_linear_layer`` pins it bitwise)."""
    b, p, m = x.shape
    w = rearrange(weight, "(three h d) m -> (three h) m d", three=3, h=n_heads)
    rows = x.reshape(1, b * p, m).expand(w.shape[0], -1, -1)
    if bias is None:
        out = torch.bmm(rows, w)
    else:
        out = torch.baddbmm(rearrange(bias, "(n d) -> n 1 d", n=w.shape[0]), rows, w)
    q, k, v = rearrange(out, "(three h) (b p) d -> three b p h d", three=3, b=b)
    return q, k, v


def heads_first(t: torch.Tensor, batch: int, pattern: str = "b p h d -> (h b) p d") -> torch.Tensor:
    """``t`` (``[batch, pos, head, d_head]``, or with ``pattern`` another per-head layout) as ``[(head batch), ...]``
    for a batched matmul: a view when ``t`` is laid out heads first (as ``qkv_heads_first`` and the attention's own
    matmuls make it), else one copy. A batch of one is first broadcast to ``batch`` (a ``fork_batch`` hook upstream)."""
    if t.shape[0] != batch:
        t = t.expand(batch, *t.shape[1:])
    return rearrange(t, pattern)


def softmax_keys(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over keys of ``scores`` ``[batch, head, query, key]``, computed in the tensor's own memory order and
    returned in it: the softmax kernel would otherwise first copy a heads-first (``[head, batch, query, key]`` in
    memory) view to ``[batch, head, ...]`` order."""
    heads_major = rearrange(scores, "b h q k -> h b q k")
    if heads_major.is_contiguous():
        return rearrange(heads_major.softmax(dim=-1), "h b q k -> b h q k")
    return scores.softmax(dim=-1)


def head_results(z: torch.Tensor, W_O: torch.Tensor) -> torch.Tensor:
    """Each head's write ``z_h @ W_O[h]``: ``z`` ``[batch, pos, head, d_head]``, ``W_O`` ``[head, d_head, d_model]``
    -> ``[batch, pos, head, d_model]``, a view of a contiguous ``[head, batch, pos, d_model]`` tensor.

    One matmul per head, batched, reading ``z`` in place when batch and position are adjacent in its memory (laid out
    ``[batch, pos, head, d_head]``, the fused kernel's order, or ``[head, batch, pos, d_head]``, the explicit
    attention's); no copy of the result and no expanded copy of ``W_O`` (``matmul`` broadcasting ``[head, d_head,
    d_model]`` over the batch makes one)."""
    b, p, h, d = z.shape
    rows = rearrange(z.reshape(b * p, h, d), "n h d -> h n d")  # a view, or one copy if (b, p) do not merge
    per_head = torch.bmm(rows, W_O)  # [head, batch * pos, d_model]; W_O as a view of the projection is fine
    return rearrange(per_head, "h (b p) m -> b p h m", b=b)


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """BERT's ``gelu`` is the exact erf form; ``gelu_new``/``gelu_pytorch_tanh``/``gelu_fast`` the tanh one."""
    if name == "gelu":
        return nn.GELU()
    if name in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
        return nn.GELU(approximate="tanh")
    if name == "relu":
        return nn.ReLU()
    if name == "silu":
        return nn.SiLU()
    raise ValueError(f"unsupported activation {name!r}")


_EMBED_ORDER = ("hook_word", "hook_pos", "hook_type", "ln.hook_scale", "ln.hook_normalized", "hook_proj_in",
                "hook_out")
_ATTN = ("attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_scores", "attn.hook_pattern", "attn.hook_z",
         "attn.hook_result", "hook_attn_out")
_MLP = ("mlp.hook_pre", "mlp.hook_post", "hook_mlp_out")
_LN1, _LN2 = ("ln1.hook_scale", "ln1.hook_normalized"), ("ln2.hook_scale", "ln2.hook_normalized")
_BLOCK_ORDER = {
    "post": ("hook_resid_pre", *_ATTN, *_LN1, "hook_resid_mid", *_MLP, *_LN2, "hook_resid_post"),
    "pre": ("hook_resid_pre", *_LN1, *_ATTN, "hook_resid_mid", *_LN2, *_MLP, "hook_resid_post"),
}


def _forward_rank(name: str, cfg: EncoderConfig) -> tuple[int, int, int]:
    """Sort key putting hook names in the order the forward pass reaches them."""
    site = parse_site(name)
    if site.module == "embed":
        return (0, 0, _EMBED_ORDER.index(site.suffix))
    if site.module == "blocks":
        return (1, site.layer, _BLOCK_ORDER[cfg.norm_placement].index(site.suffix))
    return (2, 0, 0 if name.endswith("hook_scale") else 1)


def _share_layer_groups(blocks: nn.ModuleList, cfg: EncoderConfig) -> None:
    """ALBERT: every layer of a group uses the group's first layer's parameters (the same ``nn.Parameter``
    objects), while each layer keeps its own modules and so its own hook points."""
    if cfg.layer_groups is None:
        return
    for layer, block in enumerate(blocks):
        first = next(i for i in range(cfg.n_layers) if cfg.layer_group(i) == cfg.layer_group(layer))
        if first == layer:
            continue
        source = dict(blocks[first].named_modules())
        for name, module in block.named_modules():
            for pname in list(module._parameters):
                setattr(module, pname, getattr(source[name], pname))


def _key_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """``[batch, pos]`` 0/1 -> ``[batch, 1, 1, key]`` bool, or None when nothing is padded (faster kernels)."""
    if attention_mask is None:
        return None
    keep = attention_mask.bool()
    if bool(keep.all()):
        return None
    return rearrange(keep, "b k -> b 1 1 k")
