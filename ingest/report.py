"""The per-file JSON report and the closing summary line.

NOTE (spool): a run's files settle one by one (`Tally.add`): each file's report line is appended
to a spool beside the report (`<report>.files.jsonl`, one JSON object a line, in the file
within SPOOL_FLUSH_S) and only counters stay in memory. At the end `Tally.write` assembles the report from the
spool (a JSON object: "files", one entry a line, and "totals"), writes it atomically and removes
the spool. A run killed before its report leaves the spool: the lines of the files that ended.
The HTML page (ingest/html_report.py) is written right after, from the same lines, which its
bounded `Digest` took in as they were spooled.
"""
from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Iterable

from ingest import html_report
from ingest.files import Finished, Outcome
from ingest.outputs import html_path, spool_path, tmp_path
from ingest.scan import CANNOT_LIST
from ingest.store import local_path

if TYPE_CHECKING:
    from ingest.encode import EncodeStage
    from ingest.write import Writer

SPOOL_FLUSH_S = 0.5          # a settled file's line reaches the spool file within this (one write, not one a file)
_ENCODE = json.JSONEncoder(ensure_ascii=False).encode


def default_report_path(uri: str) -> Path:
    return Path(f"{local_path(uri)}.report.json") if local_path(uri) else Path("ingest-report.json")


def unwritable(path: Path) -> str | None:
    """Why a run could not write its report at `path` (one line: a folder, a path under a file, a folder it may
    not write in), or None. A run checks before it starts, by making the report's folder and a trial temp file."""
    if path.is_dir():
        return f"the report path {path} is a folder; pass --report a file's path, such as {path / 'report.json'}"
    folder = next(f for f in (path.parent, *path.parent.parents) if f.exists() or f == f.parent)
    if not folder.is_dir():
        return f"cannot write the report {path}: {folder} is a file, not a folder; pass --report a path in a folder"
    tmp = tmp_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.open("w").close()
        tmp.unlink()
    except OSError as exc:
        return f"cannot write the report {path}: {exc.strerror or exc}; pass --report a path in a folder you can write"
    return None


def file_entry(file: Finished) -> dict[str, Any]:
    """A file's report line; `stages`: the seconds each stage worked on it, which `seconds` sums."""
    o = file.outcome
    stages = {stage: round(s, 3) for stage, s in o.times.items() if round(s, 3)}
    entry: dict[str, Any] = {"path": file.ref.source, "status": o.status, "format": file.ref.fmt or None,
                             "chunks": o.chunks, "seconds": round(sum(stages.values()), 3)}
    if o.status == "ingested" and o.chunks:          # how its chunks got their vectors (ingest/reuse.py)
        entry["encoded"], entry["reused"] = encoded(o), o.reused
    if stages:
        entry["stages"] = stages
    if o.error:
        entry["error"] = o.error
    if o.ocr_pages:
        entry["ocr_pages"] = o.ocr_pages
    if o.junk:
        entry["junk_chunks"] = o.junk
    if o.warnings:
        entry["warnings"] = list(o.warnings)
    return entry


def encoded(o: Outcome) -> int:
    """Chunks the encoder embedded for a file: all of them where the engine does not count (Ray)."""
    return o.chunks - o.reused if o.encoded is None else o.encoded


class Tally:
    """The files of a run as they settle: their lines in the spool (NOTE), their counts in memory, the
    recorded sources no file settled as yet (`unseen`: for prune) and the folders the scan could not list."""

    def __init__(self, report_path: Path, recorded: Iterable[str] = ()):
        self.report_path = report_path
        self.unseen, self.unlisted = set(recorded), []
        self.spool = spool_path(report_path)
        self.by_status: Counter[str] = Counter()
        self.by_format: Counter[str] = Counter()
        self.files = self.chunks = self.junk = 0
        self.encoded = self.reused = 0       # chunks of the ingested files: encoded, or given a vector made before
        self.load_s = 0.0                    # loading, OCR and chunking seconds of the ingested files
        self.pdf_pages, self.pdf_cpu_s = 0, 0.0      # the PDFs read to their end: pages, their loaders' and OCR's CPU
        self.digest = html_report.Digest()
        self._out: IO[str] | None = None
        self._flushed = 0.0
        self.spool_error: OSError | None = None      # the spool could not be written (a full disk): no report

    def add(self, file: Finished) -> None:
        if self._out is None:
            self.spool.parent.mkdir(parents=True, exist_ok=True)
            self._out = open(self.spool, "w", encoding="utf-8")
        entry = file_entry(file)
        if self.spool_error is None:
            try:
                self._out.write(_ENCODE(entry) + "\n")
                if (now := time.monotonic()) - self._flushed > SPOOL_FLUSH_S:
                    self._out.flush()
                    self._flushed = now
            except OSError as exc:           # a full disk: the counts go on; `write` says the report is lost
                self.spool_error = exc
        self.digest.add(entry)
        o = file.outcome
        self.unseen.discard(file.ref.source)
        if o.error and o.error.startswith(CANNOT_LIST):     # a folder the scan could not list (to its end): what
            #                                   lies under it is unknown, so nothing there is taken for deleted
            self.unlisted.append(file.ref.source)
        self.files += 1
        self.by_status[o.status] += 1
        self.by_format[file.ref.fmt or "unknown"] += 1
        self.junk += o.junk
        if o.status == "ingested":
            self.chunks += o.chunks
            self.encoded += encoded(o)
            self.reused += o.reused
            self.load_s += o.times.loader_side
        if o.read_pages and file.ref.fmt == "pdf":
            self.pdf_pages += o.read_pages
            self.pdf_cpu_s += o.cpu_s

    def rates(self, stage: EncodeStage | None, writer: Writer | None) -> dict[str, float]:
        """Chunks per second: loading (its seconds summed over processes), tokenizing and encoding (the encode
        pool's busy seconds), writing (rows per busy second of the writer)."""
        if not self.chunks:
            return {}
        rates = {"load": self.chunks / self.load_s} if self.load_s else {}
        stats = stage.stats if stage is not None else {}
        rates.update((s, self.chunks / stats[f"{s}_s"]) for s in ("tokenize", "encode") if stats.get(f"{s}_s"))
        if writer is not None and writer.seconds:
            rates["write"] = writer.rows_written / writer.seconds
        return rates

    def totals(self, seconds: float, stages: dict[str, float], extra: dict[str, Any],
               cpu_s: float | None = None) -> dict[str, Any]:
        """The report's totals; `cpu_s`: the CPU seconds of the run's processes, None where not measured (what
        it costs a file: over every file that ended; a PDF page: the loaders' and OCR's CPU over the pages read)."""
        return {"files": self.files, "by_status": dict(self.by_status), "by_format": dict(self.by_format),
                "chunks": self.chunks, "encoded_chunks": self.encoded, "reused_chunks": self.reused,
                "junk_chunks": self.junk, "seconds": round(seconds, 2),
                "chunks_per_s": {k: round(v, 1) for k, v in stages.items()},
                "cpu_s": None if cpu_s is None else round(cpu_s, 2),
                "cpu_per_file_ms": round(cpu_s * 1000 / self.files, 2) if cpu_s is not None and self.files else None,
                "pdf_pages": self.pdf_pages,
                "cpu_per_pdf_page_ms": round(self.pdf_cpu_s * 1000 / self.pdf_pages, 2) if self.pdf_pages else None,
                **extra}

    def write(self, totals: dict[str, Any]) -> None:
        """The report from the spool, written atomically, then its HTML page; then the spool goes. An OSError
        writing the spool or the JSON report leaves the spool (its lines, all that could be written) and no temp
        file."""
        if self._out is not None:
            try:
                self._out.close()
            except OSError as exc:
                self.spool_error = self.spool_error or exc
        if self.spool_error is not None:     # its lines are not all there: no report made from part of them
            raise self.spool_error
        path = self.report_path
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = tmp_path(path)
        try:
            with open(tmp, "w", encoding="utf-8") as out:
                out.write('{\n "files": [')
                if self._out is not None:
                    with open(self.spool, encoding="utf-8") as lines:
                        for n, line in enumerate(lines):
                            out.write(("\n  " if n == 0 else ",\n  ") + line.rstrip("\n"))
                out.write('\n ],\n "totals": ' if self.files else '],\n "totals": ')
                out.write(json.dumps(totals, indent=1, ensure_ascii=False).replace("\n", "\n ") + "\n}")
            os.replace(tmp, path)
        except OSError:                      # no half report left behind; the spool keeps the lines
            tmp.unlink(missing_ok=True)
            raise
        page = html_path(path)
        try:
            html_report.write(page, totals, self.digest)
        except OSError as exc:               # the JSON report is written and true: the page only shows it
            tmp_path(page).unlink(missing_ok=True)
            print(f"warning: no HTML report written to {page} ({exc.strerror or exc}); the JSON report {path} "
                  "has everything", file=sys.stderr)
        if self._out is not None:
            self.spool.unlink(missing_ok=True)


def write_unstarted(path: Path, stopped_by: str, exit_code: int, seconds: float, extra: dict[str, Any]) -> str:
    """Write the report of a run that stopped before its scan: no files, what stopped it (one line), the
    exit code, not_started None (the folder was not read). "" once written, else why not, to append to
    the error's one line (the run is failing already: this must not hide why)."""
    tally = Tally(path)
    totals = tally.totals(seconds, {}, {"not_started": None, "scan_finished": False, "pruned": 0, "interrupted": False,
                                        "signal": None, "stopped_by": stopped_by, "exit_code": exit_code, **extra})
    try:
        tally.write(totals)
    except OSError as exc:
        return f"; no report written to {path} ({exc.strerror or exc})"
    return ""


def summary(t: dict) -> str:
    """The closing line, from the report's totals."""
    status = ", ".join(f"{n} {s}" for s, n in sorted(t["by_status"].items()))
    fmts = ", ".join(f"{n} {f}" for f, n in sorted(t["by_format"].items()))
    rates = ", ".join(f"{k} {v:g}" for k, v in t["chunks_per_s"].items())
    cpu = ", ".join(f"{t[k]:g} {unit}" for k, unit in html_report.CPU if t.get(k) is not None)
    return (f"{t['files']} files ({status}) | by format: {fmts} | {t['chunks']} chunks in {t['seconds']:g} s"
            + (f" | chunks/s: {rates}" if rates else "") + (f" | CPU: {cpu}" if cpu else ""))
