"""scripts/benchmark.py --write: one row and one section per machine; a run replaces its own machine's
and keeps every other machine's, in one file or in the pages of docs/benchmarks (a new machine gets its own page
and a nav entry in mkdocs.yml)."""

import importlib.util
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def load_benchmark():
    spec = importlib.util.spec_from_file_location("benchmark", ROOT / "scripts" / "benchmark.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def result(bench, key: str, nmt: float, decode: float | None = None) -> dict:
    machine = {
        "cpu": key.split(" [")[0],
        "isa": ["avx2"],
        "key": key,
        "cores": 2,
        "threads": 2,
        "torch": "x",
        "precision": "fp32",
    }
    r = {
        "machine": machine,
        "command": "python scripts/benchmark.py",
        "date": "2026-12-01",
        "peak_fp32": 100.0,
        "peak_bf16": None,
        "nmt": {"ours": nmt, "peer": 1000.0, "ours_all": [nmt], "peer_all": [1000.0]},
        "nmt_flops_per_token": 1e7,
    }
    if decode is not None:
        r["decode"] = {
            "ours": decode,
            "peer": 100.0,
            "ours_all": [decode],
            "peer_all": [100.0],
            "bleu": 30.0,
            "size": {"d": 32, "layers": 2, "heads": 4, "ffn": 64, "vocab": 100},
        }
    return r


def write(bench, doc: str, r: dict) -> str:
    key = r["machine"]["key"]
    doc = bench.update_machine_row(bench.add_machine_section(doc, r["machine"]), r)
    return bench.write_sections(doc, {(bench.START.format(key), bench.END.format(key)): bench.table(r)})


def test_each_machine_keeps_its_own_row_and_section():
    bench = load_benchmark()
    doc = f"# B\n\n{bench.MACHINES_START}\n| header |\n|---|\n{bench.MACHINES_END}\n\nafter the table\n"
    doc = write(bench, doc, result(bench, "CPU A [avx2]", 2500.0, decode=300.0))
    doc = write(bench, doc, result(bench, "CPU B [avx2 amx_bf16]", 1500.0))
    rows = [
        line
        for line in doc.split(bench.MACHINES_START)[1].split(bench.MACHINES_END)[0].splitlines()
        if line.startswith("| CPU")
    ]
    assert [row.split(" | ")[0] for row in rows] == ["| CPU A [avx2]", "| CPU B [avx2 amx_bf16]"]
    assert " 2.50× " in rows[0] and " 3.00× " in rows[0] and " 1.50× " in rows[1]
    assert doc.count("### CPU A [avx2]") == 1 and doc.count("### CPU B [avx2 amx_bf16]") == 1
    # The first machine's section right after the table, the next one after it, the rest of the file after both.
    order = [doc.index(text) for text in (bench.MACHINES_END, "### CPU A", "### CPU B", "after the table")]
    assert order == sorted(order)

    # Machine A again, training only: its training ratio and section are replaced, its decoding ratio kept,
    # machine B untouched.
    again = write(bench, doc, result(bench, "CPU A [avx2]", 3000.0))
    rows = [
        line
        for line in again.split(bench.MACHINES_START)[1].split(bench.MACHINES_END)[0].splitlines()
        if line.startswith("| CPU")
    ]
    assert len(rows) == 2
    assert " 3.00× | — | 3.00× " in rows[0]  # translation 3.00×, BERT not measured, decoding kept from before
    assert rows[1] == [line for line in doc.splitlines() if line.startswith("| CPU B")][0]
    assert again.count("### CPU A [avx2]") == 1 and "| 3,000 |" in again and "| 2,500 |" not in again
    assert again.split("### CPU B")[1] == doc.split("### CPU B")[1]


def test_write_results_into_one_file_is_the_same(tmp_path):
    bench = load_benchmark()
    start = f"# B\n\n{bench.MACHINES_START}\n| header |\n|---|\n{bench.MACHINES_END}\n\nafter the table\n"
    path = tmp_path / "BENCH.md"
    path.write_text(start, encoding="utf-8")
    r = result(bench, "CPU A [avx2]", 2500.0, decode=300.0)
    assert bench.write_results(path, r, sections(bench, r)) == [path]
    assert path.read_text(encoding="utf-8") == write(bench, start, r)


def sections(bench, r: dict) -> dict:
    key = r["machine"]["key"]
    return {(bench.START.format(key), bench.END.format(key)): bench.table(r)}


def machine_rows(bench, index: str) -> list[str]:
    return [
        line
        for line in index.split(bench.MACHINES_START)[1].split(bench.MACHINES_END)[0].splitlines()
        if line.startswith("| ")
    ][1:]  # without the header


MKDOCS = """site_name: t
nav:
  - Home: index.md
  - Benchmarks:
    - benchmarks/index.md
    - Machines:
      # benchmark machine pages (scripts/benchmark.py adds new ones here)
  - Other: other.md
"""


def pages(bench, tmp_path: Path) -> Path:
    """A small docs/benchmarks: the summary with the machines' table, a data page, and mkdocs.yml two folders up."""
    folder = tmp_path / "docs" / "benchmarks"
    folder.mkdir(parents=True)
    (folder / "index.md").write_text(
        f"# B\n\n{bench.MACHINES_START}\n| header |\n|---|\n{bench.MACHINES_END}\n\nafter the table\n", encoding="utf-8"
    )
    (folder / "data-at-scale.md").write_text(
        f"# Data\n\n{bench.DATA_START}\nold data\n{bench.DATA_END}\n\nkept\n", encoding="utf-8"
    )
    (tmp_path / "mkdocs.yml").write_text(MKDOCS, encoding="utf-8")
    return folder


def test_a_new_machine_gets_a_page_and_a_nav_entry_and_a_rerun_replaces_only_its_own(tmp_path):
    bench = load_benchmark()
    folder = pages(bench, tmp_path)
    a = result(bench, "AMD EPYC [avx2 fma]", 2500.0, decode=300.0)
    written = bench.write_results(folder, a, sections(bench, a))
    page_a = folder / "machines" / "amd-epyc-avx2.md"
    assert sorted(written) == sorted([folder / "index.md", page_a])
    text_a = page_a.read_text(encoding="utf-8")
    assert text_a.startswith("# AMD EPYC [avx2 fma]\n")
    assert bench.START.format("AMD EPYC [avx2 fma]") in text_a and "| 2,500 |" in text_a
    [row] = machine_rows(bench, (folder / "index.md").read_text(encoding="utf-8"))
    assert row.startswith("| AMD EPYC [avx2 fma] |") and " 2.50× " in row and " 3.00× " in row

    b = result(bench, "Intel(R) Xeon(R) Processor [avx2 amx_tile amx_bf16]", 1500.0)
    bench.write_results(folder, b, sections(bench, b))
    page_b = folder / "machines" / "intel-xeon-amx.md"
    assert bench.END.format(b["machine"]["key"]) in page_b.read_text(encoding="utf-8")
    nav = yaml.safe_load((tmp_path / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]
    assert nav[0] == {"Home": "index.md"} and nav[2] == {"Other": "other.md"}
    machines = nav[1]["Benchmarks"][1]["Machines"]
    assert sorted(machines, key=str) == sorted(
        [
            {"AMD EPYC [avx2 fma]": "benchmarks/machines/amd-epyc-avx2.md"},
            {"Intel(R) Xeon(R) Processor [avx2 amx_tile amx_bf16]": "benchmarks/machines/intel-xeon-amx.md"},
        ],
        key=str,
    )

    # Machine A again, training only: its row and section are replaced, its decoding ratio kept; machine B's row
    # and page, the data page and the nav stay as they were.
    index_before = (folder / "index.md").read_text(encoding="utf-8")
    mkdocs_before = (tmp_path / "mkdocs.yml").read_text(encoding="utf-8")
    page_b_before = page_b.read_text(encoding="utf-8")
    again = result(bench, "AMD EPYC [avx2 fma]", 3000.0)
    assert bench.write_results(folder, again, sections(bench, again)) == sorted([folder / "index.md", page_a])
    rows = machine_rows(bench, (folder / "index.md").read_text(encoding="utf-8"))
    assert len(rows) == 2 and " 3.00× | — | 3.00× " in rows[0]
    assert rows[1] == machine_rows(bench, index_before)[1]
    text_a = page_a.read_text(encoding="utf-8")
    assert "| 3,000 |" in text_a and "| 2,500 |" not in text_a and text_a.count("<!-- benchmark:start") == 1
    assert page_b.read_text(encoding="utf-8") == page_b_before
    assert (tmp_path / "mkdocs.yml").read_text(encoding="utf-8") == mkdocs_before
    assert sorted(p.name for p in (folder / "machines").iterdir()) == ["amd-epyc-avx2.md", "intel-xeon-amx.md"]
    assert "old data" in (folder / "data-at-scale.md").read_text(encoding="utf-8")


def test_a_section_goes_to_whichever_page_holds_its_markers(tmp_path):
    bench = load_benchmark()
    folder = pages(bench, tmp_path)
    key = "AMD EPYC [avx2 fma avx512f avx512_bf16]"
    hand = folder / "machines" / "named-by-hand.md"
    hand.parent.mkdir()
    hand.write_text(f"# Mine\n\nintro\n\n{bench.START.format(key)}\nold\n{bench.END.format(key)}\n\nnotes\n")
    r = result(bench, key, 2000.0)
    bench.write_results(folder, r, sections(bench, r))
    text = hand.read_text(encoding="utf-8")
    assert text.startswith("# Mine\n\nintro\n") and text.endswith("\n\nnotes\n") and "| 2,000 |" in text
    assert "old" not in text and [p.name for p in (folder / "machines").iterdir()] == ["named-by-hand.md"]
    assert (tmp_path / "mkdocs.yml").read_text(encoding="utf-8") == MKDOCS

    # The data section alone: its page is replaced around the markers, nothing else is written.
    index = (folder / "index.md").read_text(encoding="utf-8")
    written = bench.write_results(folder, None, {(bench.DATA_START, bench.DATA_END): "new data\n"})
    assert written == [folder / "data-at-scale.md"]
    data = (folder / "data-at-scale.md").read_text(encoding="utf-8")
    assert f"{bench.DATA_START}\nnew data\n{bench.DATA_END}\n\nkept\n" in data and "old data" not in data
    assert (folder / "index.md").read_text(encoding="utf-8") == index


def test_a_new_machine_without_a_nav_comment_still_gets_its_page(tmp_path, capsys):
    bench = load_benchmark()
    folder = pages(bench, tmp_path)
    (tmp_path / "mkdocs.yml").write_text("site_name: t\nnav:\n  - Home: index.md\n", encoding="utf-8")
    first = result(bench, "AMD EPYC [avx2 fma]", 2500.0)
    bench.write_results(folder, first, sections(bench, first))
    # A second key of the same model and widest flags: the next free name.
    second = result(bench, "AMD EPYC [avx2]", 2000.0)
    bench.write_results(folder, second, sections(bench, second))
    assert bench.START.format("AMD EPYC [avx2]") in (folder / "machines" / "amd-epyc-avx2-2.md").read_text()
    assert (tmp_path / "mkdocs.yml").read_text(encoding="utf-8") == "site_name: t\nnav:\n  - Home: index.md\n"
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and all("has no line" in line and "by hand" in line for line in lines)
    (tmp_path / "mkdocs.yml").unlink()
    third = result(bench, "Intel(R) Xeon(R) Processor [avx2 amx_bf16]", 1000.0)
    bench.write_results(folder, third, sections(bench, third))
    assert (folder / "machines" / "intel-xeon-amx.md").is_file()
    assert "is missing" in capsys.readouterr().err


def test_the_benchmarks_pages_have_the_markers_a_run_needs():
    bench = load_benchmark()
    folder = ROOT / "docs" / "benchmarks"
    index = (folder / "index.md").read_text(encoding="utf-8")
    assert bench.MACHINES_START in index and bench.MACHINES_END in index
    texts = {path: path.read_text(encoding="utf-8") for path in sorted(folder.rglob("*.md"))}
    rows = machine_rows(bench, index)
    assert rows
    machine_pages = set()
    for line in rows:
        key = line.split(" | ")[0].removeprefix("| ")
        if "not measured by this project" in key:  # a reported figure has no section of its own
            continue
        holders = [p for p, t in texts.items() if bench.START.format(key) in t and bench.END.format(key) in t]
        assert len(holders) == 1 and holders[0].parent == folder / "machines", key
        machine_pages |= set(holders)
    assert machine_pages == set((folder / "machines").glob("*.md"))  # and no page without its row
    assert [p.name for p, t in texts.items() if bench.DATA_START in t and bench.DATA_END in t] == ["data-at-scale.md"]
    mkdocs = ROOT / "mkdocs.yml"
    if mkdocs.is_file():  # the site's nav lists every machine page (mkdocs build --strict fails on one it does not)
        nav = mkdocs.read_text(encoding="utf-8")
        assert bench.NAV_COMMENT in nav
        for page in machine_pages:
            assert f"benchmarks/machines/{page.name}" in nav, page.name


def test_the_links_of_the_benchmarks_pages_resolve():
    """Relative links from BENCHMARKS.md and between the pages name files that exist (mkdocs --strict checks the
    site; this checks the pages as GitHub shows them too)."""
    paths = [ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs" / "benchmarks").rglob("*.md"))]
    for path in paths:
        for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text(encoding="utf-8")):
            target = target.split("#")[0]
            if target and "://" not in target:
                assert (path.parent / target).exists(), f"{path.relative_to(ROOT)}: {target}"
