"""The experiments: what one provides (:class:`Experiment`) and the one registry the CLI, ``run all`` and the
report read (:data:`EXPERIMENTS`). Adding an experiment = a package under ``experiments/`` whose ``__init__``
satisfies :class:`Experiment`, one line here, and one line in pyproject.toml's ``packages``.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

#: CLI name -> package, in the order ``run all`` runs them (cheapest first).
EXPERIMENTS: dict[str, str] = {
    "same-token": "bertscope.experiments.same_token",
    "heads": "bertscope.experiments.heads",
    "positions": "bertscope.experiments.positions",
    "mixing": "bertscope.experiments.mixing",
    "structure": "bertscope.experiments.structure",
    "erasure": "bertscope.experiments.erasure",
    "circuits": "bertscope.experiments.circuits",
    "features": "bertscope.experiments.features",
    "similarity": "bertscope.experiments.similarity",
    "minimal-pairs": "bertscope.experiments.minimal_pairs",
}

#: What ``bertscope run NAME --help`` says about each experiment: what it measures and what it writes
#: (``help_text`` adds how long it took, from :data:`RUN_TIMES`).
HELP: dict[str, str] = {
    "same-token": "Does raw dot-product attention (Q = K = V = the embeddings) put very large weight on identical "
    "tokens, and do the learned heads escape it? Self and duplicate attention mass for raw attention at every "
    "layer and for every head, against uniform and offset-matched nulls, norm-weighted too. Writes "
    "OUT/same_token/: results, summary and example-map tables, figures, manifest.json.",
    "heads": "What does each head do? Attention statistics, rule-based roles, head similarity, dependency syntax "
    "against gold trees (Clark et al. 2019), and importance by ablation and gradients, with pruning curves. "
    "Writes OUT/heads/: results, roles, syntax and importance tables, figures, manifest.json.",
    "positions": "How much absolute and relative position does each layer and sublayer carry? Linear probes with "
    "control tasks and selectivity (Hewitt & Liang 2019), baselines, probe-free measures and MDL (Voita & Titov "
    "2020). --eval-corpus: alphas chosen on --corpus, every number reported from the other; --activations reads "
    "a `bertscope capture --for positions`. Writes OUT/positions/: results and side tables, figures, manifest.json.",
    "mixing": "Where does each token's representation come from? Context mixing by attention, attention norms, "
    "residual+LayerNorm norms, ALTI and value zeroing (and their rollouts): mixing ratio per layer, the share of "
    "[CLS]/[SEP]/punctuation, and faithfulness against leave-one-out. Writes OUT/mixing/: results, summary and "
    "example-map tables, figures, manifest.json.",
    "structure": "Is the parse tree in each layer's geometry? Hewitt & Manning (2019) structural probes (UUAS, "
    "distance Spearman, root accuracy, norm Spearman) per layer and sublayer site, trained to early stopping, "
    "against the embedding layer, random weights and linear-chain trees, with a rank sweep. Needs gold trees "
    "(builtin or CoNLL-U). Writes OUT/structure/: "
    "results, summary, rank-sweep and example tables, figures, manifest.json.",
    "erasure": "Does the model use what a probe finds? Amnesic probing: erase a concept (position, UPOS, relation, "
    "depth) at one layer during the forward pass with LEACE, INLP or mean projection, beside an equal-rank random "
    "subspace, and measure later layers' probes, structural-probe UUAS/DSpr, the sentence embedding and masked-LM "
    "accuracy; plus word-level probes with control tasks per layer. Trains on --corpus and reports on "
    "--eval-corpus (default: EWT train/dev when found, else a split of the corpus). Writes OUT/erasure/: results, "
    "summary and probing tables, figures, manifest.json.",
    "circuits": "Which heads, connected how, carry a bi-encoder's term-frequency signal? Chen et al.'s TFC1 pairs "
    "(a query term repeated in the document vs a filler word) from the corpus; each head patched from the "
    "corrupted run (exact) beside AtP, AtP* and EAP-IG, the injected token's own residual share, frozen-LayerNorm "
    "edges, a circuit by greedy pruning with its faithfulness curve and MIB's CPR/CMD against random circuits, and "
    "its overlap with the same-token duplicate heads. Writes OUT/circuits/: results, agreement, edges, circuit, "
    "faithfulness and area tables, task.jsonl, figures, manifest.json.",
    "features": "What do sparse-dictionary latents encode? One dictionary per site (TopK SAEs at a low, middle and "
    "last layer, one MLP transcoder; --dictionaries DIR loads trained ones, --tokens N trains longer), each latent "
    "labelled with position, duplicate-token, syntax (UPOS, relation, depth) and special-token "
    "concepts (chosen on dev sentences, scored on test), against neurons, PCA directions, the re-initialised "
    "model's dictionary and shuffled labels; k-sparse probing (SAEBench). Writes OUT/features/: results, summary, "
    "sparse-probing and browser tables, feature_browser.html, figures, manifest.json.",
    "similarity": "What makes two texts similar to an embedding model? On scored pairs (--corpus PAIRS: CSV/TSV "
    "sentence 1, sentence 2, score, or JSONL; builtin demo pairs otherwise): Spearman with gold per layer and "
    "pooling (chosen on one split, reported on another), each head's share of the cosine (exact decomposition) "
    "and its mean-ablation effect, pairwise attribution methods (integrated Jacobians, BiLRP, ...) checked by "
    "removing their top token pairs against random, and two published claims (negation, a few token pairs "
    "dominate) beside controls. Writes OUT/similarity/: benchmark, heads, faithfulness, aopc, claims tables, "
    "pairs.html, figures, manifest.json.",
    "minimal-pairs": "Does the masked-LM head prefer the good sentence of a minimal pair, and from which layer on? "
    "Pseudo-log-likelihood (Salazar et al. 2020's original and Kauf & Ivanova 2023's within_word_l2r) of each "
    "good and bad sentence, raw and per piece, accuracy per paradigm and field with intervals over pairs, a "
    "token-count control, and the same accuracy through every layer's logit lens. --corpus FILE: BLiMP's TSV or "
    "JSONL, or any good/bad TSV, CSV or JSONL (default: 30 builtin pairs). Needs a model with a masked-LM head. "
    "Writes OUT/minimal_pairs/: results, accuracy, summary, length-control and layer tables, figures, "
    "manifest.json.",
}
#: Experiment-specific ``bertscope run`` options, each a named shorthand for one ``--set NAME.FIELD=VALUE``: flag ->
#: (experiment, Settings field, metavar, help). The value becomes that same setting (typed and checked like
#: ``--set``, recorded once in the manifest's settings, part of what a rerun must match); giving both the flag and
#: ``--set`` for the field is an error, and so is the flag with ``run`` of another experiment. The parser reads only
#: this table (no experiment is imported to build it), so ``bertscope run --help`` lists them in one group.
RUN_OPTIONS: dict[str, tuple[str, str, str, str]] = {
    "--tokens": ("features", "tokens", "N", "features: training rows per dictionary, e.g. 200k (default 12k; "
                 "= --set features.tokens=N)"),
    "--dictionaries": ("features", "dictionaries", "DIR", "features: load trained dictionaries DIR/<site>/ "
                       "(`bertscope sae train` output) instead of training (= --set features.dictionaries=DIR)"),
    "--task": ("circuits", "task", "FILE", "circuits: analyse this pairs JSONL file (one object a line: clean, "
               "corrupted, plus query, or answers [a, b]) instead of the built-in TFC1 task (= --set "
               "circuits.task=FILE; docs/experiments/circuits.md)"),
    "--metric": ("circuits", "metric", "NAME", "circuits: the task file's metric, cosine (default), dot or "
                 "mask-logit-diff (= --set circuits.metric=NAME)"),
}


def run_option_dest(flag: str) -> str:
    """The argparse ``dest`` of a :data:`RUN_OPTIONS` flag (``--tokens`` -> ``run_option_tokens``)."""
    return "run_option_" + flag.lstrip("-").replace("-", "_")


#: Where ``benchmarks/run_all.py --record`` writes the measured run times (absent until someone measures them on
#: a quiet machine; nothing is typed in by hand).
RUN_TIMES = Path(__file__).with_name("run_times.json")


def measured_seconds(path: Path = RUN_TIMES) -> dict[str, float]:
    """Wall seconds per experiment from the recorded ``run all`` timing (``{}`` when none was recorded)."""
    try:
        record = json.loads(Path(path).read_text())
        return {name: float(row["seconds"]) for name, row in record["experiments"].items()}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def help_text(name: str, *, times: Path = RUN_TIMES) -> str:
    """``HELP[name]``, with its run time when one was recorded by ``benchmarks/run_all.py --record``."""
    text = HELP.get(name, f"Experiment {name}.")
    seconds = measured_seconds(times).get(name)
    if seconds is not None:
        text += (f" On the bundled model and builtin corpus it took about {max(seconds, 1):.0f} s "
                 f"({_machine(times)}; {_load(times)}).")
    return text


def _load(path: Path) -> str:
    """The load the recorded times assume, in words (the 1-minute load average before the run): other busy
    processes on the same cores make a run slower (``--threads`` bounds this run's share)."""
    try:
        before = json.loads(Path(path).read_text()).get("load_before")
    except (OSError, ValueError):
        before = None
    load = f"load average {before[0]:.1f}" if isinstance(before, list) and before else "load not recorded"
    return f"{load}, nothing else running: slower under other load"


def _machine(path: Path) -> str:
    try:
        record = json.loads(Path(path).read_text())
        return f"{record.get('machine', 'unknown machine')}, measured {record.get('measured', '?')}"
    except (OSError, ValueError):
        return "unknown machine"


#: The role names of an experiment's computation modules and what each holds (docs/architecture.md, "The experiment
#: template"); ``tests/experiments/test_experiment_template.py`` checks every experiment uses them. ``data`` and
#: ``measures``
#: are in every experiment, ``steps`` where the run has resumable stages of its own; a role module split by size
#: keeps its role as a prefix (``steps_more.py``).
ROLE_MODULES: dict[str, str] = {
    "data": "what is read from the model and the corpus: sites, splits, sequences, the forward passes; arrays out",
    "measures": "plain arrays in, tables out: statistics, scores and intervals; no forward pass",
    "steps": "the resumable stages of a long run: each a unit run caches or sends as jobs",
}

#: Names computation modules had before the role names; each that exists is an alias module (the very module of its
#: new name).
RETIRED_MODULES: tuple[str, ...] = ("collect", "passes", "design", "design_more", "compute")

#: Members an experiment package may define (see :class:`Experiment`); ``check_experiment`` does not require them.
OPTIONAL_MEMBERS: tuple[str, ...] = ("findings", "CAPTIONS", "check", "check_settings", "activation_sites",
                                     "NO_ACTIVATIONS", "check_capture", "capture_inputs", "PAIRS")


class CannotRun(Exception):
    """An experiment cannot run on these inputs: the corpus lacks what it needs (gold trees) or is too small.

    The one framework exception for usage problems an experiment finds. Raise it from the experiment's
    ``check(inputs, settings)`` (called before anything is written) or, if only found later, from ``run``. The
    message is one line that names what is missing and an option that fixes it. ``bertscope run NAME`` prints
    it and exits with status 2, writing nothing; ``bertscope run all`` skips the experiment with that line and
    goes on."""


def check_inputs(module: Any, inputs: Any, settings: Any = None) -> None:
    """Call the experiment's ``check(inputs, settings)`` when it has one (``settings``: its ``Settings()`` by
    default); raises `CannotRun` when the inputs do not fit the experiment."""
    check = getattr(module, "check", None)
    if check is not None:
        check(inputs, settings if settings is not None else module.Settings())


def check_settings(module: Any, model: Any, settings: Any = None) -> None:
    """Call the experiment's ``check_settings(model, settings)`` when it has one (``settings``: its ``Settings()``
    by default); raises ``ValueError`` for a setting this model cannot take."""
    check = getattr(module, "check_settings", None)
    if check is not None:
        check(model, settings if settings is not None else module.Settings())


@runtime_checkable
class Experiment(Protocol):
    """What an experiment package exposes in its ``__init__``.

    ``NAME``: CLI name; ``DIRNAME``: output folder under ``OUT``; ``SUMMARY_TABLES``: the tables the report
    shows, by name without suffix (``"summary"``: ``summary.parquet`` or ``summary.csv``); ``Settings``: a
    frozen dataclass of the experiment's defaults (part of the step-cache key);
    ``run(ctx, settings=None)``: computes everything, writes side tables with ``ctx.write_table`` and returns
    the main long table; ``plot(out_dir, formats=None)``: redraws the figures from the saved tables only, as ``formats``
    (``io.FIGURE_FORMATS`` by default), and returns the written paths. The computation modules have the role
    names of :data:`ROLE_MODULES`; ``run`` reads as a short plan of named stages.

    Optional members (``OPTIONAL_MEMBERS``; the report and the CLI use them when present):

    - ``findings(out_dir) -> list[findings.Finding]``: the sentences the report states, each formatted from the
      numbers in the tables the experiment saved under ``out_dir`` (never the model); a finding whose ``claim``
      is a key of ``findings.CLAIMS`` answers that tutorial claim, with its verdict ``holds``. If it raises, the
      report shows an error box naming the experiment.
    - ``CAPTIONS: dict[str, str]``: figure file stem (``fig_argmax_offset``) -> a caption saying what the figure
      shows and how to read it; a figure without one is marked "no caption" in the report.
    - ``activation_sites(model) -> list[str]``: the sites (names or globs) the experiment reads through the
      activations stage (`experiments.activations`); with it, ``--activations DIR`` reads them from a capture
      (checked before the run: `cli.commands.check_activations`).
    - ``NO_ACTIVATIONS: str``: for an experiment whose forward a capture cannot replace, why (``--activations``
      is then refused when it runs alone, and ignored with a note in ``run all``).
    - ``check_capture(source, inputs, options, settings) -> str | None``: for an experiment that reads a capture
      of its own sequences rather than the corpus's sentences (positions' windows), its own ``--activations``
      check in place of the sentences check: ``None`` (the capture serves the run), a reason it is not such a
      capture (refused alone; in ``run all`` the experiment runs the model and says so), or `CaptureError`.
    - ``capture_inputs(inputs, options, settings, shard_size=, info=) -> dict``: ``bertscope capture --for NAME``,
      the capture ``check_capture`` accepts; returns its index.
    - ``check(inputs, settings) -> None``: raises `CannotRun` (one line naming an option that fixes it) when the
      inputs (`options.Inputs`: model, corpus) cannot give this experiment a result: no gold trees, too few
      sentences or word pieces. Called before anything is written, with the run's ``--set`` settings, so a
      refusal leaves nothing behind; it must be cheap (no forward pass).
    - ``PAIRS: corpus.pairs.PairsFormat``: for an experiment that reads pairs of texts rather than sentences
      (similarity's scored pairs, minimal-pairs' good/bad sentences): run alone, ``--corpus FILE`` is read with
      `corpus.pairs.read_pairs` before anything is written (a bad file: one line, exit 2) and the run gets it as
      ``ctx.inputs.pairs``; with a corpus name (``builtin``) or in ``run all``, ``ctx.inputs.pairs`` is ``None``
      and the experiment uses its own builtin pairs. ``--max-sentences N`` caps the rows.
    - ``check_settings(model, settings) -> None``: raises ``ValueError`` (``"NAME.FIELD=VALUE: why"``) for a
      setting the model cannot take (a layer it lacks, more active latents than latents): a bad ``--set``, which
      the CLI refuses in one line (exit 2, in ``run all`` too) once the model is loaded, before any work
      (`check_settings`). What ``Settings`` can check alone it checks in its ``__post_init__``.
    """

    NAME: str
    DIRNAME: str
    SUMMARY_TABLES: Sequence[str]
    Settings: type

    def run(self, ctx: Any, settings: Any = None) -> Any:  # pragma: no cover - protocol
        """Compute the experiment; returns the main long table (a pandas DataFrame)."""
        ...

    def plot(self, out_dir: Path, formats: Sequence[str] | None = None) -> list[Path]:  # pragma: no cover - protocol
        """Draw the figures from the tables in ``out_dir``; returns the written paths."""
        ...


def load_experiment(name: str) -> Experiment:
    """Import the experiment registered as ``name``; unknown names raise `UsageError`."""
    from bertscope.experiments.options import UsageError

    if name not in EXPERIMENTS:
        raise UsageError(f"unknown experiment {name!r}; choose one of {', '.join([*EXPERIMENTS, 'all'])}")
    module = importlib.import_module(EXPERIMENTS[name])
    check_experiment(module)
    return module  # type: ignore[return-value]


def check_experiment(module: Any) -> None:
    """Raise ``TypeError`` naming what an experiment package lacks (see :class:`Experiment`)."""
    missing = [a for a in ("NAME", "DIRNAME", "SUMMARY_TABLES", "Settings", "run", "plot") if not hasattr(module, a)]
    if missing:
        raise TypeError(f"experiment {getattr(module, '__name__', module)} lacks {', '.join(missing)}")


def code_sha256(module: Any) -> str | None:
    """sha256 over the experiment package's source files (every ``*.py`` in its folder, by name), so a cached
    step or a skipped rerun can tell the code changed; ``None`` for modules without a file."""
    import hashlib

    file = getattr(module, "__file__", None)
    if not file:
        return None
    path = Path(file)
    files = sorted(path.parent.rglob("*.py")) if path.name == "__init__.py" else [path]
    h = hashlib.sha256()
    for f in files:
        h.update(f.relative_to(path.parent).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()
