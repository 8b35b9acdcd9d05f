"""GPU check: `bertscope run features` on the random bert-base-shaped model (12 x 12 x 768; ``--small``: 2 x 4 x 64)
over the builtin corpus, dictionaries trained on the device; prints and saves the wall time and the summary.

    python benchmarks/gpu/check_features.py [--device cuda] [--out results/gpu] [--small]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import parser, random_bert, write_result  # noqa: E402


def main() -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=100_000, help="training rows per dictionary (--small: 2048)")
    args = p.parse_args()
    import pandas as pd
    import torch
    from bertscope.experiments import features
    from bertscope.experiments.corpus import load_corpus
    from bertscope.experiments.options import Inputs, RunOptions, corpus_summary, model_summary
    from bertscope.experiments.runner import run_experiment

    from bertscope import models

    work = Path(tempfile.mkdtemp(prefix="check_features_"))
    model = models.load(str(random_bert(small=args.small)), device=args.device)
    corpus = load_corpus("builtin", max_sentences=120 if args.small else 1200)
    settings = (features.Settings(n_train=60, n_dev=20, n_test=20, width="128", k=8, tokens=2048, batch_size=256,
                                  buffer_rows=2048, n_boot=20) if args.small else
                features.Settings(n_train=800, n_dev=200, n_test=200, width="8x", tokens=args.tokens,
                                  batch_size=4096, buffer_rows=65536))
    features.Settings = lambda: settings  # the run reads the experiment's Settings()
    inputs = Inputs(model, corpus, torch.device(args.device), torch.float32, model_summary(model),
                    corpus_summary(corpus))
    t0 = time.perf_counter()
    result = run_experiment(features, RunOptions(out=work / "out", quiet=True, device=args.device), inputs)
    seconds = time.perf_counter() - t0
    if result.status != "complete":
        print(f"features: {result.status}: {result.error}")
        return 1
    s = pd.read_parquet(work / "out" / "features" / "summary.parquet")
    lat = s[(s["encoder"] == "trained") & (s["basis"] == "latent")]
    for r in lat.itertuples():
        print(f"features {r.site}: {r.n_labelled} of {r.n_units} latents labelled "
              f"({r.n_position} position, {r.n_duplicate} duplicate, {r.n_syntax} syntax)")
    print(f"features on {'small' if args.small else 'bert-base-shaped'} random model, {args.device}: {seconds:.1f} s "
          f"({settings.tokens} rows per dictionary, {len(lat)} sites, trained and re-initialised)")
    write_result(args.out, "features", {"device": args.device, "small": args.small, "seconds": seconds,
                                        "tokens": settings.tokens, "summary": s.to_dict("records")})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
