"""The per-file JSON report and the closing summary line."""
from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

from ingest.files import Finished
from ingest.store import is_local


def default_report_path(uri: str) -> Path:
    return Path(f"{Path(uri).resolve()}.report.json") if is_local(uri) else Path("ingest-report.json")


def file_entry(file: Finished) -> dict[str, Any]:
    o = file.outcome
    entry: dict[str, Any] = {"path": file.ref.source, "status": o.status, "format": file.ref.fmt or None,
                             "chunks": o.chunks, "seconds": round(o.seconds, 3)}
    if o.error:
        entry["error"] = o.error
    if o.ocr_pages:
        entry["ocr_pages"] = o.ocr_pages
    if o.junk:
        entry["junk_chunks"] = o.junk
    if o.warnings:
        entry["warnings"] = list(o.warnings)
    return entry


def build_report(files: list[Finished], seconds: float, stages: dict[str, float], extra: dict[str, Any]) -> dict:
    by_status = Counter(f.outcome.status for f in files)
    by_format = Counter(f.ref.fmt or "unknown" for f in files)
    written = sum(f.outcome.chunks for f in files if f.outcome.status == "ingested")
    return {
        "files": [file_entry(f) for f in files],
        "totals": {"files": len(files), "by_status": dict(by_status), "by_format": dict(by_format),
                   "chunks": written, "junk_chunks": sum(f.outcome.junk for f in files), "seconds": round(seconds, 2),
                   "chunks_per_s": {k: round(v, 1) for k, v in stages.items()}, **extra},
    }


def write_unstarted(path: Path, stopped_by: str, exit_code: int, seconds: float, extra: dict[str, Any]) -> str:
    """Write the report of a run that stopped before its scan: no files, what stopped it (one line), the
    exit code, not_started None (the folder was not read). "" once written, else why not, to append to
    the error's one line (the run is failing already: this must not hide why)."""
    report = build_report([], seconds, {}, {"not_started": None, "pruned": 0, "interrupted": False, "signal": None,
                                            "stopped_by": stopped_by, "exit_code": exit_code, **extra})
    try:
        write_report(report, path)
    except OSError as exc:
        return f"; no report written to {path} ({exc.strerror or exc})"
    return ""


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
