"""Issue 22 item 2: a big file is loaded by range (ingest/load.py NOTE on ranges): its rows are stored
while later ranges still load, in order, with the structure of a whole read; the supervisor's memory
does not follow the file's size; a failing range fails the file and keeps its last good version."""
from __future__ import annotations

import json
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import psutil

from conftest import cli_env, run, store_rows

NULL = '[model]\nbackend = "null"\n'
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda omicron".split()
STORED = """
import json, sys
from ingest.store import Store
store = Store(sys.argv[1], sys.argv[2])
print(json.dumps(store.rows(["source", "page", "chunk", "text", "headings", "file_hash"]) if store.exists() else []))
"""


def _rows(uri: str, collection: str = "documents") -> list[dict]:
    """Every row of the collection in chunk order, read by another process."""
    proc = subprocess.run([sys.executable, "-c", STORED, uri, collection], capture_output=True, text=True,
                          env=cli_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    return sorted(json.loads(proc.stdout.strip().splitlines()[-1]), key=lambda r: (r["source"], r["chunk"]))


def _markdown(sections: int, paragraphs: int) -> str:
    """# Manual, then `## Section s` headings over numbered paragraphs, one fenced block per section."""
    rng = random.Random(5)
    out = ["# Manual"]
    for s in range(sections):
        out.append(f"## Section {s}")
        for p in range(paragraphs):
            out.append(f"para{s:03d}x{p:03d} " + " ".join(rng.choice(WORDS) for _ in range(60)))
        out.append("```\n# not a heading " + "\n".join(f"code line {i}" for i in range(40)) + "\n```")
    return "\n\n".join(out) + "\n"


def _start(work: Path, *extra: str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ingest.cli", "run", "docs", "--report", "report.json", "--quiet",
                             *extra], cwd=work, env={**cli_env(), **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_a_big_markdown_file_is_stored_while_it_loads_in_order_under_its_headings(work: Path, milvus_uri: str) -> None:
    from ingest.store import Store

    (work / "docs" / "manual.md").write_text(_markdown(80, 50), encoding="utf-8")      # ~1.7 MB, ~50 ranges
    (work / "config.toml").write_text(NULL + "[store]\nbatch_size = 32\n[run]\nmax_chunks_in_flight = 64\n")
    collection = "big_md"
    proc = _start(work, "--store", milvus_uri, "--collection", collection, env={"INGEST_RANGE_BYTES": "32768"})
    store = Store(milvus_uri, collection)
    seen: list[int] = []                        # rows stored, polled while the run goes on
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        rows = len(store.rows(["chunk"])) if store.exists() else 0
        if rows and proc.poll() is None:
            seen.append(rows)
        time.sleep(0.2)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    report = json.loads((work / "report.json").read_text())
    (file,) = report["files"]
    assert file["status"] == "ingested", file
    rows = _rows(milvus_uri, collection)
    assert len(rows) == file["chunks"]
    # Rows were stored while later ranges were not loaded yet: chunks loaded and not yet with the writer
    # stay under max_chunks_in_flight (64) plus the ranges loading (one worker: ~40 chunks), and the
    # writer holds at most 5 batches of 32 unstored, so with n rows stored, fewer than n + 300 are loaded.
    assert any(0 < n < file["chunks"] - 300 for n in seen), (seen, file["chunks"])
    assert [r["chunk"] for r in rows] == list(range(len(rows)))
    paras = [(int(s), int(p)) for r in rows for s, p in
             (m.split("x") for m in re.findall(r"para(\d{3}x\d{3})", r["text"]))]
    assert paras == sorted(paras) and set(paras) == {(s, p) for s in range(80) for p in range(50)}
    for r in rows:                               # the heading path survives every cut (fences too)
        numbers = {int(s) for s in re.findall(r"para(\d{3})x", r["text"])}
        code = "code line" in r["text"]
        if numbers and not code:
            assert r["headings"] in {f"Manual > Section {s}" for s in numbers}, (r["headings"], r["text"][:80])
        elif code:
            assert r["headings"].startswith("Manual > Section "), r["headings"]
        assert "not a heading" not in r["headings"]


def _pdf(path: Path, pages: int) -> None:
    """A PDF with an outline (a chapter every 25 pages), a running header and page numbers."""
    import pymupdf

    rng = random.Random(9)
    doc = pymupdf.open()
    toc = []
    for n in range(pages):
        page = doc.new_page(width=595, height=842)
        page.insert_text((40, 30), "ACME Field Manual  confidential", fontsize=9)
        y = 80
        if n % 25 == 0:
            page.insert_text((40, y), f"Chapter {n // 25}", fontsize=18)
            toc.append([1, f"Chapter {n // 25}", n + 1])
            y += 40
        for line in range(30):
            page.insert_text((40, y), f"p{n:03d}l{line:02d} " + " ".join(rng.choice(WORDS) for _ in range(9)),
                             fontsize=10)
            y += 20
        page.insert_text((290, 820), str(n + 1), fontsize=9)
    doc.set_toc(toc)
    doc.save(path)


@pytest.mark.slow
def test_a_big_pdf_by_page_range_stores_what_a_whole_read_stores(work: Path) -> None:
    _pdf(work / "docs" / "manual.pdf", 100)
    (work / "config.toml").write_text(NULL)
    env = {**cli_env(), "INGEST_RANGE_PAGES": "20"}
    ranged = subprocess.run([sys.executable, "-m", "ingest.cli", "run", "docs", "--store", "ranged.db", "--quiet",
                             "--report", "r1.json"], cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert ranged.returncode == 0, ranged.stderr
    env["INGEST_RANGE_PAGES"] = "100000"
    whole = subprocess.run([sys.executable, "-m", "ingest.cli", "run", "docs", "--store", "whole.db", "--quiet",
                            "--report", "r2.json"], cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert whole.returncode == 0, whole.stderr
    got, want = (_rows(str(work / db)) for db in ("ranged.db", "whole.db"))
    assert len(got) > 100 and [r["chunk"] for r in got] == list(range(len(got)))
    strip = [{k: r[k] for k in ("page", "chunk", "text", "headings")} for r in got]
    assert strip == [{k: r[k] for k in ("page", "chunk", "text", "headings")} for r in want]
    assert [r["page"] for r in got] == sorted(r["page"] for r in got)
    assert not any("confidential" in r["text"] for r in got)                 # the running header went
    assert {r["headings"] for r in got if r["page"] in (49, 50, 51)} == {"Chapter 1", "Chapter 2"}


@pytest.mark.slow
def test_a_failing_range_fails_the_file_and_keeps_the_last_good_version(work: Path, monkeypatch) -> None:
    rng = random.Random(2)
    path = work / "docs" / "log.txt"
    lines = [f"line{i:05d} " + " ".join(rng.choice(WORDS) for _ in range(12)) for i in range(8000)]
    path.write_text("\n".join(lines), encoding="utf-8")                      # ~0.8 MB: ~12 ranges
    config = NULL + "[limits]\nmax_text_mb = 1\n"
    monkeypatch.setenv("INGEST_RANGE_BYTES", "65536")
    first = run(work / "docs", work, config=config)
    assert first.rc == 0, first.stderr
    good = store_rows(work)
    assert len(good) == first.by_path()["log.txt"]["chunks"] and len({r["file_hash"] for r in good}) == 1
    # the new version: a region without a line break (1.2 MB) past the first ranges fails its range
    path.write_text("\n".join(lines[:4000] + ["x" * (1200 * 1024)] + lines[4000:]), encoding="utf-8")
    second = run(work / "docs", work, config=config)
    assert second.rc == 1
    file = second.by_path()["log.txt"]
    assert file["status"] == "failed" and "no line break" in file["error"] and "loading bytes" in file["error"], file
    assert sorted(r["id"] for r in store_rows(work)) == sorted(r["id"] for r in good)   # the old version, whole


@pytest.mark.slow
def test_the_supervisor_does_not_hold_a_big_file(work: Path) -> None:
    rng = random.Random(4)
    block = "\n\n".join(" ".join(rng.choice(WORDS) for _ in range(80)) for _ in range(2000)).encode() + b"\n\n"
    with open(work / "docs" / "huge.txt", "wb") as f:                       # ~200 MB
        for _ in range(200 * 1024 * 1024 // len(block)):
            f.write(block)
    (work / "config.toml").write_text(NULL)
    proc = _start(work, "--store", "store.db", env={})
    supervisor = psutil.Process(proc.pid)
    peak, started = 0, time.monotonic()
    while proc.poll() is None and time.monotonic() - started < 30:       # hash, plan, then ~20 ranges
        try:
            peak = max(peak, supervisor.memory_info().rss)
        except psutil.Error:
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    assert proc.returncode == 143
    file = json.loads((work / "report.json").read_text())["files"][0]
    assert file["status"] == "failed" and "interrupted" in file["error"], file
    assert store_rows(work) == []                   # the abandoned new version left no rows
    assert peak < 300 * 1024 * 1024, f"supervisor peak RSS {peak / 2**20:.0f} MB"
