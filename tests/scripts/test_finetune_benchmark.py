"""scripts/finetune_benchmark.py scores STS-B as the peer's script does, so that parity compares like with like."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from transformer_cli.metrics.task_metrics import spearman

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fb():
    sys.path.insert(0, str(ROOT / "scripts"))  # the script imports its sibling benchmark.py by name
    try:
        spec = importlib.util.spec_from_file_location("finetune_benchmark", ROOT / "scripts" / "finetune_benchmark.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(ROOT / "scripts"))


def test_peer_spearman_breaks_ties_by_file_order_where_glue_averages_them(fb):
    pred, gold = [1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 2.0, 2.0]
    # ordinal gold ranks 0 1 2 3 follow the predictions exactly; average ranks 0.5 0.5 2.5 2.5 do not
    assert fb.peer_spearman(pred, gold) == pytest.approx(1.0)
    assert spearman(pred, gold) == pytest.approx(2 / np.sqrt(5))
    # each tie's predictions the other way round: GLUE's Spearman is unchanged, the ordinal one drops
    swapped = [2.0, 1.0, 4.0, 3.0]
    assert spearman(swapped, gold) == pytest.approx(2 / np.sqrt(5))
    assert fb.peer_spearman(swapped, gold) == pytest.approx(0.6)


def test_peer_spearman_is_spearman_without_ties(fb):
    rng = np.random.default_rng(0)
    pred, gold = rng.normal(size=50).tolist(), rng.normal(size=50).tolist()
    assert fb.peer_spearman(pred, gold) == pytest.approx(spearman(pred, gold), abs=1e-12)
