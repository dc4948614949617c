"""Write the generated reference pages of the docs site from the code, or check that they are current.

    python scripts/docs_reference.py           # rewrite docs/reference/commands.md and docs/reference/config.md
    python scripts/docs_reference.py --check   # exit 1 naming the stale page (tests/test_docs.py runs this check)

commands.md comes from the Typer app (every command, argument and option with its help, as `tcli CMD --help`
prints it); config.md from the pydantic config classes (every key with type, default and meaning).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import click
import typer.main

sys.path.insert(0, str(Path(__file__).resolve().parent))
from config_reference import reference  # noqa: E402

from transformer_cli.cli import app  # noqa: E402

DOCS = Path(__file__).resolve().parents[1] / "docs" / "reference"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def commands_page() -> str:
    group = typer.main.get_command(app)
    lines = [
        "# Commands",
        "",
        "Every command and option, as `tcli COMMAND --help` prints them (generated from the code by",
        "`scripts/docs_reference.py`). The guides show them at work; `python -m transformer_cli` is the same as",
        "`tcli`.",
        "",
    ]
    for name, command in group.commands.items():
        ctx = click.Context(command, info_name=name, parent=click.Context(group, info_name="tcli"))
        lines += [
            f"## `tcli {name}`",
            "",
            (command.help or "").strip(),
            "",
            "```text",
            command.get_usage(ctx),
            "```",
            "",
        ]
        rows = []
        for param in command.params:
            record = param.get_help_record(ctx)
            if record is None:  # an argument, or a hidden option
                if isinstance(param, click.Argument):
                    rows.append((f"`{param.human_readable_name}`", "argument"))
                continue
            rows.append((f"`{_cell(record[0])}`", _cell(record[1])))
        if rows:
            lines += ["| option | meaning |", "|---|---|", *(f"| {a} | {b} |" for a, b in rows), ""]
    return "\n".join(lines).rstrip() + "\n"


def config_page() -> str:
    head = [
        "# Config keys",
        "",
        "Every key of the YAML files, by command, with its type, default and meaning (generated from the config",
        "classes by `scripts/docs_reference.py`). `--set section.key=value` overrides any of them on the command line;",
        "a key the table does not list is refused in one line naming it.",
        "",
    ]
    return "\n".join(head) + reference().replace("#### ", "## ")


PAGES = {"commands.md": commands_page, "config.md": config_page}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="report stale pages instead of writing them")
    a = p.parse_args()
    stale = []
    for name, make in PAGES.items():
        path, text = DOCS / name, make()
        if a.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(str(path))
        else:
            path.write_text(text, encoding="utf-8")
    if stale:
        print("stale generated pages (run: python scripts/docs_reference.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
