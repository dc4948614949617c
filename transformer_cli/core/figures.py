"""Heatmaps of attention weights, sized so that 5 pieces and 80 pieces both read well (matplotlib, optional).

matplotlib is imported inside the functions (the `plot` extra); the figures are drawn on the Agg canvas
without pyplot, so nothing global (backend, open figures) is touched.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import unicodedata
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from transformer_cli.core.cjk import has_cjk
from transformer_cli.core.errors import UserError

HEATMAP_MAX_PIECES = 100  # pieces drawn per axis of a heatmap: about 1,500 pixels a side at its smallest cells

FONT_ENV = "TCLI_FONT"  # the path of a font file that draws every text of the figures
LATIN_FONT = "DejaVu Sans"  # matplotlib's own font, always there
# Fonts with CJK glyphs, the first one installed is taken: Noto / Source Han (Linux, fonts-noto-cjk), WenQuanYi
# (fonts-wqy-zenhei, fonts-wqy-microhei), Droid and AR PL (older Linux), then those of macOS and Windows.
CJK_FONTS = (
    "Noto Sans CJK SC",
    "Noto Sans CJK JP",
    "Noto Sans CJK TC",
    "Noto Sans CJK KR",
    "Noto Sans SC",
    "Source Han Sans SC",
    "Source Han Sans CN",
    "WenQuanYi Zen Hei",
    "WenQuanYi Micro Hei",
    "Droid Sans Fallback",
    "AR PL UMing CN",
    "AR PL UKai CN",
    "PingFang SC",
    "Hiragino Sans GB",
    "Heiti SC",
    "Microsoft YaHei",
    "SimHei",
    "Arial Unicode MS",
)
NO_CJK_FONT = (
    "note: the figure holds Chinese, Japanese or Korean text but no installed font has those characters (they are "
    "drawn as boxes): install one (apt-get install fonts-noto-cjk, or fonts-wqy-zenhei) or set TCLI_FONT=PATH to a "
    "font file"
)
_said_no_font = False  # the note is printed once per process, however many figures are drawn
_cjk_font: list[str | None] = []  # the CJK font found (None: none), looked up once per process


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


def cjk_font() -> str | None:
    """The family name of an installed font with CJK glyphs (one of CJK_FONTS), or None. Fonts installed after
    matplotlib built its font cache are not in it: when the cache has none, the system's font files it lacks are
    read too."""
    if not _cjk_font:
        from matplotlib import font_manager

        found = _first_cjk(font_manager.fontManager.ttflist)
        if found is None:
            known = {f.fname for f in font_manager.fontManager.ttflist}
            for path in font_manager.findSystemFonts():
                if path not in known:
                    with contextlib.suppress(Exception):  # a font file FreeType cannot read is skipped
                        font_manager.fontManager.addfont(path)
            found = _first_cjk(font_manager.fontManager.ttflist)
        _cjk_font.append(found)
    return _cjk_font[0]


def _first_cjk(fonts: Iterable[Any]) -> str | None:
    names = {f.name for f in fonts}
    return next((name for name in CJK_FONTS if name in names), None)


def font_families(texts: Iterable[str]) -> list[str] | None:
    """rcParams["font.family"] for a figure that shows `texts`: the TCLI_FONT file's font (then matplotlib's for
    what it lacks); for CJK text, matplotlib's font then an installed CJK font (matplotlib falls back glyph by
    glyph along the list); None: matplotlib's default. With CJK text and no CJK font, a one-line note says how to
    get one (once per process)."""
    global _said_no_font
    forced = os.environ.get(FONT_ENV)
    if forced:
        from matplotlib import font_manager

        if not Path(forced).is_file():
            raise UserError(f"{FONT_ENV}={forced}: no such font file; give the path of a .ttf, .otf or .ttc file")
        try:
            font_manager.fontManager.addfont(forced)
            name = font_manager.FontProperties(fname=forced).get_name()
        except Exception as e:
            raise UserError(f"{FONT_ENV}={forced}: not a font file matplotlib can read ({e})") from None
        return [name, LATIN_FONT]
    if not any(has_cjk(text) for text in texts):
        return None
    found = cjk_font()
    if found is None:
        if not _said_no_font:
            print(NO_CJK_FONT, file=sys.stderr, flush=True)
            _said_no_font = True
        return None
    return [LATIN_FONT, found]


@contextlib.contextmanager
def text_fonts(texts: Iterable[str]) -> Iterator[None]:
    """Draw (create and save) a figure that shows `texts` in here: with the fonts of `font_families`, and without
    matplotlib's warning for every glyph a font lacks (the one-line note has said what to do)."""
    import matplotlib

    families = font_families(texts)
    # a CJK font of one weight (WenQuanYi's is 500) is logged at every text asking for another ("normal")
    log = logging.getLogger("matplotlib.font_manager")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        with matplotlib.rc_context({"font.family": families} if families else {}), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from")
            yield
    finally:
        log.setLevel(level)


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


def text_width(text: str) -> int:
    """The width of `text` in Latin characters: a CJK character (East Asian wide or full-width) takes two."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


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
    with text_fonts([title, *rows, *cols]):  # created and saved under the fonts of its text
        cell, font, margin = _sizes(len(rows), len(cols), max(map(text_width, rows + cols), default=1))
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
