"""Issue 40, item 5: a store whose client package is not installed is one line naming what to install, exit 2,
on every command (`run`, `search`, `status`, `eval`, `watch`), and nothing is created (but the report of a run
that could not start). The packages stay installed: a `sitecustomize` on PYTHONPATH puts a finder first on
sys.meta_path that refuses the modules named in INGEST_TEST_BLOCK, as if they were absent."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import cli_env

SHIM = '''import os, sys


class _Blocked:
    """Refuse the top-level modules INGEST_TEST_BLOCK names (comma-separated): not installed, as far as
    this process can tell."""
    names = set(filter(None, os.environ.get("INGEST_TEST_BLOCK", "").split(",")))

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in self.names:
            raise ImportError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _Blocked())
'''
SECRET = "s3cret"
# store: (the module blocked, its URI ({work}: the test's folder), what the line says to install)
STORES = {
    "postgresql": ("psycopg", f"postgresql://ingest:{SECRET}@127.0.0.1:9/ingest", "pip install 'ingest[postgres]'"),
    "qdrant": ("qdrant_client", "qdrant://127.0.0.1:9", "pip install 'ingest[qdrant]'"),
    "qdrant-local": ("qdrant_client", "qdrant://{work}/qdrant", "pip install 'ingest[qdrant]'"),
    "lancedb": ("lancedb", "lancedb://{work}/lance", "pip install 'ingest[lancedb]'"),
    "milvus": ("pymilvus", "http://127.0.0.1:19530", "pip install 'pymilvus>=2.5'"),
}
COMMANDS = {
    "run": ("run", "docs", "--backend", "null", "--quiet", "--report", "report.json"),
    "search": ("search", "penguins"),
    "status": ("status",),
    "eval": ("eval", "questions.jsonl"),
    "watch": ("watch", "docs", "--backend", "null", "--quiet"),
}


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("shim")
    (folder / "sitecustomize.py").write_text(SHIM)
    return folder


def ingest_without(shim: Path, blocked: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`python -m ingest.cli ARGS` in `cwd`, the modules `blocked` names not importable."""
    env = cli_env()
    env.update(PYTHONPATH=f"{shim}:{env['PYTHONPATH']}", INGEST_TEST_BLOCK=blocked)
    return subprocess.run([sys.executable, "-m", "ingest.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def _work(work: Path) -> set[str]:
    (work / "docs" / "a.txt").write_text("Penguins huddle together through the long polar night.\n")
    (work / "questions.jsonl").write_text(json.dumps({"question": "penguins?", "source": "a.txt"}) + "\n")
    return {str(p.relative_to(work)) for p in work.rglob("*")}


def _one_line(proc: subprocess.CompletedProcess, uri: str, install: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"ingest: error: store {uri.replace(SECRET, '***')} needs the package "), proc.stderr
    assert proc.stderr.rstrip().endswith(install) and SECRET not in proc.stderr, proc.stderr


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("store", sorted(STORES))
def test_a_store_without_its_client_is_one_line_naming_the_extra(shim: Path, work: Path, store: str,
                                                                 command: str) -> None:
    blocked, uri, install = STORES[store]
    uri = uri.format(work=work)
    before = _work(work)
    proc = ingest_without(shim, blocked, *COMMANDS[command], "--store", uri, cwd=work)
    _one_line(proc, uri, install)
    made = {str(p.relative_to(work)) for p in work.rglob("*")} - before
    if command == "run":          # a run that could not start reports why, beside nothing else
        assert made == {"report.json", "report.html"}, made
        totals = json.loads((work / "report.json").read_text())["totals"]
        assert totals["exit_code"] == 2 and totals["stopped_by"] == proc.stderr.split("error: ", 1)[1].strip()
        assert SECRET not in (work / "report.json").read_text()
    else:
        assert not made, made


def test_a_local_qdrant_store_that_exists_is_one_line_too_and_left_as_it_was(shim: Path, work: Path) -> None:
    """Made with the client, read without it: the line, not a traceback, and the store's files untouched."""
    _work(work)
    uri = f"qdrant://{work}/qdrant"
    made = ingest_without(shim, "", "run", "docs", "--store", uri, "--backend", "null", "--quiet", cwd=work)
    assert made.returncode == 0, made.stderr
    files = {p: p.stat().st_mtime_ns for p in work.rglob("*") if p.is_file() and "report" not in p.name}
    for command in ("search", "status", "eval", "run", "watch"):
        _one_line(ingest_without(shim, "qdrant_client", *COMMANDS[command], "--store", uri, cwd=work), uri,
                  "pip install 'ingest[qdrant]'")
    assert {p: p.stat().st_mtime_ns for p in work.rglob("*") if p.is_file() and "report" not in p.name} == files


def test_milvus_lite_names_both_of_its_packages(shim: Path, work: Path) -> None:
    """Milvus Lite needs pymilvus and milvus-lite, dependencies of ingest itself (pyproject.toml): no extra."""
    before = _work(work)
    for blocked in ("pymilvus", "milvus_lite"):
        proc = ingest_without(shim, blocked, "status", "--store", "store.db", cwd=work)
        _one_line(proc, "store.db", "pip install 'pymilvus>=2.5' milvus-lite")
        assert blocked.replace("_", "-") in proc.stderr.split("needs the package ")[1].split(",")[0]
    assert {str(p.relative_to(work)) for p in work.rglob("*")} == before
