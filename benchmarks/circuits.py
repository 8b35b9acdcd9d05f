"""Circuits targets: TFC1 over the UD English EWT dev sentences on the bundled model, measured with intervals.

Head scores (72 heads) by exact patching (batched per layer), AtP, AtP*, EAP-IG over the inputs (Hanna et al.'s
``get_scores_eap_ig``, MIB's "EAP-IG-inputs"), EAP-IG-activations (their ``get_scores_ig_activations``) and
``ig-act-own`` (each layer's gradient only along its own line), every method on the same pairs; the Spearman of
each method's mean head scores with exact patching's, with a 95% percentile bootstrap interval over pairs (pairs
resampled, every method's means and exact patching's recomputed on the resample: the interval covers the
variance of the pair sample, not of the model or of the estimators' own randomness, which they have none of).
The activation-interpolation methods cost ``(2 n_layers + 1) m`` and ``n_layers m`` passes a pair, so
``--act-pairs`` takes them (and their exact-patching reference) on a seeded subsample when asked.

Circuit: pairs split in two disjoint seeded halves of ``--circuit-pairs`` each; edge scores (EAP-IG, frozen LN)
and the greedy search run on the search half, and the found circuit, ``--random-circuits`` random circuits of its
size, the faithfulness curve of the edge ranking (CPR/CMD) and ``--n-random`` random edge orders are all
evaluated on the other half (selection on data not reported on).

Cost: CPU seconds of this process (``time.process_time``, all threads) per method over the same pairs, divided
by the CPU seconds of one clean forward over them (median of 3 after a warm-up): forward-equivalents.
``--bert-base`` also times every head method for the 144 heads of a random bert-base-shaped model.
``--docs FILE`` rewrites the generated blocks in FILE (between ``<!-- circuits-ewt:begin/end -->`` and
``<!-- circuits-cost:begin/end -->``).

    nice python benchmarks/circuits.py --pairs 0 --docs docs/experiments/circuits.md     # 0 = every pair

Needs ../shared/data/ud-english-ewt/en_ewt-ud-dev.conllu (from a worktree: /work/shared/...).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from benchutils import ewt_dev_path, tfc1_task, write_docs
from circuits_ig_steps import to_markdown

EWT_BLOCK, COST_BLOCK, PARTS_BLOCK = "circuits-ewt", "circuits-cost", "circuits-atp-star"


def cpu_seconds(fn):
    """``(result, CPU seconds of this process while fn ran)``."""
    start = time.process_time()
    out = fn()
    return out, time.process_time() - start


def forward_unit(model, task, batch_size: int = 16) -> float:
    """CPU seconds of one clean forward over ``task`` (median of 3 after a warm-up)."""
    from bertscope.hooks import circuits

    circuits.metric_values(model, task, "clean", batch_size)
    return statistics.median(cpu_seconds(lambda: circuits.metric_values(model, task, "clean", batch_size))[1]
                             for _ in range(3))


def head_effects(model, task, method: str, steps: int, batch_size: int = 16) -> np.ndarray:
    """``[n_pairs, n_heads]`` per-pair head effects (exact) or estimates (the others)."""
    from bertscope.hooks import circuits

    if method == "exact":
        return circuits.patching.patch_effects(model, task, "heads", batch_size=batch_size)[0]
    return circuits.attribution.attribute_effects(model, task, method, "heads", steps=steps, batch_size=batch_size)[0]


def head_table(model, task, methods: list[tuple[str, int]], act_rows: np.ndarray | None, fwd: float,
               n_boot: int, progress) -> pd.DataFrame:
    """A row per (method, steps): Spearman with exact patching and its interval (``experiments.circuits.measures.
    spearman_interval``, as in the experiment's agreement table), Pearson, pairs used, CPU seconds and
    forward-equivalents (CPU seconds / CPU seconds of one clean forward over the same pairs)."""
    from bertscope.experiments.circuits.measures import spearman_interval
    from bertscope.hooks.circuits import table

    effects, rows = {}, []
    sub = subset(task, act_rows) if act_rows is not None else None
    sub_fwd = forward_unit(model, sub) if sub is not None else fwd
    for method, steps in [("exact", 0), *methods]:
        on_sub = sub is not None and method in ("eap-ig-act", "ig-act-own")
        t = sub if on_sub else task
        progress(f"{method} (m = {steps}) on {t.n_pairs} pairs")
        eff, secs = cpu_seconds(lambda t=t, method=method, steps=steps: head_effects(model, t, method, max(steps, 1)))
        effects[(method, steps)] = eff
        ref = effects[("exact", 0)][act_rows] if on_sub else effects[("exact", 0)]
        if method != "exact" and not table.node_method(method).signed:  # a magnitude (atp*): against mean |effect|
            ref = np.abs(ref)
        rho, low, high = spearman_interval(eff, ref, n_boot=n_boot) if method != "exact" else (1.0, 1.0, 1.0)
        rows.append({"method": method, "steps": steps, "pairs": t.n_pairs, "spearman": rho, "spearman_low": low,
                     "spearman_high": high, "pearson": float(np.corrcoef(eff.mean(0), ref.mean(0))[0, 1]),
                     "cpu_seconds": secs, "forward_equivalents": secs / (sub_fwd if on_sub else fwd)})
        progress(f"  -> spearman {rho:.3f} [{low:.3f}, {high:.3f}], {secs:.0f} CPU-s")
    return pd.DataFrame(rows)


def node_parts_table(model, task, n_boot: int, progress) -> tuple[pd.DataFrame, dict]:
    """The QK fix (``atp-qk``, the ``atp*`` of runs before GradDrop) against the nodes it estimates. Exact patching
    of every head's queries, keys and values (each node kind alone, all positions), AtP and atp-qk of the same
    nodes, and:

    - per node kind: Spearman of AtP's and atp-qk's mean scores with exact patching of that node kind;
    - ``atp-qk (heads)`` against the sum of the three exact node effects (the quantity a sum over nodes estimates);
    - ``exact q + k + v`` against exact patching of the head's output: what a perfect per-node estimator would
      score when its three node scores are added (not a bound on any estimate): patching a head's output moves its
      queries, keys and values together and the sum leaves out their interaction.

    Intervals as in :func:`head_table` (pairs resampled). Returns the table and the per-pair arrays."""
    from bertscope.experiments.circuits.measures import spearman_interval
    from bertscope.hooks import circuits

    arrays, rows = {}, []
    for kind in ("queries", "keys", "values"):
        progress(f"exact patching of every head's {kind}")
        arrays[("exact", kind)], secs = cpu_seconds(
            lambda kind=kind: circuits.patching.patch_effects(model, task, kind, batch_size=16)[0])
        for method in ("atp", "atp-qk"):
            arrays[(method, kind)] = circuits.attribution.attribute_effects(model, task, method, kind)[0]
            rho, low, high = spearman_interval(arrays[(method, kind)], arrays[("exact", kind)], n_boot=n_boot)
            rows.append({"estimate": f"{method} ({kind})", "reference": f"exact ({kind})", "spearman": rho,
                         "spearman_low": low, "spearman_high": high})
            progress(f"  {method} on {kind}: spearman {rho:.3f} [{low:.3f}, {high:.3f}]")
    parts_sum = sum(arrays[("exact", k)] for k in ("queries", "keys", "values"))
    heads_exact = head_effects(model, task, "exact", 1)
    heads_star = head_effects(model, task, "atp-qk", 1)
    for name, est, ref, ref_name in (("atp-qk (heads)", heads_star, parts_sum, "exact q + k + v"),
                                     ("atp-qk (heads)", heads_star, heads_exact, "exact (heads)"),
                                     ("exact q + k + v", parts_sum, heads_exact, "exact (heads)")):
        rho, low, high = spearman_interval(est, ref, n_boot=n_boot)
        rows.append({"estimate": name, "reference": ref_name, "spearman": rho, "spearman_low": low,
                     "spearman_high": high})
    return pd.DataFrame(rows), {f"{m}:{k}": v for (m, k), v in arrays.items()}


def _subset_metric(metric, rows: np.ndarray):
    """``metric`` for a task made of the pairs ``rows`` of the original (its rows index the original's pairs)."""
    from bertscope.hooks import circuits

    idx = torch.as_tensor(rows)
    return circuits.Metric(lambda h, m, r: metric(h, m, idx[r]), metric.name)


def subset(task, rows: np.ndarray):
    """The task of pairs ``rows``."""
    from bertscope.hooks import circuits

    return circuits.Task({k: v[rows] for k, v in task.clean.items()}, {k: v[rows] for k, v in task.corrupted.items()},
                         _subset_metric(task.metric, rows), [task.pairs[i] for i in rows])


def circuit_part(model, task, n_half: int, *, steps: int, candidates: int, threshold: float, n_random: int,
                 n_random_circuits: int, seed: int, progress) -> tuple[dict, pd.DataFrame]:
    """Search a circuit on one half of the pairs, evaluate it and its controls on the other half."""
    from bertscope.hooks import circuits

    rng = np.random.default_rng(seed)
    perm = rng.permutation(task.n_pairs)
    n_half = min(n_half, task.n_pairs // 2)
    search, report = subset(task, np.sort(perm[:n_half])), subset(task, np.sort(perm[n_half:2 * n_half]))
    progress(f"edges (EAP-IG, m = {steps}) on the {n_half} search pairs")
    scores, secs_edges = cpu_seconds(lambda: circuits.edges(model, search, "eap-ig", steps=steps, batch_size=16))
    ev_s = circuits.Evaluator(model, search, batch_size=32)
    progress(f"greedy search from {candidates} candidate edges")
    circuit, secs_greedy = cpu_seconds(lambda: circuits.find_circuit(
        model, search, scores, method="greedy", candidates=candidates, threshold=threshold, evaluator=ev_s))
    progress(f"  -> {len(circuit.edges)} edges; evaluating on the {n_half} report pairs")
    ev = circuits.Evaluator(model, report, batch_size=32)
    f_report = ev.faithfulness(circuit.mask)
    rand = circuits.random_circuits(ev, len(circuit.edges), n_random_circuits, seed=seed)
    curve, areas = circuits.faithfulness(model, report, scores, n_random=n_random, seed=seed, evaluator=ev)
    out = {"search_pairs": n_half, "report_pairs": n_half, "edges": circuit.edges, "n_edges": len(circuit.edges),
           "faithfulness_search": circuit.faithfulness, "faithfulness_report": f_report,
           "random_faithfulness": rand.tolist(), "n_evaluations": circuit.n_evaluations,
           "edges_cpu_seconds": secs_edges, "greedy_cpu_seconds": secs_greedy}
    return out, areas


def bert_base_cost(task, steps: int, act_steps: int, n_pairs: int, progress) -> tuple[pd.DataFrame, float]:
    """CPU seconds and forward-equivalents of every head method for the 144 heads of a random bert-base-shaped
    model (the first ``n_pairs`` pairs' token ids; a random linear metric on the mean-pooled state)."""
    from bertscope.hooks import circuits
    from bertscope.hooks.circuits.tasks import mean_pool
    from bertscope.models import Encoder, EncoderConfig

    torch.manual_seed(0)
    model = Encoder(EncoderConfig(hidden_dropout=0.0, attention_dropout=0.0)).eval()
    u = torch.randn(model.config.d_model)
    rows = np.arange(min(n_pairs, task.n_pairs))
    big = circuits.Task({k: v[rows] for k, v in task.clean.items()}, {k: v[rows] for k, v in task.corrupted.items()},
                        circuits.Metric(lambda h, m, r: mean_pool(h, m) @ u, "dot-random"))
    fwd = forward_unit(model, big)
    out = []
    for method, m in (("exact", 0), ("atp", 0), ("atp*", 0), ("atp-qk", 0), ("eap-ig", steps),
                      ("eap-ig-act", act_steps), ("ig-act-own", act_steps)):
        progress(f"bert-base: {method}")
        _, secs = cpu_seconds(lambda method=method, m=m: head_effects(model, big, method, max(m, 1)))
        out.append({"method": method, "steps": m, "pairs": big.n_pairs, "cpu_seconds": secs,
                    "forward_equivalents": secs / fwd})
    return pd.DataFrame(out), fwd


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=0, help="TFC1 pairs (the first that EWT dev gives; 0 = all)")
    p.add_argument("--ewt", type=Path, default=ewt_dev_path())
    p.add_argument("--steps", type=int, nargs="+", default=[5], help="EAP-IG (inputs) steps m (MIB: 5)")
    p.add_argument("--act-steps", type=int, default=5, help="EAP-IG-activations / ig-act-own steps (MIB: 5)")
    p.add_argument("--act-pairs", type=int, default=0, help="pairs for the activation-IG methods (0 = all)")
    p.add_argument("--circuit-pairs", type=int, default=128, help="pairs in each half (search, report); 0 = skip")
    p.add_argument("--edge-steps", type=int, default=5)
    p.add_argument("--candidates", type=int, default=30)
    p.add_argument("--threshold", type=float, default=0.02)
    p.add_argument("--n-random", type=int, default=3)
    p.add_argument("--random-circuits", type=int, default=20)
    p.add_argument("--n-boot", type=int, default=1000)
    p.add_argument("--bert-base", type=int, default=0, metavar="PAIRS",
                   help="also time the head methods on a random bert-base-shaped model over this many pairs")
    p.add_argument("--bert-base-only", action="store_true", help="skip the bundled-model measurements")
    p.add_argument("--node-parts", type=int, default=0, metavar="PAIRS",
                   help="also measure AtP* against exact patching of the query/key/value nodes it estimates, on "
                        "the first PAIRS pairs (docs block circuits-atp-star)")
    p.add_argument("--parts-only", action="store_true", help="only the --node-parts measurement")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: no spinning threads inflate the CPU time)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    p.add_argument("--docs", type=Path, default=None, help="rewrite the generated blocks of this markdown file")
    p.add_argument("--ewt-block", default=EWT_BLOCK, help="name of the docs block the EWT tables go to")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    shown, skip = [], False
    for a in sys.argv[1:]:  # the command as docs show it: without where its own outputs went
        if skip or a in ("--json", "--docs"):
            skip = not skip
            continue
        shown.append(a)
    command = "benchmarks/circuits.py " + " ".join(shown).replace(str(args.ewt), "EWT_DEV")
    begin = time.process_time()

    def progress(msg: str) -> None:
        print(f"[{time.process_time() - begin:7.0f} CPU-s] {msg}", flush=True)

    model, task = tfc1_task(args.ewt, args.pairs if args.pairs > 0 else 10**9)
    from bertscope.experiments.corpus import load_corpus

    n_sent = len(load_corpus(str(args.ewt)))
    progress(f"{task.n_pairs} TFC1 pairs from {n_sent} EWT dev sentences")
    machine = f"{platform.machine()} CPU, {args.threads} torch threads, shared machine"
    out: dict = {"command": command, "pairs": task.n_pairs, "sentences": n_sent}
    if args.node_parts:
        sub = subset(task, np.arange(min(args.node_parts, task.n_pairs)))
        parts, _ = node_parts_table(model, sub, args.n_boot, progress)
        print(parts.to_string(index=False))
        out["node_parts"] = parts.to_dict("records")
        ceiling = parts[parts.estimate == "exact q + k + v"].iloc[0]
        own = parts[(parts.estimate == "atp-qk (heads)") & (parts.reference == "exact q + k + v")].iloc[0]
        keys = parts.set_index("estimate").loc[["atp (keys)", "atp-qk (keys)"], "spearman"]
        text = [f"Generated by `{command}` ({machine}; {time.strftime('%Y-%m-%d')}). The first {sub.n_pairs} TFC1 "
                "pairs over UD English EWT dev, bundled all-MiniLM-L6-v2, cosine metric, 72 heads; node kinds: "
                "each head's queries, keys or values at every position, patched alone from the corrupted run. "
                "Spearman of mean scores over pairs, 95% percentile bootstrap interval over pairs "
                f"({args.n_boot} resamples; pair-sampling variance only).", "",
                to_markdown(parts, ["estimate", "reference", "spearman", "spearman_low", "spearman_high"]), "",
                f"On the nodes it estimates, the QK fix (atp-qk) agrees with exact patching at {own.spearman:.3f} "
                f"[{own.spearman_low:.3f}, {own.spearman_high:.3f}] (its head score against the sum of the exact "
                f"query, key and value effects); on the key nodes the QK fix moves the agreement from "
                f"{keys['atp (keys)']:.3f} (AtP) to {keys['atp-qk (keys)']:.3f}. The sum of the three exact node "
                f"effects itself agrees with patching the head's output at {ceiling.spearman:.3f} "
                f"[{ceiling.spearman_low:.3f}, {ceiling.spearman_high:.3f}]: that is what a perfect per-node "
                "estimator would score against exact head patching when its three node scores are added, not a "
                "bound on any estimate (an estimate can rank heads closer to exact head patching than the exact "
                "node sum does); the sum leaves out the interaction of the three nodes, which patching a head's "
                "output moves together.", "",
                f"CPU time of the whole run: {time.process_time() - begin:.0f} CPU-s."]
        if args.docs:
            write_docs(args.docs, "\n".join(text), PARTS_BLOCK)
    if not args.bert_base_only and not args.parts_only:
        fwd = forward_unit(model, task)
        act_rows = None
        if 0 < args.act_pairs < task.n_pairs:
            act_rows = np.sort(np.random.default_rng(args.seed).choice(task.n_pairs, args.act_pairs, replace=False))
        methods = [("atp", 0), ("atp*", 0), ("atp-qk", 0)] + [("eap-ig", m) for m in args.steps] + [
            ("eap-ig-act", args.act_steps), ("ig-act-own", args.act_steps)]
        heads = head_table(model, task, methods, act_rows, fwd, args.n_boot, progress)
        print(heads.to_string(index=False))
        out["heads"], out["forward_cpu_seconds"] = heads.to_dict("records"), fwd
        text = [f"Generated by `{command}` ({machine}; {time.strftime('%Y-%m-%d')}). TFC1 over UD English EWT "
                f"dev: {task.n_pairs} pairs, one per sentence, from the {n_sent} dev sentences (every sentence that "
                "gives a pair: a word that occurs once, appended as one word piece, clean document at most 32 "
                "pieces); bundled all-MiniLM-L6-v2, cosine metric, 72 heads. Spearman of each method's mean head "
                f"scores with exact patching's, 95% percentile bootstrap interval over pairs ({args.n_boot} "
                "resamples of the pairs, every mean recomputed on each: pair-sampling variance only). Cost: CPU "
                f"seconds / CPU seconds of one clean forward over the same pairs ({fwd:.2f} CPU-s for "
                f"{task.n_pairs} pairs).", "",
                to_markdown(heads, ["method", "steps", "pairs", "spearman", "spearman_low", "spearman_high",
                                    "pearson", "cpu_seconds", "forward_equivalents"]), ""]
        verdict = []
        for r in heads[heads.method != "exact"].itertuples():
            met = ("met" if r.spearman_low >= 0.9 else "met by the point estimate only" if r.spearman >= 0.9
                   else "not met")
            verdict.append(f"{r.method}{f' (m = {r.steps})' if r.steps else ''} {r.spearman:.3f} "
                           f"[{r.spearman_low:.3f}, {r.spearman_high:.3f}]: {met}")
        text += ["Target Spearman >= 0.9 (met = the whole interval at or above 0.9): " + "; ".join(verdict) + "."]
        if args.circuit_pairs > 0:
            circ, areas = circuit_part(model, task, args.circuit_pairs, steps=args.edge_steps,
                                       candidates=args.candidates, threshold=args.threshold, n_random=args.n_random,
                                       n_random_circuits=args.random_circuits, seed=args.seed, progress=progress)
            out["circuit"], out["areas"] = circ, areas.to_dict("records")
            print(json.dumps(circ, default=float), "\n", areas.to_string(index=False))
            rand = np.array(circ["random_faithfulness"])
            score_area = areas[areas.ordering == "scores"].iloc[0]
            rand_areas = areas[areas.ordering != "scores"]
            text += ["", f"Circuit (EAP-IG edges, m = {args.edge_steps}, frozen LayerNorms; greedy pruning from the "
                     f"top {args.candidates} edges, threshold {args.threshold}) searched on {circ['search_pairs']} "
                     f"pairs and evaluated on {circ['report_pairs']} other pairs (a seeded disjoint split): "
                     f"{circ['n_edges']} edges ({', '.join(circ['edges'])}); faithfulness "
                     f"{circ['faithfulness_report']:.3f} on the report pairs ({circ['faithfulness_search']:.3f} on "
                     f"the search pairs); {len(rand)} random circuits of {circ['n_edges']} edges on the report "
                     f"pairs: max {rand.max():.3f}, mean {rand.mean():.3f}; the found circuit is "
                     f"{'above every one' if circ['faithfulness_report'] > rand.max() else 'NOT above every one'}. "
                     f"Faithfulness curve of the edge ranking on the report pairs: CPR "
                     f"{score_area.cpr:.3f}, CMD {score_area.cmd:.3f}; {len(rand_areas)} random edge orders: CPR "
                     f"max {rand_areas.cpr.max():.3f}, CMD min {rand_areas.cmd.min():.3f} (CPR "
                     f"{'above' if score_area.cpr > rand_areas.cpr.max() else 'NOT above'} every random order). "
                     f"Search cost: edges {circ['edges_cpu_seconds']:.0f} CPU-s, greedy "
                     f"{circ['greedy_cpu_seconds']:.0f} CPU-s ({circ['n_evaluations']} circuit evaluations)."]
        text += ["", f"CPU time of the whole run: {time.process_time() - begin:.0f} CPU-s."]
        if args.docs:
            write_docs(args.docs, "\n".join(text), args.ewt_block)
    if args.bert_base:
        big, fwd_big = bert_base_cost(task, args.steps[0], args.act_steps, args.bert_base, progress)
        print(big.to_string(index=False))
        out["bert_base"] = big.to_dict("records")
        text = [f"Generated by `{command}` ({machine}; {time.strftime('%Y-%m-%d')}). Random bert-base-shaped "
                f"model (12 layers x 12 heads, d_model 768), the first {int(big.pairs.iloc[0])} TFC1 pairs' token "
                "ids, a random linear metric on the mean-pooled state, all 144 heads. Unit: one clean forward "
                f"over the same pairs ({fwd_big:.2f} CPU-s).", "",
                to_markdown(big, ["method", "steps", "pairs", "cpu_seconds", "forward_equivalents"])]
        if args.docs:
            write_docs(args.docs, "\n".join(text), COST_BLOCK)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=float))


if __name__ == "__main__":
    main()
