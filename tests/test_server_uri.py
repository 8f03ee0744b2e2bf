"""An http:// store URI reaches a real Milvus gRPC server (milvus-lite server on loopback): the
manifest and the lease live in that server, so every directory sees the same state and one
run at a time owns a collection. One server for the session; each test has its own collection."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import cli_env, ingest, run_on, server_rows

SLOW = '[loaders]\nplugins = ["fault_loaders"]\n[loaders.txt]\ntimeout_s = 600\n'


@pytest.mark.slow
def test_manifest_lives_in_the_server_so_another_directory_sees_it(milvus_uri: str, tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    texts = {"salmon.txt": "Salmon swim upstream to spawn in cold mountain rivers.",
             "bread.txt": "Sourdough bread rises slowly because of wild yeast and bacteria.",
             "owls.txt": "Owls hunt at night and hear the smallest mouse under the snow."}
    for d in (a, b):
        (d / "docs").mkdir(parents=True)
    for name, text in texts.items():
        (a / "docs" / name).write_text(text)
    first = run_on(milvus_uri, "shared", a)
    assert first.rc == 0, first.stderr
    assert {f["status"] for f in first.report["files"]} == {"ingested"}
    hits = ingest("search", "salmon rivers", "--json", "--store", milvus_uri, "--collection", "shared", cwd=a)
    assert hits.rc == 0, hits.stderr
    assert json.loads(hits.stdout)[0]["source"] == "salmon.txt"

    (b / "docs" / "salmon.txt").write_text("Salmon return to the river where they hatched, guided by smell.")
    (b / "docs" / "bread.txt").write_text(texts["bread.txt"])           # same content, another mtime
    second = run_on(milvus_uri, "shared", b, "--prune")                  # owls.txt is gone here
    assert second.rc == 0, second.stderr
    files = second.by_path()
    assert files["salmon.txt"]["status"] == "ingested" and files["bread.txt"]["status"] == "unchanged"
    assert second.report["totals"]["pruned"] == 1
    hashes: dict[str, set[str]] = {}
    rows = server_rows(milvus_uri, "shared")
    for r in rows:
        hashes.setdefault(r["source"], set()).add(r["file_hash"])
    assert set(hashes) == {"salmon.txt", "bread.txt"}
    assert len(hashes["salmon.txt"]) == 1                                # stale rows replaced, not kept
    assert len(rows) == sum(f["chunks"] for f in second.report["files"])


def _wait_for_lease(uri: str, collection: str, pid: int, proc: subprocess.Popen) -> None:
    from ingest.store.server_manifest import companion_name, read_lease
    from ingest.store import Store

    store = Store(uri, collection)
    deadline = time.monotonic() + 180
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if store.client.has_collection(companion_name(collection)):
                holder = read_lease(store)
                if holder is not None and holder.pid == pid:
                    return
            time.sleep(0.5)
    finally:
        store.close()
    raise AssertionError(f"the first run (exit {proc.poll()}) never took the lease")


@pytest.mark.slow
def test_second_run_fails_at_once_and_a_killed_runs_lease_is_taken_over(milvus_uri: str, work: Path) -> None:
    from ingest.store.server_manifest import read_lease
    from ingest.store import Store

    (work / "docs" / "a.txt").write_text("Lighthouses once turned their lenses with clockwork.")
    (work / "docs" / "wait.sleep").write_text("sleeps for an hour in its loader")
    (work / "config.toml").write_text(SLOW)
    first = subprocess.Popen([sys.executable, "-m", "ingest.cli", "run", "docs", "--store", milvus_uri,
                              "--collection", "busy", "--report", "first.json", "--quiet"], cwd=work, env=cli_env(),
                             start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for_lease(milvus_uri, "busy", first.pid, first)
        second = run_on(milvus_uri, "busy", work)
        assert first.poll() is None                                      # refused while the first still runs
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    assert second.rc == 2 and second.stderr.strip().count("\n") == 0, second.stderr
    assert f"on {socket.gethostname()} (pid {first.pid})" in second.stderr and "in use" in second.stderr

    (work / "docs" / "wait.sleep").unlink()
    third = run_on(milvus_uri, "busy", work)                             # same host, dead pid: taken over
    assert third.rc == 0, third.stderr
    assert third.by_path()["a.txt"]["status"] in ("ingested", "unchanged")
    store = Store(milvus_uri, "busy")
    assert read_lease(store) is None                                     # released on close
    store.close()


def test_reembed_refuses_a_collection_ingest_did_not_make(milvus_uri: str, work: Path) -> None:
    from pymilvus import MilvusClient

    client = MilvusClient(milvus_uri)
    client.create_collection("foreign_notes", dimension=2)
    client.insert("foreign_notes", [{"id": i, "vector": [float(i), 1.0]} for i in range(3)])
    client.flush("foreign_notes")
    (work / "docs" / "a.txt").write_text("Coral reefs shelter a quarter of all marine species.")
    res = run_on(milvus_uri, "foreign_notes", work, "--reembed")
    assert res.rc == 2 and res.stderr.strip().count("\n") == 0, res.stderr
    assert "not made by ingest" in res.stderr and "--reembed will not drop it" in res.stderr
    assert client.has_collection("foreign_notes") and not client.has_collection("foreign_notes__files")
    assert len(client.query("foreign_notes", filter="id >= 0", output_fields=["id"])) == 3
    client.close()
