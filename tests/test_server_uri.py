"""An http:// store URI reaches a real Milvus gRPC server (milvus-lite server on loopback)."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

from conftest import cli_env, ingest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_http_uri_run_and_search(work: Path) -> None:
    port = _free_port()
    server = subprocess.Popen([str(Path(sys.executable).parent / "milvus-lite"), "server", "--data-dir",
                               str(work / "server-data"), "--host", "127.0.0.1", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=cli_env())
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.3)
        uri = f"http://127.0.0.1:{port}"
        (work / "docs" / "a.txt").write_text("Salmon swim upstream to spawn in cold mountain rivers.")
        res = ingest("run", "docs", "--store", uri, "--report", "report.json", "--quiet", cwd=work)
        assert res.rc == 0, res.stderr
        assert json.loads((work / "report.json").read_text())["files"][0]["status"] == "ingested"
        hits = ingest("search", "salmon rivers", "--json", "--store", uri, cwd=work)
        assert hits.rc == 0, hits.stderr
        assert json.loads(hits.stdout)[0]["source"] == "a.txt"
        again = ingest("run", "docs", "--store", uri, "--report", "report.json", "--quiet", cwd=work)
        assert json.loads((work / "report.json").read_text())["files"][0]["status"] == "unchanged", again.stderr
    finally:
        server.terminate()
        server.wait(timeout=10)
