"""Write the measured tables of docs/gpu.md from the result folders of ``benchmarks/gpu.sh`` runs (each the
``$OUT/gpu`` folder a lent machine sent back: ``gpu.log`` and the checks' JSON files), so that no GPU number in the
docs is typed by hand.

    python benchmarks/gpu_report.py benchmarks/gpu_results/2026-11-27-h100-run1 benchmarks/gpu_results/... \\
        [--doc docs/gpu.md]

Without ``--doc`` the markdown goes to standard output; with it, the block between the ``gpu-runs`` markers of
that file is replaced (``benchutils.write_docs``).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from benchutils import write_docs

BLOCK = "gpu-runs"
CHECK_LINE = re.compile(r"^== benchmarks/gpu/check_(\w+)\.py rc=(\d+) seconds=(\d+)(?: limit=(\d+))?")


def _table(header: list[str], rows: list[list]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |",
            *("| " + " | ".join(str(c) for c in r) + " |" for r in rows)]


def _json(folder: Path, name: str) -> dict | None:
    path = folder / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def checks(folder: Path) -> list[dict]:
    """Each check's exit status, seconds and time limit, read from ``gpu.log``."""
    out = []
    for line in (folder / "gpu.log").read_text().splitlines():
        m = CHECK_LINE.match(line)
        if m:
            rc = int(m[2])
            out.append({"check": m[1], "rc": rc, "seconds": int(m[3]), "limit": m[4] or "",
                        "status": "complete" if rc == 0 else "cut at its time limit" if rc == 124 else "failed"})
    return out


def run_block(folder: Path) -> list[str]:
    """The markdown of one run folder."""
    log = (folder / "gpu.log").read_text().splitlines()
    meta = _json(folder, "run") or {}
    lines = [f"### {folder.name}", "", f"`{log[0]}`" if log else "", ""]
    if meta:
        lines += [f"Commit `{meta['commit']}`; command `{meta['command']}`; the machine was held "
                  f"{meta['device_seconds_held']} s (start and transfers included).", ""]
    lines += [
             "Checks (exit status and wall seconds from `gpu.log`; 124 = stopped by gpu.sh's per-check limit, "
             "having written what had finished):", ""]
    lines += _table(["check", "status", "seconds", "limit"],
                    [[c["check"], c["status"], c["seconds"], c["limit"]] for c in checks(folder)])
    act = _json(folder, "check_activations")
    if act:
        s = act.get("capture_speed")
        if s:
            lines += ["", f"**Full capture vs plain forward** ({act['model']}, {s['batch']} x {s['length']} tokens, "
                      f"median of {s['repeats']}): plain {s['plain_ms']:.1f} ms, every hook captured "
                      f"{s['full_ms']:.1f} ms, speed ratio **{s['ratio']:.3f}**; peak GPU memory "
                      f"{s.get('peak_over_captured', float('nan')):.3f} x the {s['captured_mib']:.1f} MiB captured."]
        rows = []
        for name, e in act["experiments"].items():
            d, c, eq = e["device_run"], e.get("cpu_run"), e.get("equality", {})
            rows.append([name, d["rc"], f"{d['seconds']:.1f}", f"{c['seconds']:.1f}" if c else "not reached",
                         eq.get("equal", "not reached") if c else "not reached",
                         eq.get("max_abs_diff", eq.get("why", "")) if c else ""])
        lines += ["", f"`bertscope run` on the device, {act['max_sentences']} sentences each (wall seconds of the "
                  "subprocess, its start and model load included), and the CPU rerun of the headline table where "
                  "the check got that far:", ""]
        lines += _table(["experiment", "device rc", "device s", "CPU s", "headline equal", "max abs diff"], rows)
    circ = _json(folder, "circuits")
    if circ:
        lines += ["", f"**Circuits** ({circ['heads']} heads, {circ['pairs']} TFC1 pairs; one clean forward "
                  f"{circ['forward_seconds']:.3f} s; peak {circ['peak_gib']:.2f} GiB):", ""]
        lines += _table(["method", "seconds", "forward-equivalents", "Spearman with exact patching"],
                        [[m["method"], f"{m['seconds']:.2f}", m["forward_equivalents"], f"{m['spearman_vs_exact']:.4f}"]
                         for m in circ["methods"]])
    dic = _json(folder, "dictionaries")
    if dic:
        lines += ["", f"**Dictionaries** ({dic['model']}, `{dic['site']}`, d = {dic['d_in']}, width {dic['width']}, "
                  f"trained from a capture of {dic['sentences_captured']:,} sentences made in "
                  f"{dic['capture_seconds']:.1f} s):", ""]
        lines += _table(["architecture", "k", "tokens", "batch", "seconds", "tokens/s", "peak MiB"],
                        [[r["arch"], r["k"] if r["k"] is not None else "", f"{r['tokens']:,}", r["batch"],
                          f"{r['seconds']:.1f}", f"{r['tokens_per_s']:,.0f}", f"{r['peak_mib']:.0f}"]
                         for r in dic["runs"]])
        lines += ["", f"2-process `torchrun`: {dic['torchrun_2_process']}."]
    er = _json(folder, "check_erasure")
    if er:
        for stage in ("structure", "erasure"):
            if stage in er:
                v = er[stage]
                lines += ["", f"**{stage}** on EWT ({v.get('sentences', '')} sentences read; n_train "
                          f"{v.get('n_train')}): {v['status']} in {v['seconds']:.1f} s."]
            else:
                lines += ["", f"**{stage}**: not reached within the check's limit."]
    feat = _json(folder, "features")
    if feat:
        lines += ["", f"**Features** ({feat['tokens']:,} rows per dictionary): {feat['seconds']:.1f} s."]
    return lines + [""]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path, help="result folders (each holding gpu.log)")
    p.add_argument("--doc", type=Path, default=None, help="markdown file whose gpu-runs block is replaced")
    args = p.parse_args()
    text = "\n".join(["<!-- generated by benchmarks/gpu_report.py; do not edit by hand -->", ""]
                     + [line for run in args.runs for line in run_block(run)])
    if args.doc is None:
        print(text)
    else:
        write_docs(args.doc, text, BLOCK)


if __name__ == "__main__":
    main()
