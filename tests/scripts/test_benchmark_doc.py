"""scripts/benchmark.py --write: one row and one section per machine; a run replaces its own machine's
and keeps every other machine's."""

import importlib.util
from pathlib import Path

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


def test_benchmarks_md_has_the_markers_a_run_needs():
    bench = load_benchmark()
    doc = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    assert bench.MACHINES_START in doc and bench.MACHINES_END in doc
    table = doc.split(bench.MACHINES_START)[1].split(bench.MACHINES_END)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ")][1:]  # without the header
    assert rows
    for line in rows:
        key = line.split(" | ")[0].removeprefix("| ")
        if "not measured by this project" not in key:  # a reported figure has no section of its own
            assert bench.START.format(key) in doc and bench.END.format(key) in doc, key
