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
    "transformer_cli.translate",
    "transformer_cli.evaluate",
    "transformer_cli.fill_mask",
    "transformer_cli.predict",
    "transformer_cli.attention",
    "transformer_cli.hf",
    "transformer_cli.export.average",
    "transformer_cli.export.ct2",
    "transformer_cli.params",
    "transformer_cli.plot",
)
TRAINING = ("transformer_cli.train", "transformer_cli.run", "transformer_cli.tasks")


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
    for module in INFERENCE:
        if module not in edges:  # a command not built in this tree
            continue
        bad = sorted(m for m in reachable(module, edges) if any(m == t or m.startswith(t + ".") for t in TRAINING))
        assert not bad, f"{module} reaches {bad}"


def test_the_graph_sees_deferred_imports(tmp_path):
    """The reader counts an import inside a function (the way cycles hid before)."""
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from transformer_cli.train import loop\n")
    known = {"transformer_cli.m", "transformer_cli.train", "transformer_cli.train.loop"}
    assert imports_of("transformer_cli.m", source, known) == {"transformer_cli.train.loop"}
