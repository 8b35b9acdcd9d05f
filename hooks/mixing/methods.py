"""The built-in context-mixing methods: one ``register`` each (the table: ``bertscope.hooks.mixing.table``).

Adding a method: write its one function (a ``Chunk`` kernel in ``kernels``, a re-run like ``zeroing``, or an input
attribution in ``inputs``) and register it below; ``contributions``, its ``rollout:``/``flow:``, the method lists,
the mixing experiment and the explorer's menu take it from the table.
"""

from __future__ import annotations

from bertscope.hooks.mixing import inputs, kernels, zeroing
from bertscope.hooks.mixing.table import Method, register


def _needs_post_ln(model, method: str) -> str | None:
    """Kobayashi et al. (2021) decompose the LayerNorm *after* the residual sum, which a pre-LN block lacks."""
    placement = getattr(getattr(model, "config", None), "norm_placement", None)
    if placement == "post":
        return None
    return (
        f"{method} (Kobayashi et al. 2021) decomposes LN(x + attn(x)) of a post-LN block; this model is "
        f"{placement!r}-LN, with no LayerNorm after the residual sum. Use 'alti' (which has a pre-LN form: the "
        "block output x + attn(x) itself) or 'attention_norm'."
    )


register(Method("attention", "layer", kernels.attention, "attention pattern averaged over heads",
                sites=("attn.hook_pattern",)))
register(Method("attention_norm", "layer", kernels.attention_norm,
                "norm of the head-summed transformed values (Kobayashi et al. 2020)"))
register(Method("residual_norm", "layer", kernels.residual_norm,
                "norm of each token's share of LN1(x + attn(x)) (Kobayashi et al. 2021)", with_residual=True,
                ratio=kernels.residual_norm_ratio, undefined=_needs_post_ln))
register(Method("alti", "layer", kernels.alti, "aggregation of layer-wise token-to-token interactions "
                "(Ferrando et al. 2022)", with_residual=True))
register(Method("value_zeroing", "rerun", zeroing.value_zeroing, "block output change when a token's value is "
                "zeroed (Mohebbi et al. 2023)", with_residual=True, cost="costly", sites=zeroing.SITES))
register(Method("grad_x_input", "input", inputs.grad_x_input, "gradient x input on the word embeddings",
                cost="costly", sites=()))
register(Method("integrated_gradients", "input", inputs.integrated_gradients,
                "integrated gradients on the word embeddings (Captum)", cost="costly", sites=()))
register(Method("loo", "input", inputs.loo, "leave-one-out: the target's drop when a token is replaced",
                cost="costly", sites=()))
