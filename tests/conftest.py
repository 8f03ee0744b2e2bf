"""Shared helpers: run the real `ingest` CLI in a subprocess and read what it wrote."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@dataclass
class Result:
    rc: int
    stdout: str
    stderr: str
    report: dict | None

    def by_path(self) -> dict[str, dict]:
        return {f["path"]: f for f in self.report["files"]}


def cli_env() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(TESTS))
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def ingest(*args: str, cwd: Path, timeout: float = 600, config: str | None = None) -> Result:
    """Run `ingest ARGS` (with an optional config.toml text) and load the report if it wrote one."""
    argv = [sys.executable, "-m", "ingest.cli", *args]
    if config is not None:
        (cwd / "config.toml").write_text(config)
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=cli_env())
    report_path = cwd / "report.json"
    report = json.loads(report_path.read_text()) if report_path.exists() and "run" in args else None
    return Result(proc.returncode, proc.stdout, proc.stderr, report)


def run(folder: Path, cwd: Path, *extra: str, config: str | None = None, timeout: float = 600) -> Result:
    (cwd / "report.json").unlink(missing_ok=True)
    return ingest("run", str(folder), "--store", str(cwd / "store.db"), "--report", str(cwd / "report.json"),
                  "--quiet", *extra, cwd=cwd, config=config, timeout=timeout)


def search(cwd: Path, query: str, k: int = 5) -> list[dict]:
    res = ingest("search", query, "-k", str(k), "--json", "--store", str(cwd / "store.db"), cwd=cwd)
    assert res.rc == 0, res.stderr
    return json.loads(res.stdout)


_DUMP = """
import json, sys
from ingest.store import Store
store = Store(sys.argv[1], "documents")
print(json.dumps(store.rows(["id", "source", "file_hash"]) if store.exists() else []))
"""


def store_rows(cwd: Path) -> list[dict]:
    """Every row's id, source and file_hash, read by a separate process (Milvus Lite locks its file)."""
    proc = subprocess.run([sys.executable, "-c", _DUMP, str(cwd / "store.db")], capture_output=True, text=True,
                          env=cli_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def row_ids(cwd: Path) -> list[str]:
    return [r["id"] for r in store_rows(cwd)]


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "docs").mkdir()
    return tmp_path
