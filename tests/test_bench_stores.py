"""bench/stores.py at its smallest (--quick): every store measured in one run, every figure in its JSON and
its printed table (the figures themselves belong to docs/benchmarks.md, not to a test)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import cli_env

BENCH = Path(__file__).resolve().parent.parent / "bench" / "stores.py"
STORES = ("milvus-lite", "postgresql", "qdrant-local", "milvus-server", "lancedb")
MODES = ("dense", "bm25", "hybrid")


@pytest.mark.slow
def test_the_quick_bench_measures_every_store_and_figure(tmp_path: Path) -> None:
    out = tmp_path / "stores.json"
    proc = subprocess.Popen([sys.executable, str(BENCH), "--quick", "--out", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=cli_env())
    try:
        printed, _ = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        proc.terminate()                     # SIGTERM: the bench stops its servers before it exits
        printed, _ = proc.communicate(timeout=60)
        raise AssertionError("bench/stores.py --quick ran over 300 s:\n" + printed[-3000:]) from None
    assert proc.returncode == 0, printed[-3000:]
    doc = json.loads(out.read_text())
    assert doc["machine"] and doc["date"] and doc["files"] == 10
    assert list(doc["stores"]) == list(STORES)
    rows = {line.split("|")[1].strip(): line for line in printed.splitlines() if line.startswith("| ")}
    for name, r in doc["stores"].items():
        assert r["rows"] > 0 and r["disk_bytes"] > 0 and r["changed_files"] == 1, (name, r)
        assert "***" not in r["uri"] or name == "postgresql"
        assert r["first"]["rows"] == r["rows"] and r["unchanged"]["rows"] == 0, (name, r)
        assert 0 < r["changed"]["rows"] < r["rows"], (name, r)
        for run in ("first", "unchanged", "changed"):
            assert r[run]["wall_s"] > 0 and r[run]["rows_per_s"] > 0 and r[run]["files"] >= 1, (name, run, r)
        assert set(r["search"]) == set(MODES), name
        for mode, s in r["search"].items():
            assert 0 < s["p50_ms"] <= s["p95_ms"], (name, mode, s)
        assert name in rows and rows[name].count("/") == 3, rows     # p50 / p95 of each mode
    assert "***" in doc["stores"]["postgresql"]["uri"]                # the server's password never shown
