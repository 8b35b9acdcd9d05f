"""An experiment module importable by name (tests put this folder on sys.path), for the figure pipeline's
tests: a spawned process can import it, unlike the in-memory fakes. Its figure records which process drew
it; ``plot`` raises when the table asks it to."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pandas as pd

NAME = "pipeline-fake"
DIRNAME = "pipeline_fake"
SUMMARY_TABLES: list[str] = []


@dataclasses.dataclass(frozen=True)
class Settings:
    fail_plot: bool = False


def run(ctx, settings: Settings | None = None) -> pd.DataFrame:  # noqa: ANN001
    settings = ctx.use_settings(settings)
    lengths = [len(s.words) for s in ctx.corpus]
    return pd.DataFrame({"sentence": range(len(lengths)), "n_words": lengths, "fail_plot": settings.fail_plot})


def plot(out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from bertscope.experiments import io

    table = pd.read_parquet(Path(out_dir) / "results.parquet")
    if table["fail_plot"].any():
        raise RuntimeError("planted drawing bug")
    (Path(out_dir) / "drawn_by.txt").write_text(str(os.getpid()))
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.bar(table["sentence"], table["n_words"])
    ax.set_title("Words per sentence")
    return io.save_figure(fig, Path(out_dir) / "fig_words")
