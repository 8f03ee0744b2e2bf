"""The per-file JSON report and the closing summary line."""
from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

from ingest.scan import FileJob
from ingest.store import is_local


def default_report_path(uri: str) -> Path:
    return Path(f"{Path(uri).resolve()}.report.json") if is_local(uri) else Path("ingest-report.json")


def file_entry(job: FileJob) -> dict[str, Any]:
    entry: dict[str, Any] = {"path": job.source, "status": job.status, "format": job.fmt or None,
                             "chunks": job.chunks, "seconds": round(job.seconds, 3)}
    if job.error:
        entry["error"] = job.error
    if job.ocr_pages:
        entry["ocr_pages"] = job.ocr_pages
    if job.warnings:
        entry["warnings"] = job.warnings
    return entry


def build_report(jobs: list[FileJob], seconds: float, stages: dict[str, float], extra: dict[str, Any]) -> dict:
    by_status = Counter(j.status for j in jobs)
    by_format = Counter(j.fmt or "unknown" for j in jobs)
    written = sum(j.chunks for j in jobs if j.status == "ingested")
    return {
        "files": [file_entry(j) for j in jobs],
        "totals": {"files": len(jobs), "by_status": dict(by_status), "by_format": dict(by_format),
                   "chunks": written, "seconds": round(seconds, 2),
                   "chunks_per_s": {k: round(v, 1) for k, v in stages.items()}, **extra},
    }


def write_report(report: dict, path: Path) -> None:
    """Atomically: write a temp file, then os.replace."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=1, ensure_ascii=False), encoding="utf-8")
    os.replace(tmp, path)


def summary(report: dict) -> str:
    t = report["totals"]
    status = ", ".join(f"{n} {s}" for s, n in sorted(t["by_status"].items()))
    fmts = ", ".join(f"{n} {f}" for f, n in sorted(t["by_format"].items()))
    rates = ", ".join(f"{k} {v:g}" for k, v in t["chunks_per_s"].items())
    return (f"{t['files']} files ({status}) | by format: {fmts} | {t['chunks']} chunks in {t['seconds']:g} s"
            + (f" | chunks/s: {rates}" if rates else ""))
