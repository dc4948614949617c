"""The shape of the package: no import circles, and inference never reaches into training.

The graph is read from the source (nothing is imported), counting imports inside functions too: a deferred import
still ties two modules together.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "transformer_cli"

# What a user runs on a trained checkpoint: none of it may import the training package or a task's trainer side.
INFERENCE = (
    "transformer_cli.translation.translate",
    "transformer_cli.translation.attention",
    "transformer_cli.bert.fill_mask",
    "transformer_cli.bert.embed",
    "transformer_cli.finetune.predict",
    "transformer_cli.tools.evaluate",
    "transformer_cli.tools.plot",
    "transformer_cli.tools.count_params",
    "transformer_cli.export.hf",
    "transformer_cli.export.hf_folder",
    "transformer_cli.export.average",
    "transformer_cli.export.ct2",
)
TRAINING = (
    "transformer_cli.train",
    "transformer_cli.translation.task",
    "transformer_cli.translation.setup",
    "transformer_cli.bert.task",
    "transformer_cli.bert.setup",
    "transformer_cli.finetune.task",
    "transformer_cli.finetune.setup",
)


def module_files() -> dict[str, Path]:
    return {
        ".".join(("transformer_cli", *p.with_suffix("").relative_to(PACKAGE).parts)).removesuffix(".__init__"): p
        for p in PACKAGE.rglob("*.py")
    }


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The package modules `name` imports (from X import Y counts X.Y when that is a module, else X)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            stem = ".".join(package[: len(package) - node.level + 1]) if node.level else ""
            base = ".".join(x for x in (stem, node.module or "") if x)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        found |= {t for t in targets if t in known and t != name}
    return found


def graph() -> dict[str, set[str]]:
    files = module_files()
    return {name: imports_of(name, path, set(files)) for name, path in files.items()}


def reachable(start: str, edges: dict[str, set[str]]) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in edges[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def test_no_import_circles():
    edges = graph()
    circles = sorted(
        {" <-> ".join(sorted((a, b))) for a in edges for b in reachable(a, edges) if a in reachable(b, edges)}
    )
    assert not circles, circles


def test_inference_never_imports_training():
    edges = graph()
    missing = [m for m in INFERENCE + TRAINING if m not in edges]
    assert not missing, f"modules this rule names are not in the package (moved? update the lists): {missing}"
    for module in INFERENCE:
        bad = sorted(m for m in reachable(module, edges) if any(m == t or m.startswith(t + ".") for t in TRAINING))
        assert not bad, f"{module} reaches {bad}"


def test_the_graph_sees_deferred_imports(tmp_path):
    """The reader counts an import inside a function (the way cycles hid before)."""
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from transformer_cli.train import loop\n")
    known = {"transformer_cli.m", "transformer_cli.train", "transformer_cli.train.loop"}
    assert imports_of("transformer_cli.m", source, known) == {"transformer_cli.train.loop"}


def folder_of(module: str) -> str:
    """The room a module lives in: its top-level folder (transformer_cli.train.loop -> train), or itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_folders_form_layers():
    """Folders import one way only (core at the bottom, cli at the top): no two folders import each other,
    directly or around a loop, so each folder can be read knowing only the ones below it."""
    edges = graph()
    folders: dict[str, set[str]] = {}
    for a, targets in edges.items():
        folders.setdefault(folder_of(a), set()).update(folder_of(b) for b in targets if folder_of(b) != folder_of(a))
    loops = sorted(
        {" <-> ".join(sorted((a, b))) for a in folders for b in reachable(a, folders) if a in reachable(b, folders)}
    )
    assert not loops, loops
    assert "core" in folders and not folders["core"], f"core imports {folders.get('core')}"


def test_every_folder_says_what_it_holds():
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        where = init.relative_to(PACKAGE.parent)
        assert doc and len(doc) > 40, f"{where} has no docstring saying what the folder holds"
