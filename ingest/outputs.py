"""The files a run writes for its report, named in one place: ingest/report.py and ingest/html_report.py build
their names here, and `ingest watch` ignores every one of them, so a sync never causes the next."""
from __future__ import annotations

from pathlib import Path


def tmp_path(path: Path) -> Path:
    """Where `path` is written before it replaces the old one (atomically)."""
    return path.with_name(path.name + ".tmp")


def spool_path(report: Path) -> Path:
    """The report's spool: each file's line as it ends (ingest/report.py NOTE)."""
    return report.with_name(report.name + ".files.jsonl")


def html_path(report: Path) -> Path:
    """The HTML page beside a JSON report: `.json` replaced by `.html`, else `.html` appended."""
    return report.with_suffix(".html") if report.suffix == ".json" else report.with_name(report.name + ".html")


def report_outputs(report: Path) -> tuple[Path, ...]:
    """Every file a run may write for its report at `report`: the JSON, its spool, its HTML page, and the
    .tmp of each."""
    files = (report, spool_path(report), html_path(report))
    return files + tuple(tmp_path(f) for f in files)
