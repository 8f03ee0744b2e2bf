"""The null store (`null://`, ingest/store/null.py) and the run that says when its store held it back
(`ingest.timeline.store_bound`): real documents, the real CLI, Milvus Lite and the null store."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from conftest import ingest
from docs import make_docx, make_pdf

from ingest.timeline import store_bound

WORDS = ("river mountain engine harbour lantern orchard copper glacier violin meadow falcon circuit canyon archive "
         "thunder pepper compass marble ribbon saddle quartz tunnel beacon walnut").split()


def text_files(folder: Path, files: int, paragraphs: int = 16) -> None:
    """`files` text files of `paragraphs` paragraphs of ~150 words: one ~190-token chunk a paragraph."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    for i in range(files):
        paras = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(140, 160))) + "." for _ in range(paragraphs)]
        (folder / f"doc{i:04d}.txt").write_text("\n\n".join(paras))


def run_into(store: str, cwd: Path, *extra: str) -> tuple[int, list[str], dict]:
    """`ingest run docs --store STORE --backend null` (not quiet): exit code, stderr lines, report totals."""
    (cwd / "report.json").unlink(missing_ok=True)
    res = ingest("run", "docs", "--store", store, "--backend", "null", "--report", "report.json", *extra, cwd=cwd)
    assert res.report is not None, res.stderr[-2000:]
    return res.rc, [line for line in res.stderr.splitlines() if line.strip()], res.report["totals"]


@pytest.mark.slow
def test_a_run_into_the_null_store_ingests_every_file_each_time_and_keeps_nothing(work: Path) -> None:
    make_pdf(work / "docs" / "report.pdf", ["Quarterly revenue grew in the northern region.", "Costs fell."])
    make_docx(work / "docs" / "memo.docx", ["The harbour lantern was repaired in March."], heading="Memo")
    text_files(work / "docs", 3, paragraphs=2)
    for _ in range(2):                              # no manifest kept: the rerun ingests everything again
        rc, err, totals = run_into("null://", work)
        assert rc == 0, err[-5:]
        assert totals["by_status"] == {"ingested": 5} and totals["chunks"] >= 8
        assert totals["store"] == "null://" and totals["store_bound"] is None
        assert totals["chunks_per_s"]["write"] > 0
    assert sorted(p.name for p in work.iterdir()) == ["docs", "report.html", "report.json"]    # nothing else on disk
    for argv, what in ((["search", "harbour", "--store", "null://"], "nothing to search"),
                       (["status", "--store", "null://"], "no status to show")):
        res = ingest(*argv, cwd=work)
        lines = res.stderr.strip().splitlines()
        assert res.rc == 2 and len(lines) == 1 and what in lines[0] and "null://" in lines[0], res.stderr


@pytest.mark.slow
def test_a_run_held_back_by_milvus_lite_says_so_last_and_in_its_report(work: Path) -> None:
    text_files(work / "docs", 400)                  # 6,400 chunks: the null backend outruns Milvus Lite
    rc, err, totals = run_into(str(work / "store.db"), work)
    assert rc == 0, err[-5:]
    bound = totals["store_bound"]
    assert bound is not None, totals["timeline"]["busy_s"]
    assert bound["store"] == "Milvus Lite" and bound["store_busy"] >= 0.75 and bound["encoder_busy"] <= 0.5
    assert bound["rows_per_s"] == totals["chunks_per_s"]["write"] > 0
    assert err[-1] == bound["line"]
    assert err[-1].startswith("the store was busy ") and "Milvus Lite writes about " in err[-1]
    assert "lancedb://" in err[-1]
    page = (work / "report.html").read_text()
    assert 'id="store-bound"' in page and "Milvus Lite writes about" in page
    rc, err, totals = run_into("null://", work)     # the same folder into the null store: not held back
    assert rc == 0 and totals["store_bound"] is None
    assert not any("the store was busy" in line for line in err)
    assert err[-1].startswith("report: ")


def timeline_totals(write: float, encode: float, seconds: float = 10.0, chunks: int = 5000) -> dict:
    """A run's totals whose timeline has 10 buckets of seconds/10, the stages busy that share of each."""
    width = seconds / 10
    lanes = {"load": 0.1, "ocr": 0.0, "chunk": 0.2, "encode": encode, "write": write}
    return {"chunks": chunks, "chunks_per_s": {"write": 1612.0},
            "timeline": {"measured": True, "bucket_s": width, "seconds": seconds, "began_s": 0.5,
                         "stages": {s: [v * width] * 10 for s, v in lanes.items()},
                         "slots": {"load": 2, "ocr": 2, "encode": 1, "write": 1, "chunk": 2}}}


def test_the_verdict_needs_a_busy_store_an_idle_encoder_and_a_run_long_enough_to_tell() -> None:
    bound = store_bound(timeline_totals(0.96, 0.02), "Milvus Lite", "milvus-lite")
    assert bound["line"] == ("the store was busy 96% of the run since its first rows and the encoder 2%: Milvus Lite "
                             "writes about 1,600 rows/s; a server store (a Milvus server, PostgreSQL) or LanceDB "
                             "(lancedb://) takes more (docs/stores.md)")
    assert store_bound(timeline_totals(0.5, 0.02), "Milvus Lite", "milvus-lite") is None       # the store not busy
    assert store_bound(timeline_totals(0.96, 0.9), "Milvus Lite", "milvus-lite") is None       # the encoder busy
    assert store_bound(timeline_totals(0.96, 0.02, seconds=1.5), "Milvus Lite", "milvus-lite") is None   # too short
    assert store_bound(timeline_totals(0.96, 0.02, chunks=300), "Milvus Lite", "milvus-lite") is None    # too few
    assert store_bound({"timeline": {"measured": False, "why": "ray"}}, "Milvus", "milvus") is None
    server = store_bound(timeline_totals(0.9, 0.1), "PostgreSQL + pgvector", "postgresql")
    assert "more writer processes ([store] writers, 1 now)" in server["line"]
    assert json.loads(json.dumps(server)) == server
