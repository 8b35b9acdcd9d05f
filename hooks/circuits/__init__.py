"""Circuits in encoders: patching, attribution patching and edge discovery that are correct for post-LN models.

One entry point per step (definitions and equations in ``docs/experiments/circuits.md``):

>>> task = load_task(model, "pairs.jsonl", metric="cosine")     # counterfactual pairs + a metric
>>> exact = patch(model, task, "heads")                          # exact activation patching, a tidy table
>>> est = attribute(model, task, "atp*")                         # AtP / AtP* / EAP-IG estimates, same table
>>> scores = edges(model, task, "eap-ig")                        # edge scores on the frozen-LayerNorm graph
>>> circuit = find_circuit(model, task, scores)                  # greedy pruning with exact patching
>>> curve, areas = faithfulness(model, task, scores, n_random=5) # MIB faithfulness curve, CPR, CMD

Modules: ``table`` (the registered node and edge attribution methods and the one set of defaults, ``DEFAULTS``),
``tasks`` (pairs and metrics), ``graph`` (senders, receivers, the frozen-LN rebuilt forward), ``patching``,
``attribution``, ``edges``, ``search``.
"""

from bertscope.hooks.circuits.attribution import attribute
from bertscope.hooks.circuits.edges import EdgeScores, circuit_metric, edges, path_patch
from bertscope.hooks.circuits.graph import Graph, graph_of
from bertscope.hooks.circuits.patching import metric_values, patch
from bertscope.hooks.circuits.search import (
    PERCENTAGES,
    Circuit,
    Evaluator,
    area_under_curve,
    faithfulness,
    find_circuit,
    random_circuits,
    top_edges,
)
from bertscope.hooks.circuits.tasks import METRICS, Metric, Task, TaskError, load_task, make_task

__all__ = [
    "METRICS",
    "PERCENTAGES",
    "Circuit",
    "EdgeScores",
    "Evaluator",
    "Graph",
    "Metric",
    "Task",
    "TaskError",
    "area_under_curve",
    "attribute",
    "circuit_metric",
    "edges",
    "faithfulness",
    "find_circuit",
    "graph_of",
    "load_task",
    "make_task",
    "metric_values",
    "patch",
    "path_patch",
    "random_circuits",
    "top_edges",
]
