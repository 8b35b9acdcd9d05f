"""Atomic writes: a destination is whole or absent, whatever interrupts the writer."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from bertscope.experiments import io


def _listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_write_json_round_trip_with_paths_numpy_and_nan(tmp_path: Path) -> None:
    obj = {"path": Path("a/b"), "n": np.int64(3), "x": np.float32(0.5), "bad": math.nan, "t": (1, 2), "s": {"b", "a"}}
    path = io.write_json(tmp_path / "m.json", obj)
    assert json.loads(path.read_text()) == {"path": "a/b", "n": 3, "x": 0.5, "bad": None, "t": [1, 2], "s": ["a", "b"]}
    assert _listing(tmp_path) == ["m.json"]


def test_exception_inside_atomic_path_leaves_old_content_and_no_temp(tmp_path: Path) -> None:
    target = io.write_text(tmp_path / "table.csv", "old,complete\n")
    with pytest.raises(KeyboardInterrupt):
        with io.atomic_path(target) as tmp, open(tmp, "w") as f:
            f.write("new,half")
            raise KeyboardInterrupt  # Ctrl-C in the middle of the write
    assert target.read_text() == "old,complete\n"
    assert _listing(tmp_path) == ["table.csv"]


def test_interrupted_table_write_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    df = pd.DataFrame({"layer": range(1000), "value": np.linspace(0, 1, 1000)})
    real = pd.DataFrame.to_csv

    def half_then_interrupt(self: pd.DataFrame, path: str | os.PathLike[str], **kw: object) -> None:
        real(self.head(10), path, **kw)  # bytes reach the disk, then the user hits Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(pd.DataFrame, "to_csv", half_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        io.write_table(df, tmp_path / "results")
    # parquet came first and is complete; csv was interrupted and is absent, and no temporary remains
    assert _listing(tmp_path) == ["results.parquet"]
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "results.parquet"), df)


def test_write_table_writes_both_formats_with_the_same_content(tmp_path: Path) -> None:
    df = pd.DataFrame({"metric": ["a", "b"], "value": [0.25, 1.5]})
    paths = io.write_table(df, tmp_path / "results.parquet")
    assert [p.name for p in paths] == ["results.parquet", "results.csv"]
    pd.testing.assert_frame_equal(pd.read_csv(paths[1]), pd.read_parquet(paths[0]))
    with pytest.raises(ValueError, match="unknown table format"):
        io.write_table(df, tmp_path / "x", formats=("xlsx",))


def test_save_figure_writes_png_and_pdf_and_closes_the_figure(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    paths = io.save_figure(fig, tmp_path / "fig_line")
    assert [p.name for p in paths] == ["fig_line.png", "fig_line.pdf"]
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert paths[1].read_bytes()[:5] == b"%PDF-"
    assert not plt.fignum_exists(fig.number)


def test_interrupted_figure_save_keeps_finished_png_only(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1])
    real_savefig = fig.savefig

    def savefig(path: object, **kw: object) -> None:
        real_savefig(path, **kw)
        if kw.get("format") == "pdf":
            raise KeyboardInterrupt

    fig.savefig = savefig  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        io.save_figure(fig, tmp_path / "fig")
    assert _listing(tmp_path) == ["fig.png"]
    assert not plt.fignum_exists(fig.number)


def _busy_figure(layout: str | None = None):  # noqa: ANN202 - matplotlib Figure
    """A figure whose tight box is set by a suptitle, rotated tick labels, a colour bar and an outside legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(6, 3), layout=layout)
    im = axes[0].imshow(np.arange(12.0).reshape(3, 4), aspect="equal")
    fig.colorbar(im, ax=axes[0], label="value")
    axes[0].set_xticks(range(4), ["[CLS]", "token", "##s", "[SEP]"], rotation=90)
    axes[1].plot([0, 1], [1, 0], label="a line")
    axes[1].legend(loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.suptitle("a title\non two lines")
    if layout is None:
        fig.tight_layout()  # leaves an inert placeholder layout engine behind
    return fig


def _pixels(path: Path) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as im:
        return np.asarray(im.convert("RGBA"))


@pytest.mark.parametrize("layout", [None, "constrained"])
def test_save_figure_png_equals_savefig_tight_and_pdf_has_its_bounds(tmp_path: Path, layout: str | None) -> None:
    import matplotlib.pyplot as plt

    reference = _busy_figure(layout)
    reference.savefig(tmp_path / "reference.png", dpi=150, bbox_inches="tight")
    plt.close(reference)
    png, pdf = io.save_figure(_busy_figure(layout), tmp_path / "fig", dpi=150)
    expected, got = _pixels(tmp_path / "reference.png"), _pixels(png)
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)
    box = re.search(rb"/MediaBox \[\s*0 0 ([0-9.]+) ([0-9.]+)\s*\]", pdf.read_bytes())
    assert box is not None
    width_pt, height_pt = float(box.group(1)), float(box.group(2))
    # the same box in inches: the PNG has int(inches * 150) pixels, the PDF page inches * 72 points
    assert width_pt / 72 * 150 == pytest.approx(got.shape[1], abs=1.0)
    assert height_pt / 72 * 150 == pytest.approx(got.shape[0], abs=1.0)


def test_save_figure_draws_each_format_once(tmp_path: Path) -> None:
    # savefig(bbox_inches="tight") draws twice per format (a layout draw, then the file's); once is enough
    fig = _busy_figure()
    draws = []
    real_draw = fig.draw

    def draw(renderer: object) -> None:
        draws.append(type(renderer).__name__)
        real_draw(renderer)

    fig.draw = draw  # type: ignore[method-assign]
    io.save_figure(fig, tmp_path / "fig")
    assert draws == ["RendererAgg", "MixedModeRenderer"]  # the PDF backend wraps its renderer


def test_killed_writer_leaves_no_destination_and_partials_are_swept(tmp_path: Path) -> None:
    # A real SIGKILL mid-write: the destination never appears; only a named temporary remains, which
    # remove_partials deletes.
    target = tmp_path / "big.bin"
    script = textwrap.dedent(
        f"""
        import sys, time
        from bertscope.experiments import io
        def chunks():
            for i in range(1000):
                yield b"x" * 4096
                if i == 2:
                    print("writing", flush=True)
                time.sleep(0.01)
        io.write_chunks({str(target)!r}, chunks())
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "writing"
        time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert not target.exists()
    leftovers = [p for p in tmp_path.iterdir()]
    assert len(leftovers) == 1 and leftovers[0].name.startswith(".big.bin.")
    assert io.remove_partials(tmp_path) == leftovers
    assert _listing(tmp_path) == []


def test_atomic_path_without_a_written_file_fails_loudly(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="produced no file"):
        with io.atomic_path(tmp_path / "never.txt"):
            pass
    assert _listing(tmp_path) == []


def test_read_json_names_the_bad_file(tmp_path: Path) -> None:
    bad = tmp_path / "manifest.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="manifest.json: not valid JSON"):
        io.read_json(bad)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("4096", 4096), ("64MB", 64_000_000), ("64mb", 64_000_000), ("1GiB", 2**30), ("1.5k", 1500), ("2 MiB", 2**21)],
)
def test_parse_size(text: str, expected: int) -> None:
    assert io.parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "MB", "-1MB", "12 parsecs", "0"])
def test_parse_size_rejects_nonsense(text: str) -> None:
    with pytest.raises(ValueError, match="size"):
        io.parse_size(text)


def test_sha256_file_matches_hashlib(tmp_path: Path) -> None:
    import hashlib

    data = os.urandom(3 << 20)
    path = io.write_bytes(tmp_path / "blob", data)
    assert io.sha256_file(path) == hashlib.sha256(data).hexdigest()
