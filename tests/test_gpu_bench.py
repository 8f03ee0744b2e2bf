"""bench/gpu.py's rehearsal on the CPU: every measurement runs in its own subprocess and lands in one JSON
with the keys a GPU run will have; a measurement that outlives its limit is recorded with its stacks."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cli_env

BENCH = Path(__file__).resolve().parent.parent / "bench" / "gpu.py"
ROOT = BENCH.parent.parent
MEASUREMENTS = ("forward_only", "worker_start_s", "pool_pretokenized", "pool_real_lengths", "pool_raw_texts",
                "ingest_run", "bare_encode", "st_pool")


def bench(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "gpu.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--device", "cpu", "--out", str(out), *args],
                          capture_output=True, text=True, timeout=1500, env=cli_env())
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.timeout(1600)          # eight measurements, each a fresh interpreter with torch: ~2 min on an idle box
def test_the_rehearsal_writes_every_measurement_and_the_machine(tmp_path: Path) -> None:
    # issue 48: the peers (bare_encode, st_pool) on 8 chunks, ingest_run on the null backend (the host's
    # pipeline, the model's own load is worker_start_s's): every figure is still written, in half the time
    doc = bench(tmp_path, "--n", "48", "--peer-n", "8", "--run-backend", "null", "--budget-s", "1500",
                "--stores", "milvus-lite:48,null:96", *[f"--limit={name}=300" for name in MEASUREMENTS])
    meta = doc["meta"]
    for key in ("device", "device_name", "torch", "cuda", "driver", "cpu_cores", "date", "commit", "n", "dtype"):
        assert key in meta, key
    assert meta["cpu_cores"] >= 1 and meta["torch"]
    got = doc["measurements"]
    assert list(got) == list(MEASUREMENTS)
    for name, entry in got.items():
        assert entry["status"] == "ok", (name, entry)
        assert entry["seconds"] > 0
    for name in ("forward_only", "pool_pretokenized", "pool_real_lengths", "pool_raw_texts", "bare_encode", "st_pool"):
        assert got[name]["chunks_per_s"] > 0, name
    assert got["pool_pretokenized"]["chunks"] == got["pool_real_lengths"]["chunks"] == got["pool_raw_texts"]["chunks"] == 48
    forward = got["forward_only"]
    assert forward["cold_chunks_per_s"] > 0 and forward["shapes"] > 1
    assert set(forward["by_batch_size"]["64"]) == {"cold", "warm", "shapes"}
    real = got["pool_real_lengths"]["lengths"]
    assert real["p10"] < real["p50"] < real["p90"] <= 256            # drawn from bench/real_chunk_lengths.json
    assert got["worker_start_s"]["first_vector_s"] > 0
    assert set(got["st_pool"]) >= {"processes_1", "processes_2"}
    assert got["bare_encode"]["chunks"] == got["st_pool"]["chunks"] == 8 and got["ingest_run"]["backend"] == "null"
    stores = got["ingest_run"]["stores"]
    assert list(stores) == ["milvus-lite", "null"]
    for name, chunks in (("milvus-lite", 48), ("null", 96)):
        run = stores[name]
        assert run["status"] == "ok" and run["chunks"] == chunks and run["first_row_s"] > 0, run
        assert run["chunks_per_s"] > 0 and run["steady_chunks_per_s"] > 0 and run["gpu_busy_share"] is None
        assert run["cpu_us_per_chunk"]["supervisor"] > 0 and run["tree_cpu_us_per_chunk"] > 0
        assert set(run["timeline"]["stages"]) >= {"load", "encode", "write"}
        assert doc["summary"][f"ingest_run_{name}_steady_over_pool_pretokenized"] > 0
    assert stores["milvus-lite"]["uri"].endswith("store.db") and stores["null"]["uri"] == "null://"


@pytest.mark.slow
@pytest.mark.timeout(960)
def test_the_one_gpu_command_rehearsed_on_the_cpu(tmp_path: Path) -> None:
    """scripts/gpu_run.sh without its install, on the CPU: issue 38's set, the null backend, tiny sizes."""
    env = dict(cli_env(), OUT=str(tmp_path), INSTALL="0", DEVICE="cpu", N="16", STORES="milvus-lite:16,null:32",
               MODEL="", TOTAL_S="900", PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    proc = subprocess.run(["bash", "scripts/gpu_run.sh", "--only", "pool_real_lengths,ingest_run", "--run-backend",
                           "null"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads((tmp_path / "gpu.json").read_text())
    assert doc["meta"]["argv"][doc["meta"]["argv"].index("--set") + 1] == "issue38"
    got = doc["measurements"]
    assert list(got) == ["pool_real_lengths", "ingest_run"] and got["pool_real_lengths"]["status"] == "ok"
    assert got["ingest_run"]["backend"] == "null"
    assert {k: v["chunks"] for k, v in got["ingest_run"]["stores"].items()} == {"milvus-lite": 16, "null": 32}


@pytest.mark.slow
def test_a_measurement_past_its_limit_is_recorded_with_the_stacks_of_its_processes(tmp_path: Path) -> None:
    # forward_only: cold and warm passes at several batch sizes, minutes on a CPU (a worker now starts in seconds)
    doc = bench(tmp_path, "--n", "8", "--only", "forward_only", "--limit", "forward_only=4")
    entry = doc["measurements"]["forward_only"]
    assert entry["status"] == "timeout" and entry["limit_s"] == 4
    stacks = entry["stacks"]
    assert stacks and stacks[0]["pid"] > 0
    text = "".join(s.get("faulthandler", "") + s.get("py_spy", "") for s in stacks)
    assert "most recent call first" in text or "Thread" in text           # faulthandler's, or py-spy's
