"""Experiment ``mixing``: where each token's representation comes from, by every context-mixing method.

On the corpus, for each method of ``bertscope.hooks.mixing`` (definitions in ``docs/experiments/mixing.md``):

1. **mixing ratio** per layer: how much of each token's block output comes from other tokens rather than
   itself, ``1 - share_ii`` of the method's contribution matrix (``residual_norm``: Kobayashi et al. 2021's
   vector ratio), averaged over real tokens; also for ``rollout:<method>`` (how much of the layer-L token
   comes from other *input* tokens);
2. **special tokens**: the share of each token's contributions that comes from [CLS], [SEP] and punctuation
   ('.' and ','), per layer; under ``attention`` this share is the attention mass the heads and same-token
   experiments report, so the rows of the other methods say which of those findings survive;
3. **faithfulness**: per sentence, the Spearman correlation over real tokens between a method's input
   attribution of the target and leave-one-out's (``loo``, the reference), averaged over sentences.

Tables: ``results`` (long: model, corpus, method, layer, metric, value, ci_low, ci_high, n; ``n`` = sentences;
intervals: 95% percentile group bootstrap over sentences) and ``example_maps`` (last-layer contribution
shares of a few short sentences, for the figures).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

import pandas as pd
from bertscope.experiments.activations import open_capture
from bertscope.experiments.mixing import data, measures
from bertscope.experiments.mixing.data import MAP_COLUMNS  # noqa: F401 (its home before `data`)
from bertscope.experiments.mixing.plots import plot
from bertscope.experiments.options import sentences_used
from bertscope.hooks.mixing import (
    needed_sites,
    table,
    undefined_reason,
)

NAME = "mixing"
DIRNAME = "mixing"
SUMMARY_TABLES = ["summary"]
RESULT_COLUMNS = ["model", "corpus", "method", "layer", "metric", "value", "ci_low", "ci_high", "n"]
__all__ = ["NAME", "DIRNAME", "SUMMARY_TABLES", "RESULT_COLUMNS", "Settings", "run", "plot", "faithfulness_target",
           "activation_sites"]  # fmt: skip


@dataclass(frozen=True)
class Settings:
    """Sizes and choices of the mixing run (recorded in the manifest; part of the step-cache key)."""

    max_sentences: int = 120  # per-layer methods (cheap: a few forward passes), when --max-sentences is not given
    costly_sentences: int = 12  # value_zeroing, loo, IG, grad x input and every faithfulness row: O(tokens) passes
    # per-layer contribution methods on max_sentences (bertscope.contributions; their rollouts are added): the
    # method table's cheap ones (attention, attention_norm, residual_norm, alti)
    methods: tuple[str, ...] = field(default_factory=lambda: table.per_layer("cheap"))
    # methods costing O(tokens) passes, on costly_sentences: the table's costly per-layer ones (value_zeroing)
    costly_methods: tuple[str, ...] = field(default_factory=lambda: table.per_layer("costly"))
    baseline: str = "mask"  # what replaces a token in loo and IG (mt-upc's blank-out uses [MASK])
    ig_steps: int = 16  # integrated gradients' Riemann steps
    n_examples: int = 2  # sentences drawn as example maps
    example_max_tokens: int = 14  # longest example sentence, special tokens included
    n_boot: int = 1000  # bootstrap resamples behind every interval

    def __post_init__(self) -> None:
        from bertscope.experiments.settings import require
        from bertscope.hooks.mixing.inputs import BASELINES

        require(self, positive=("max_sentences", "costly_sentences", "ig_steps", "example_max_tokens", "n_boot"),
                non_negative=("n_examples",), choices={"baseline": BASELINES},
                subsets={"methods": table.per_layer(), "costly_methods": table.per_layer()})


CONVENTIONS = {
    "mixing_ratio": "mean over real tokens of 1 - C_ii / sum_j C_ij at block L's output; residual_norm: "
    "||sum_{j!=i} T_i(x_j)|| / (||sum_{j!=i} T_i(x_j)|| + ||T_i(x_i)||) (Kobayashi et al. 2021); attention and "
    "attention_norm leave the residual out, so theirs is the attention sublayer's own mixing",
    "share_<group>": "mean over real queries of sum over the group's keys of C_ij / sum_j C_ij; under 'attention' "
    "this is the heads experiment's head-averaged attention mass",
    "spearman_vs_loo": "per sentence, Spearman over real tokens of |attribution| vs |loo| at the last layer; mean "
    "over sentences (sentences where either side is constant are left out)",
    "attribution of per-layer methods": "last layer's contribution shares, read out through the rows the target "
    "reads: the mean over real tokens for the mean-pooled embedding, the masked row for the MLM loss",
    "ci": "95% percentile group bootstrap over sentences (paired across methods)",
    "n": "sentences",
}


def faithfulness_target(model: Any) -> dict[str, str]:
    """The target every faithfulness row attributes, per input-attribution method.

    A model with a masked-LM head: ``mlm_loss`` at one masked position per sentence. Otherwise the mean-pooled
    sentence embedding, as sentence-transformers models use it: ``pooled_cosine`` (``1 - cos`` to the clean
    embedding is what replacing a token does to the embedding's direction, the quantity cosine search reads)
    for ``loo`` and integrated gradients; ``grad_x_input`` gets ``pooled_projection``, because the cosine's
    gradient at the input itself is exactly zero (see ``bertscope.hooks.mixing.inputs``).
    """
    if getattr(model, "mlm_head", None) is not None:
        return {"loo": "mlm_loss", "integrated_gradients": "mlm_loss", "grad_x_input": "mlm_loss"}
    return {"loo": "pooled_cosine", "integrated_gradients": "pooled_cosine", "grad_x_input": "pooled_projection"}


#: what ``--activations`` cannot replace: the passes that run the model on inputs a capture does not hold
FORWARD_ONLY = ("the input attributions (leave-one-out, gradient x input, integrated gradients: the model on "
                "perturbed inputs), masked-LM faithfulness inputs and the example maps run the model")


def activation_sites(model: Any, settings: Settings | None = None) -> list[str]:
    """The hooks the per-layer methods read (what ``--activations`` must hold): for every layer, the sites the
    method table lists for ``settings``' methods (by default the decomposition's ``hook_resid_pre``,
    ``attn.hook_pattern``, ``attn.hook_v``, ``hook_attn_out``, ``hook_resid_mid``; value zeroing re-runs each
    block from the captured ``hook_resid_pre``)."""
    settings = settings or Settings()
    return needed_sites([*settings.methods, *settings.costly_methods], range(model.config.n_layers))


def run(ctx: Any, settings: Settings | None = None) -> pd.DataFrame:
    """The framework entry point: per-layer statistics on the corpus, the costly methods and faithfulness on its
    first sentences, example maps; writes ``example_maps`` and ``summary``, returns the long results table."""
    settings = ctx.use_settings(settings)
    model, options = ctx.model, ctx.options
    skipped = {m: undefined_reason(model, m) for m in (*settings.methods, *settings.costly_methods)}
    skipped = {m: why for m, why in skipped.items() if why}
    if skipped:  # e.g. residual_norm on a pre-LN model: every other method still runs
        ctx.note("skipped_methods", skipped)
        for m, why in skipped.items():
            ctx.warn(f"{m} skipped: {why}")
        settings = replace(settings, methods=tuple(m for m in settings.methods if m not in skipped),
                           costly_methods=tuple(m for m in settings.costly_methods if m not in skipped))
    n_used, why = sentences_used(options.max_sentences, settings.max_sentences, len(ctx.corpus))
    ctx.log(f"{n_used} sentences of {ctx.corpus_id} ({why})")
    corpus = ctx.corpus[:n_used]
    subset = corpus[: min(len(corpus), settings.costly_sentences)]
    targets = faithfulness_target(model)
    ctx.note("settings", asdict(settings))
    ctx.note("sentences", {"per_layer_methods": len(corpus), "costly_methods_and_faithfulness": len(subset)})
    ctx.record_used({"per-layer methods": len(corpus), "costly methods and faithfulness": len(subset)},
                    available=len(ctx.corpus), more="--set mixing.max_sentences=N --set mixing.costly_sentences=N")
    ctx.note("faithfulness_targets", targets)
    ctx.note("conventions", CONVENTIONS)

    source = open_capture(ctx.options.activations, model)  # --activations: the hooked tensors from a capture
    if source is not None:
        ctx.log(f"per-layer methods and value zeroing read {ctx.options.activations}; {FORWARD_ONLY}")
        ctx.note("activations", {"capture": str(ctx.options.activations), "forward_still_runs_for": FORWARD_ONLY})
    cheap = ctx.step("per_layer", lambda: data.per_layer_pass(ctx.run_values(), corpus, settings.methods, source))
    costly = ctx.step("costly", lambda: data.costly_pass(ctx.run_values(), subset, settings, targets,
                                                         ctx.rng("mlm-mask"), source))  # fmt: skip
    maps = ctx.step("examples", lambda: data.example_maps(ctx.model, corpus, settings))
    per_sentence = pd.concat([cheap, costly], ignore_index=True)
    results = measures.summarize(per_sentence, n_boot=settings.n_boot, seed=ctx.seed)
    results.insert(0, "corpus", ctx.corpus_id)
    results.insert(0, "model", ctx.model_id)
    ctx.write_table(maps, "example_maps", formats=("parquet",))
    ctx.write_table(summary_table(results), "summary")
    return results[RESULT_COLUMNS]


def summary_table(results: pd.DataFrame) -> pd.DataFrame:
    """The headline rows: faithfulness of every method, and the per-layer methods' mixing ratio and [CLS]/[SEP]
    shares averaged over layers (mean of the per-layer values; no interval)."""
    faith = results[results.metric == "spearman_vs_loo"].sort_values("value", ascending=False)
    per_layer = results[~results.method.str.contains(":") & (results.metric != "spearman_vs_loo")]
    mean = (per_layer.groupby(["model", "corpus", "method", "metric"], as_index=False)
            .agg(value=("value", "mean"), n=("n", "max")).assign(layer=-1))  # fmt: skip
    return pd.concat([faith, mean], ignore_index=True)[RESULT_COLUMNS]


# ---------------------------------------------------------------------------------------------- helpers


def per_layer_pass(ctx: Any, corpus: Any, methods: tuple[str, ...], source: Any = None) -> pd.DataFrame:
    """Old entry point taking the run context: `data.per_layer_pass` with the context's run values."""
    return data.per_layer_pass(ctx.run_values(), corpus, methods, source)


def costly_pass(ctx: Any, corpus: Any, settings: Settings, targets: dict[str, str], source: Any = None
                ) -> pd.DataFrame:  # fmt: skip
    """Old entry point taking the run context: `data.costly_pass` with the context's run values."""
    return data.costly_pass(ctx.run_values(), corpus, settings, targets, ctx.rng("mlm-mask"), source)


def example_maps(ctx: Any, corpus: Any, settings: Settings) -> pd.DataFrame:
    """Old entry point taking the run context: `data.example_maps` on the context's model."""
    return data.example_maps(ctx.model, corpus, settings)
