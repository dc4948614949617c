"""Print the config reference (markdown tables) from the typed config classes.

docs/reference/config.md is built from it (scripts/docs_reference.py); tests/test_docs.py checks they agree.
    python scripts/config_reference.py
"""

from __future__ import annotations

import types
import typing

from pydantic import BaseModel

from transformer_cli.config import BertRunConfig, FinetuneRunConfig, TranslationRunConfig


def _type_name(annotation) -> str:
    if typing.get_origin(annotation) is typing.Literal:
        return " \\| ".join(str(a) for a in typing.get_args(annotation))
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and any(
        typing.get_origin(a) is typing.Literal for a in args
    ):  # Literal[...] | None
        return " \\| ".join("None" if a is type(None) else _type_name(a) for a in args)
    text = getattr(annotation, "__name__", None) or str(annotation)
    return text.replace("typing.", "").replace("NoneType", "null").replace("|", "\\|")


def section_table(run: type[BaseModel], title: str) -> str:
    lines = [f"#### {title}", "", "| key | type | default | meaning |", "|---|---|---|---|"]
    for section, field in run.model_fields.items():
        model = field.annotation
        for name, f in model.model_fields.items():
            default = f.default
            shown = "null" if default is None else str(list(default) if isinstance(default, tuple) else default)
            if isinstance(default, bool):
                shown = str(default).lower()
            lines.append(f"| `{section}.{name}` | {_type_name(f.annotation)} | `{shown}` | {f.description} |")
    return "\n".join(lines)


def reference() -> str:
    return (
        "\n\n".join(
            [
                section_table(TranslationRunConfig, "`tcli train` (translation)"),
                section_table(BertRunConfig, "`tcli pretrain-bert` (BERT)"),
                section_table(FinetuneRunConfig, "`tcli finetune` (fine-tuning)"),
            ]
        )
        + "\n"
    )


if __name__ == "__main__":
    print(reference(), end="")
