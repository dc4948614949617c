"""Heatmaps of attention weights, sized so that 5 pieces and 80 pieces both read well (matplotlib, optional).

matplotlib is imported inside the functions (the `plot` extra); the figures are drawn on the Agg canvas
without pyplot, so nothing global (backend, open figures) is touched.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from transformer_cli.errors import UserError


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
) -> None:
    """One PNG: a heatmap per (panel title, (len(rows), len(cols)) matrix), on one colour scale from 0 to
    the largest weight, with the pieces as tick labels."""
    figure_module = require_matplotlib()
    cell, font, margin = _sizes(len(rows), len(cols), max(map(len, rows + cols), default=1))
    panel_w, panel_h = cell * len(cols) + margin + 0.4, cell * len(rows) + margin + 0.3
    # side by side up to about 22 inches; panels much wider than tall go one under the other
    ncols = 1 if panel_w > 2.5 * panel_h else max(1, min(len(panels), int(22 // panel_w)))
    nrows = math.ceil(len(panels) / ncols)
    fig = figure_module.Figure(figsize=(panel_w * ncols + 1.2, panel_h * nrows + 0.4), layout="constrained")
    fig.suptitle(title, fontsize=max(font + 2, 10))
    vmax = max(float(m.max()) for _, m in panels) or 1.0
    axes = fig.subplots(nrows, ncols, squeeze=False)
    image = None
    for ax, (name, matrix) in zip(axes.flat, panels):
        image = ax.imshow(matrix, cmap="viridis", vmin=0.0, vmax=vmax, aspect="equal", interpolation="nearest")
        ax.set_title(name, fontsize=font + 1)
        ax.set_xticks(range(len(cols)), cols, rotation=90, fontsize=font)
        ax.set_yticks(range(len(rows)), rows, fontsize=font)
        ax.set_xlabel(xlabel, fontsize=font + 1)
        ax.set_ylabel(ylabel, fontsize=font + 1)
        ax.tick_params(length=2, pad=1)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label="attention weight")
    fig.savefig(path, dpi=100 if max(len(rows), len(cols)) <= 40 else 130)
