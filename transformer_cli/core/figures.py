"""Heatmaps of attention weights, sized so that 5 pieces and 80 pieces both read well (matplotlib, optional).

matplotlib is imported inside the functions (the `plot` extra); the figures are drawn on the Agg canvas
without pyplot, so nothing global (backend, open figures) is touched.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from transformer_cli.core.errors import UserError

HEATMAP_MAX_PIECES = 100  # pieces drawn per axis of a heatmap: about 1,500 pixels a side at its smallest cells


def printable(text: str) -> str:
    """`text` as a figure shows it: a control character (a tab in a folder's name) as its escape, for which
    the font has a glyph, instead of a missing glyph and matplotlib's warning on stderr."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def require_matplotlib() -> Any:
    """The matplotlib.figure module, or a one-line error that says how to install it."""
    try:
        import matplotlib.figure
    except ImportError:
        raise UserError(
            "this needs matplotlib, which is not installed: pip install 'transformer-cli[plot]' "
            "(or pip install matplotlib)"
        ) from None
    return matplotlib.figure


def image_format(path: Path, option: str) -> str:
    """The image format a path's extension names (none: PNG), or a one-line error listing those there are."""
    from matplotlib.backend_bases import FigureCanvasBase

    fmt = path.suffix[1:].lower() or "png"
    supported = FigureCanvasBase.get_supported_filetypes()
    if fmt not in supported:
        raise UserError(
            f"{option} {path}: matplotlib cannot write .{fmt} files; use one of "
            f"{', '.join('.' + f for f in sorted(supported))} (or no extension for PNG)"
        )
    if fmt == "pgf":  # drawn through a TeX program; without one, matplotlib fails after the drawing has begun
        import shutil

        from matplotlib import rcParams

        if shutil.which(rcParams["pgf.texsystem"]) is None:
            raise UserError(
                f"{option} {path}: .pgf is drawn with {rcParams['pgf.texsystem']}, which is not installed; "
                "install TeX, or use .pdf, .svg or .png"
            )
    return fmt


# How each image format's files begin (offset, bytes): a file there that begins otherwise is not an earlier image
# of ours (a checkpoint, a run's .lock, a text) and is not replaced. raw and rgba have no header.
SIGNATURES = {
    "png": [(0, b"\x89PNG\r\n\x1a\n")],
    "pdf": [(0, b"%PDF")],
    "svg": [(0, b"<?xml"), (0, b"<svg")],
    "svgz": [(0, b"\x1f\x8b")],
    "eps": [(0, b"%!PS"), (0, b"\xc5\xd0\xd3\xc6")],
    "ps": [(0, b"%!PS")],
    "jpg": [(0, b"\xff\xd8\xff")],
    "jpeg": [(0, b"\xff\xd8\xff")],
    "tif": [(0, b"II*\x00"), (0, b"MM\x00*")],
    "tiff": [(0, b"II*\x00"), (0, b"MM\x00*")],
    "gif": [(0, b"GIF8")],
    "webp": [(8, b"WEBP")],
    "avif": [(4, b"ftyp")],
    "pgf": [(0, b"%%")],
}


def check_image_replaceable(path: Path, fmt: str, option: str) -> None:
    """A one-line error, before drawing, when `path` holds a file that is not an image of `fmt` (a checkpoint
    copied to a name without an extension): tcli plot replaces only an earlier image of its own."""
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except FileNotFoundError:
        return
    except OSError as e:
        raise UserError(f"{option} {path}: cannot read the file there ({e.strerror or e}); give another path") from None
    if fmt in SIGNATURES and not any(head[at : at + len(sig)] == sig for at, sig in SIGNATURES[fmt]):
        raise UserError(
            f"{option} {path} exists and is not a .{fmt} image: writing the plot would replace it; give a new "
            "file name, or delete that file first"
        )


def save_figure(fig: Any, path: Path, dpi: float) -> None:
    """The figure drawn into memory, then written atomically under exactly `path`: a kill never leaves a
    truncated image under the final name (and the next write removes the temporary file a SIGKILL left)."""
    import io

    from transformer_cli.core.files import remove_stale_temporaries, write_atomic

    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=dpi, format=image_format(path, "the output"))
    remove_stale_temporaries(path.parent, path.name, live_writers=True)
    write_atomic(buffer.getvalue(), path)


def _sizes(n_rows: int, n_cols: int, longest_label: int) -> tuple[float, float, float]:
    """(cell size in inches, tick font size in points, label margin in inches) for a panel of
    n_rows x n_cols cells: cells shrink as the sentence grows, the font follows the cell."""
    cell = min(0.45, max(0.11, 7.0 / max(n_rows, n_cols, 1)))
    font = min(11.0, max(5.0, cell * 72 * 0.75))
    margin = 0.3 + longest_label * font / 72 * 0.62  # the width of the longest tick label
    return cell, font, margin


def heatmaps(
    path: Path,
    panels: list[tuple[str, np.ndarray]],
    rows: list[str],
    cols: list[str],
    title: str,
    xlabel: str,
    ylabel: str,
    vmin: float = 0.0,
    vmax: float | None = None,
    bar_label: str = "attention weight",
) -> None:
    """One PNG: a heatmap per (panel title, (len(rows), len(cols)) matrix), on one colour scale from `vmin` to
    `vmax` (default: 0 to the largest weight), with the pieces as tick labels. At most HEATMAP_MAX_PIECES pieces
    of each axis are drawn (the first ones; the title says so), so that an image stays a size a viewer opens."""
    figure_module = require_matplotlib()
    if max(len(rows), len(cols)) > HEATMAP_MAX_PIECES:
        title += f" (first {min(len(rows), HEATMAP_MAX_PIECES)} of {len(rows)} x {min(len(cols), HEATMAP_MAX_PIECES)}"
        title += f" of {len(cols)} pieces drawn)"
        panels = [(name, m[:HEATMAP_MAX_PIECES, :HEATMAP_MAX_PIECES]) for name, m in panels]
        rows, cols = rows[:HEATMAP_MAX_PIECES], cols[:HEATMAP_MAX_PIECES]
    cell, font, margin = _sizes(len(rows), len(cols), max(map(len, rows + cols), default=1))
    panel_w, panel_h = cell * len(cols) + margin + 0.4, cell * len(rows) + margin + 0.3
    # side by side up to about 22 inches; panels much wider than tall go one under the other
    ncols = 1 if panel_w > 2.5 * panel_h else max(1, min(len(panels), int(22 // panel_w)))
    nrows = math.ceil(len(panels) / ncols)
    fig = figure_module.Figure(figsize=(panel_w * ncols + 1.2, panel_h * nrows + 0.4), layout="constrained")
    fig.suptitle(printable(title), fontsize=max(font + 2, 10))
    if vmax is None:
        vmax = max(float(m.max()) for _, m in panels) or 1.0
    axes = fig.subplots(nrows, ncols, squeeze=False)
    image = None
    for ax, (name, matrix) in zip(axes.flat, panels):
        image = ax.imshow(matrix, cmap="viridis", vmin=vmin, vmax=vmax, aspect="equal", interpolation="nearest")
        ax.set_title(name, fontsize=font + 1)
        ax.set_xticks(range(len(cols)), cols, rotation=90, fontsize=font)
        ax.set_yticks(range(len(rows)), rows, fontsize=font)
        ax.set_xlabel(xlabel, fontsize=font + 1)
        ax.set_ylabel(ylabel, fontsize=font + 1)
        ax.tick_params(length=2, pad=1)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label=bar_label)
    save_figure(fig, path, dpi=100 if max(len(rows), len(cols)) <= 40 else 130)
