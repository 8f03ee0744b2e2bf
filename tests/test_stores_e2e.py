"""Issue 31, items 4 and 5 (issue 39: and LanceDB): everything works on PostgreSQL + pgvector (a real server,
`pg_server`), on Qdrant's local mode and on LanceDB, through the real CLI: `ingest run` of the bundled samples with the packaged model, then
`search`, `status`, `eval` and `IngestRetriever` find the right sample; reruns skip unchanged files and
replace a changed one's rows; --prune; resume after SIGKILL; SIGTERM; the Ray engine; `watch`; and a
password never shown (report, HTML report, status, errors), PGPASSWORD honoured, bad input refused in one
line with nothing changed."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import TESTS, cli_env, ingest, needs_soffice, ray_config, sqlite
from ingest.store.factory import open_store
from ingest.store.manifest import manifest_path

SAMPLES = TESTS.parent / "samples"
OCTOPUS = "mascot-deck.pptx"
FILES = 2500
SLOW = 6                 # of them, .slowtxt files (tests/fault_loaders.py): a second each


def rows_of(uri: str, collection: str = "documents") -> list[tuple[str, str]]:
    """(source, file_hash) of every row, read in a process of its own (a Qdrant local folder is one process's)."""
    code = ("import json, sys; from ingest.store.factory import open_store\n"
            "s = open_store(sys.argv[1], sys.argv[2]); s.caps.shared_reads or s.lock()\n"
            "print(json.dumps([(r['source'], r['file_hash']) for r in s.rows(['source', 'file_hash'])] "
            "if s.exists() else [])); s.close()")
    proc = subprocess.run([sys.executable, "-c", code, uri, collection], capture_output=True, text=True, env=cli_env(),
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return sorted(map(tuple, json.loads(proc.stdout.strip().splitlines()[-1])))


def run(uri: str, folder: Path, cwd: Path, *extra: str, collection: str = "documents", config: str | None = None):
    (cwd / "report.json").unlink(missing_ok=True)
    return ingest("run", str(folder), "--store", uri, "--collection", collection, "--report", str(cwd / "report.json"),
                  "--quiet", *extra, cwd=cwd, config=config)


@pytest.fixture(scope="module", params=["postgresql", "qdrant-local", "lancedb"])
def ingested(request, tmp_path_factory) -> tuple[str, Path]:
    """(uri, work folder) of a store holding the bundled samples, ingested with the defaults."""
    work = tmp_path_factory.mktemp(request.param)
    if request.param == "postgresql":
        uri = request.getfixturevalue("pg_server").database("samples")
    elif request.param == "lancedb":
        uri = f"lancedb://{work / 'lance'}"
    else:
        uri = f"qdrant://{work / 'qdrant'}"
    res = run(uri, SAMPLES, work)
    assert res.rc == 0, res.stderr
    return uri, work


@pytest.mark.slow
@needs_soffice
def test_samples_found_first_status_eval_and_retriever(ingested) -> None:
    uri, work = ingested
    for mode in ("dense", "bm25", "hybrid"):
        res = ingest("search", "purple octopus", "--json", "--mode", mode, "--store", uri, cwd=work)
        assert res.rc == 0, res.stderr
        hits = json.loads(res.stdout)
        assert hits and hits[0]["source"].endswith(OCTOPUS), (mode, [h["source"] for h in hits])
    res = ingest("status", "--json", "--store", uri, cwd=work)
    assert res.rc == 0, res.stderr
    status = json.loads(res.stdout)
    assert status["files"] == len([p for p in SAMPLES.iterdir() if p.name != "README.md"]) + 1 and status["chunks"] > 10
    assert status["in_use_by"] is None and status["last_run"]["exit_code"] == 0
    questions = work / "q.jsonl"
    questions.write_text(json.dumps({"question": "Which animal is our mascot?", "source": OCTOPUS}) + "\n")
    res = ingest("eval", str(questions), "--json", "--store", uri, cwd=work)
    assert res.rc == 0, res.stderr
    assert json.loads(res.stdout)["metrics"]["doc-hit@5"] == 1.0
    code = ("import sys; from ingest import IngestRetriever\n"
            "docs = IngestRetriever(store=sys.argv[1], k=3).invoke('purple octopus mascot')\n"
            "print(docs[0].metadata['source'])")
    proc = subprocess.run([sys.executable, "-c", code, uri], capture_output=True, text=True, env=cli_env(), timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith(OCTOPUS), proc.stderr


@pytest.mark.slow
def test_reruns_replace_changed_rows_and_prune(tmp_path, request) -> None:
    for uri in (request.getfixturevalue("pg_server").database("reruns"), f"qdrant://{tmp_path / 'qdrant'}",
                f"lancedb://{tmp_path / 'lance'}"):
        work = tmp_path / uri.rsplit("/", 1)[1].replace("qdrant", "work").replace("lance", "lwork")
        docs = work / "docs"
        docs.mkdir(parents=True)
        for i in range(6):
            (docs / f"f{i}.txt").write_text(f"file {i} says hello to the octopus number {i}.\n" * 30)
        assert run(uri, docs, work, "--backend", "null").rc == 0
        first = rows_of(uri)
        again = run(uri, docs, work, "--backend", "null")
        assert again.rc == 0 and {f["status"] for f in again.report["files"]} == {"unchanged"}
        (docs / "f1.txt").write_text("a new version of the first file.\n" * 10)
        (docs / "f2.txt").unlink()
        res = run(uri, docs, work, "--backend", "null", "--prune")
        assert res.rc == 0, res.stderr
        assert res.by_path()["f1.txt"]["status"] == "ingested"
        rows = rows_of(uri)
        assert {s for s, _ in rows} == {f"f{i}.txt" for i in (0, 1, 3, 4, 5)}
        assert len({h for s, h in rows if s == "f1.txt"}) == 1 and ("f1.txt", first[0][1]) not in rows
        assert [r for r in rows if r[0] != "f1.txt"] == [r for r in first if r[0] not in ("f1.txt", "f2.txt")]


@pytest.mark.slow
@pytest.mark.parametrize("store", ["postgresql", "lancedb"])
def test_resume_after_sigkill_and_stop_on_sigterm(tmp_path, request, store, monkeypatch) -> None:
    """A run SIGKILLed part-way resumes; a SIGTERMed one stops with 143 and its report, on PostgreSQL and LanceDB."""
    monkeypatch.setenv("INGEST_TEST_SLOW_S", "0")           # the resuming runs load the slow files at full speed
    pg = request.getfixturevalue("pg_server") if store == "postgresql" else None
    uri = pg.database("faults") if pg else f"lancedb://{tmp_path / 'lance'}"
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(FILES - SLOW):       # more than one commit's worth (FLUSH_FILES)
        (docs / f"n{i:04}.txt").write_text(f"note {i}: " + "words of a short note. " * 60)
    for i in range(SLOW):               # last in order, a second each to load: the kill lands mid-run, however
        (docs / f"z{i}.slowtxt").write_text(f"slow note {i}: " + "words of a short note. " * 60)  # fast the rest
    (tmp_path / "config.toml").write_text('[loaders]\nplugins = ["fault_loaders"]\n[loaders.txt]\nworkers = 1\n')
    for collection, signum, code in (("killed", signal.SIGKILL, -9), ("stopped", signal.SIGTERM, 143)):
        proc = subprocess.Popen([sys.executable, "-m", "ingest.cli", "run", "docs", "--store", uri, "--backend", "null",
                                 "--collection", collection, "--report", "report.json", "--quiet"], cwd=tmp_path,
                                env={**cli_env(), "INGEST_TEST_SLOW_S": "1"}, stderr=subprocess.PIPE,
                                start_new_session=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None and not _recorded(pg or uri, collection):
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        os.killpg(proc.pid, signum)
        assert proc.wait(timeout=60) == code
        if signum == signal.SIGTERM:
            assert json.loads((tmp_path / "report.json").read_text())["totals"]["signal"] == "SIGTERM"
        assert _recorded(pg or uri, collection) < FILES
        res = run(uri, docs, tmp_path, "--backend", "null", collection=collection)
        assert res.rc == 0, res.stderr
        rows = rows_of(uri, collection)
        assert len({s for s, _ in rows}) == FILES and len(set(rows)) == FILES        # one version of each file
        assert len(rows) == _recorded(pg or uri, collection, "sum(chunks)")


def _recorded(pg_or_uri, collection: str, what: str = "count(*)") -> int:
    """What the manifest records: PostgreSQL's table, or the SQLite file beside an embedded store."""
    try:
        if isinstance(pg_or_uri, str):
            with sqlite(manifest_path(pg_or_uri, collection)) as con:
                return con.execute(f"SELECT {what} FROM files").fetchone()[0] or 0
        return pg_or_uri.sql(f'SELECT {what} FROM "{collection}__files"', "faults")[0][0]
    except Exception:           # the run has not made the manifest yet
        return 0


@pytest.mark.slow
@pytest.mark.parametrize("store", ["postgresql", "lancedb"])
def test_ray_engine_and_watch(tmp_path, request, store) -> None:
    ray_address = request.getfixturevalue("ray_address") if store == "postgresql" else ""
    uri = request.getfixturevalue("pg_server").database("rayw") if store == "postgresql" else \
        f"lancedb://{tmp_path / 'lance'}"
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(5):
        (docs / f"r{i}.txt").write_text(f"ray file {i}. " * 50)
    # a Ray cluster's other machines cannot write a LanceDB folder: the local engine ingests it
    res = run(uri, docs, tmp_path, "--backend", "null", config=ray_config(ray_address) if store == "postgresql" else "")
    assert res.rc == 0, res.stderr
    assert {s for s, _ in rows_of(uri)} == {f"r{i}.txt" for i in range(5)}
    proc = subprocess.Popen([sys.executable, "-m", "ingest.cli", "watch", "docs", "--store", uri, "--backend", "null",
                             "--debounce", "0.3", "--report", "watch.json", "--quiet"], cwd=tmp_path, env=cli_env(),
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        time.sleep(3)
        (docs / "new.txt").write_text("a file written while watch runs. " * 20)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and "new.txt" not in {s for s, _ in rows_of(uri)}:
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            time.sleep(0.5)
        assert "new.txt" in {s for s, _ in rows_of(uri)}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=60) == 143


def test_a_password_is_never_shown(tmp_path, request) -> None:
    pg = request.getfixturevalue("pg_server")
    uri = pg.database("secrets")
    password = pg.password
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("the secret of the octopus. " * 20)
    res = ingest("run", "docs", "--store", uri, "--backend", "null", "--report", "report.json", cwd=tmp_path)
    assert res.rc == 0, res.stderr
    html = (tmp_path / "report.html").read_text() if (tmp_path / "report.html").exists() else ""
    status = ingest("status", "--store", uri, cwd=tmp_path)
    assert status.rc == 0 and "***" in status.stdout
    wrong = uri.replace(password, "not-the-password")
    bad = ingest("run", "docs", "--store", wrong, "--backend", "null", "--report", "bad.json", cwd=tmp_path)
    assert bad.rc == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    texts = [res.stdout, res.stderr, (tmp_path / "report.json").read_text(), html, status.stdout, status.stderr,
             bad.stderr, (tmp_path / "bad.json").read_text()]
    assert all(password not in t and "not-the-password" not in t for t in texts)
    # the libpq variables work: no password in the URI, PGPASSWORD set
    env = dict(cli_env(), PGPASSWORD=password)
    bare = uri.replace(f":{password}@", "@")
    proc = subprocess.run([sys.executable, "-m", "ingest.cli", "status", "--json", "--store", bare], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and json.loads(proc.stdout)["files"] == 1, proc.stderr


def test_bad_input_is_one_line_and_changes_nothing(tmp_path, request) -> None:
    pg = request.getfixturevalue("pg_server")
    uri = pg.database("foreign")
    pg.sql('CREATE TABLE "documents" (id int PRIMARY KEY, note text); INSERT INTO "documents" VALUES (1, \'theirs\')',
           "foreign")
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("text " * 50)
    for extra in ((), ("--reembed",)):
        res = run(uri, docs, tmp_path, "--backend", "null", *extra)
        assert res.rc == 2 and len(res.stderr.strip().splitlines()) == 1 and "not made by ingest" in res.stderr
    assert pg.sql('SELECT note FROM "documents"', "foreign") == [("theirs",)]
    missing = uri.rsplit("/", 1)[0] + "/no_such_db"
    res = run(missing, docs, tmp_path, "--backend", "null")
    assert res.rc == 2 and len(res.stderr.strip().splitlines()) == 1 and pg.password not in res.stderr
    res = run(f"qdrant://{tmp_path / 'q'}", docs, tmp_path, "--backend", "null",
              config='[run]\nengine = "ray"\n')
    assert res.rc == 2 and "Qdrant's local mode" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "q").exists() or not any((tmp_path / "q").iterdir())
    shutil.rmtree(tmp_path / "q", ignore_errors=True)
    assert open_store(f"qdrant://{tmp_path / 'q'}", "documents").caps.embedded
