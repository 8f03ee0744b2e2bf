"""bench/gpu.py's rehearsal on the CPU: every measurement runs in its own subprocess and lands in one JSON
with the keys a GPU run will have; a measurement that outlives its limit is recorded with its stacks."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import cli_env

BENCH = Path(__file__).resolve().parent.parent / "bench" / "gpu.py"
MEASUREMENTS = ("forward_only", "worker_start_s", "pool_pretokenized", "pool_raw_texts", "ingest_run",
                "bare_encode", "st_pool")


def bench(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "gpu.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--device", "cpu", "--out", str(out), *args],
                          capture_output=True, text=True, timeout=1500, env=cli_env())
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(out.read_text())


def test_the_rehearsal_writes_every_measurement_and_the_machine(tmp_path: Path) -> None:
    doc = bench(tmp_path, "--n", "48", "--budget-s", "1200",
                *[f"--limit={name}=300" for name in MEASUREMENTS])
    meta = doc["meta"]
    for key in ("device", "device_name", "torch", "cuda", "driver", "cpu_cores", "date", "commit", "n", "dtype"):
        assert key in meta, key
    assert meta["cpu_cores"] >= 1 and meta["torch"]
    got = doc["measurements"]
    assert list(got) == list(MEASUREMENTS)
    for name, entry in got.items():
        assert entry["status"] == "ok", (name, entry)
        assert entry["seconds"] > 0
    for name in ("forward_only", "pool_pretokenized", "pool_raw_texts", "bare_encode", "st_pool", "ingest_run"):
        assert got[name]["chunks_per_s"] > 0, name
    assert got["pool_pretokenized"]["chunks"] == got["pool_raw_texts"]["chunks"] == 48
    assert got["worker_start_s"]["first_vector_s"] > 0
    assert set(got["st_pool"]) >= {"processes_1", "processes_2"}
    run = got["ingest_run"]
    assert run["chunks"] > 0 and run["first_row_s"] > 0 and run["busy_share"] is not None
    assert set(run["timeline"]["stages"]) >= {"load", "encode", "write"}
    if run["steady_chunks_per_s"] is not None:          # None: every chunk was recorded in one commit
        assert doc["summary"]["ingest_run_steady_over_pool_pretokenized"] > 0


def test_a_measurement_past_its_limit_is_recorded_with_the_stacks_of_its_processes(tmp_path: Path) -> None:
    doc = bench(tmp_path, "--n", "8", "--only", "worker_start_s", "--limit", "worker_start_s=4")
    entry = doc["measurements"]["worker_start_s"]
    assert entry["status"] == "timeout" and entry["limit_s"] == 4
    stacks = entry["stacks"]
    assert stacks and stacks[0]["pid"] > 0
    text = "".join(s.get("faulthandler", "") + s.get("py_spy", "") for s in stacks)
    assert "most recent call first" in text or "Thread" in text           # faulthandler's, or py-spy's
