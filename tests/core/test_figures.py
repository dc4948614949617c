"""Figures of Chinese text: a font with CJK glyphs where one is installed (TCLI_FONT to force one), else one line
that says how to get one, never a warning per glyph."""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import numpy as np
import pytest

from transformer_cli.core import figures
from transformer_cli.core.errors import UserError

pytest.importorskip("matplotlib", reason="matplotlib not installed (pip install -e .[plot])")

ROWS = ["▁今天", "天气", "很", "好", "。"]  # pieces of a Chinese translation
COLS = ["▁The", "▁weather", "▁is", "▁nice", "."]
WQY = Path("/usr/share/fonts/truetype/wqy/wqy-zenhei.ttc")


@pytest.fixture(autouse=True)
def fresh_lookup(monkeypatch):
    """Each test looks the fonts up anew and may print the note again."""
    monkeypatch.setattr(figures, "_cjk_font", [])
    monkeypatch.setattr(figures, "_said_no_font", False)
    monkeypatch.delenv(figures.FONT_ENV, raising=False)


def draw(families: list[str] | None, text: str) -> list[str]:
    """Draw `text` with `families` as rcParams font.family; the missing-glyph warnings matplotlib gives."""
    import matplotlib
    import matplotlib.figure

    rc = {"font.family": families} if families else {}
    with matplotlib.rc_context(rc), warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        fig = matplotlib.figure.Figure(figsize=(3, 1))
        fig.text(0.1, 0.5, text)
        fig.savefig(io.BytesIO(), format="png")
    return [str(x.message) for x in w if "missing from" in str(x.message)]


def test_latin_figures_keep_the_default_font():
    assert figures.font_families(["line 1: cross-attention", "▁The", "weather"]) is None


def test_chinese_text_is_drawn_with_a_cjk_font_without_missing_glyphs(tmp_path, capfd):
    if figures.cjk_font() is None:
        pytest.skip("no CJK font installed (apt-get install fonts-wqy-zenhei)")
    families = figures.font_families(ROWS)
    assert families == [figures.LATIN_FONT, figures.cjk_font()]
    assert draw(None, "今天天气很好")  # matplotlib's own font lacks the glyphs: the property can fail
    assert draw(families, "line 1: 今天天气很好。The weather is nice 「東京」") == []  # Latin and CJK both drawn
    path = tmp_path / "map.png"
    figures.heatmaps(path, [("layer 0", np.random.default_rng(0).random((5, 5)))], ROWS, COLS, "中文", "src", "tgt")
    assert path.read_bytes().startswith(b"\x89PNG")
    assert capfd.readouterr().err == ""  # no note, no warning, no font log line


def test_without_a_cjk_font_one_line_says_how_to_get_one(tmp_path, capfd, monkeypatch):
    monkeypatch.setattr(figures, "cjk_font", lambda: None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for k in range(2):  # tcli translate --attention draws four figures a line
            matrix = np.random.default_rng(k).random((5, 5))
            figures.heatmaps(tmp_path / f"{k}.png", [("layer 0", matrix)], ROWS, COLS, "line", "src", "tgt")
    assert not [w for w in caught if "missing from" in str(w.message)]
    err = capfd.readouterr().err
    assert err.splitlines() == [figures.NO_CJK_FONT]
    assert "apt-get install fonts-noto-cjk" in err and "TCLI_FONT=PATH" in err
    assert (tmp_path / "1.png").read_bytes().startswith(b"\x89PNG")  # drawn all the same


def test_tcli_font_forces_a_font_file(monkeypatch, tmp_path):
    from matplotlib import font_manager

    path = WQY if WQY.is_file() else Path(font_manager.findfont(figures.LATIN_FONT))
    monkeypatch.setenv(figures.FONT_ENV, str(path))
    families = figures.font_families(["any text"])
    assert families == [font_manager.FontProperties(fname=str(path)).get_name(), figures.LATIN_FONT]
    if path == WQY:
        assert draw(families, "今天天气很好") == []
    monkeypatch.setenv(figures.FONT_ENV, str(tmp_path / "none.ttf"))
    with pytest.raises(UserError, match="TCLI_FONT=.*none.ttf: no such font file"):
        figures.font_families(["x"])
    (tmp_path / "bad.ttf").write_text("not a font")
    monkeypatch.setenv(figures.FONT_ENV, str(tmp_path / "bad.ttf"))
    with pytest.raises(UserError, match="not a font file matplotlib can read"):
        figures.font_families(["x"])


def test_cjk_labels_get_room_for_their_width():
    assert figures.text_width("▁The") == 4 and figures.text_width("今天") == 4 and figures.text_width("！") == 2
