"""Rewrite the README's config reference between its markers from the config classes."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from config_reference import reference  # noqa: E402

START, END = "<!-- config-reference:start -->", "<!-- config-reference:end -->"


def updated(text: str) -> str:
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{reference()}{END}{tail}"


if __name__ == "__main__":
    readme = Path(__file__).resolve().parents[1] / "README.md"
    readme.write_text(updated(readme.read_text(encoding="utf-8")), encoding="utf-8")
