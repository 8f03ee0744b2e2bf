"""`ingest status`: what a collection holds (files and chunks by format and by status; model, backend,
dimension, chunking settings) and how its last run went, from its manifest. Fast: no model, no torch.
A Lite store is not opened through Milvus: its SQLite manifest is read read-only, so status answers
while a run holds (flocks) the store; a server's manifest is read through pymilvus, creating nothing.

`--json` adds each file's card (who and when it is from, its kind: ingest/doc_card.py) under `cards`.

"Last run" is the manifest's `last_run` meta value (JSON), which every run records after its report
(`LastRun`: store first, then record): when it started and ended, its exit code, files by status, the
signal or error that stopped it, its report, and its first FAILED_MAX failed files with their errors.
"""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

from ingest.files import Finished
from ingest.store import StoreError, is_local, kind, local_path, redact
from ingest.store.factory import open_store
from ingest.store.null import keeps_nothing
from ingest.store.collection import STORE_META, Collection
from ingest.store.lite_folder import foreign_folder
from ingest.store.manifest import CARD_META, Summary, manifest_path, read_cards, read_summary, unreadable

LAST_RUN = "last_run"          # the manifest meta key
FAILED_MAX = 20                # failed files a last_run lists (it counts the others)
CHUNKING = ("chunk_tokens", "overlap_tokens", "context_tokens", "max_seq_length", "skip_junk")


class LastRun:
    """A run's `last_run` value: its failed files collected as they settle, recorded after its report."""

    def __init__(self) -> None:
        self.failed: list[dict[str, str]] = []

    def add(self, file: Finished) -> None:
        if file.outcome.status == "failed" and len(self.failed) < FAILED_MAX:
            self.failed.append({"path": file.ref.source, "error": file.outcome.error or ""})

    def record(self, col: Collection, report: Path, totals: dict[str, Any], fatal: Exception | None = None) -> None:
        """Record it in `col`'s manifest from the report's `totals` (a run stopped while starting gives only
        seconds, exit_code, signal and stopped_by); not after a server's StoreError (`fatal`: its lease lost,
        or it does not answer). A manifest that refuses it costs the run nothing: a warning, no more."""
        if isinstance(fatal, StoreError) and col.lease is not None:
            return
        ended = time.time()
        failed = totals.get("by_status", {}).get("failed", 0)
        value = {"started": round(ended - totals["seconds"], 3), "ended": round(ended, 3),
                 "seconds": round(totals["seconds"], 2), "exit_code": totals["exit_code"],
                 "files": totals.get("files", 0), "by_status": totals.get("by_status", {}),
                 "chunks": totals.get("chunks", 0), "signal": totals.get("signal"),
                 "stopped_by": totals.get("stopped_by"), "report": str(report.resolve()), "dim": col.model.dim,
                 "failed": self.failed, "failed_more": max(0, failed - len(self.failed))}
        try:
            col.manifest.set_meta(LAST_RUN, json.dumps(value, ensure_ascii=False))
        except (StoreError, sqlite3.Error) as exc:
            print(f"warning: the last run was not recorded for ingest status: {exc}", file=sys.stderr)


def status(cfg: dict[str, Any], *, as_json: bool) -> int:
    """Print what the configured collection holds and its last run (text, or one JSON object); 0. A store
    or collection that does not exist is a StoreError (one line), and nothing is created."""
    info = collect(cfg, cards=as_json)
    print(json.dumps(info, ensure_ascii=False, indent=1) if as_json else text(info))
    return 0


def collect(cfg: dict[str, Any], *, cards: bool) -> dict[str, Any]:
    """What `status` prints, as one JSON-able dict (`cards`: each file's card, as --json shows; `ingest serve`'s
    GET /status); a StoreError (one line) if the store or collection does not exist."""
    uri, collection = cfg["store"]["uri"], cfg["store"]["collection"]
    if kind(uri) == "null":
        raise StoreError(keeps_nothing(redact(uri), "no status to show (each run's report has its figures)"))
    info = _embedded(uri, collection) if is_local(uri) else _server(uri, collection, cfg["store"]["timeout_s"])
    if cards and is_local(uri):          # each file's card (ingest/doc_card.py): JSON only, it is one line a file
        info["cards"] = {source: _json(card) for source, card in sorted(read_cards(manifest_path(uri, collection)).items())}
    return info


def _embedded(uri: str, collection: str) -> dict[str, Any]:
    """Milvus Lite, Qdrant's local mode: read from the SQLite manifest beside the store, which stays closed."""
    path = manifest_path(uri, collection)
    if foreign := foreign_folder(uri):
        raise StoreError(foreign)
    if not local_path(uri).exists():
        raise StoreError(f"no store at {uri}; run ingest run FOLDER first")
    if not path.exists():
        raise StoreError(f"no collection {collection!r} in {uri}; run ingest run FOLDER --collection {collection} first")
    try:
        summary = read_summary(path)
    except sqlite3.Error as exc:
        raise StoreError(unreadable(path, exc)) from None
    trusted = _json(summary.meta.get(STORE_META))        # what the last clean close recorded (none during a run)
    recorded = tuple(trusted["recorded"]) if trusted else None
    return _info(uri, collection, summary, recorded, _flock_holder(local_path(uri)))


def _server(uri: str, collection: str, timeout_s: float) -> dict[str, Any]:
    store = open_store(uri, collection, timeout_s)
    try:
        recorded = store.recorded()
        if recorded is None:
            why = "was not made by ingest; choose another --collection" if store.exists() else \
                f"does not exist; run ingest run FOLDER --store {store.uri} --collection {collection} first"
            raise StoreError(f"collection {collection!r} on {store.uri} {why}")
        summary = store.summary()
        in_use = store.holder() if summary is not None else None
        return _info(store.uri, collection, summary or Summary({}, []), recorded, in_use)
    finally:
        store.close()


def _info(uri: str, collection: str, summary: Summary, recorded: tuple | None, in_use: str | None) -> dict[str, Any]:
    """The status as one JSON-able dict."""
    settings, last = _json(summary.meta.get("settings")) or {}, _json(summary.meta.get(LAST_RUN))
    by_format: dict[str, dict[str, int]] = {}
    by_status: dict[str, dict[str, int]] = {}
    for fmt, status_, files, chunks in summary.counts:
        for key, table in ((fmt or "unknown", by_format), (status_, by_status)):
            row = table.setdefault(key, {"files": 0, "chunks": 0})
            row["files"] += files
            row["chunks"] += chunks
    backend = settings.get("backend", "torch") if settings else recorded[2] if recorded else None
    return {"store": uri, "collection": collection, "in_use_by": in_use,
            "model": settings.get("model") or (recorded[0] if recorded else None), "backend": backend,
            "dim": recorded[1] if recorded else last.get("dim") if last else None,
            "chunking": {k: settings[k] for k in CHUNKING if k in settings},
            "files": sum(n for _, _, n, _ in summary.counts), "chunks": sum(c for *_, c in summary.counts),
            "by_format": dict(sorted(by_format.items())), "by_status": dict(sorted(by_status.items())),
            "last_run": last,
            "cards": {k[len(CARD_META):]: _json(v) for k, v in sorted(summary.meta.items()) if k.startswith(CARD_META)}}


def _json(value: str | None) -> Any:
    try:
        return json.loads(value) if value else None
    except ValueError:
        return None


def _flock_holder(path: Path) -> str | None:
    """Who holds an embedded store's flock (a run), from /proc/locks: nothing is locked or opened to tell."""
    lock = Path(f"{path}.lock")
    try:
        st = lock.stat()
        locks = Path("/proc/locks").read_text()
    except OSError:
        return None
    device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in locks.splitlines():      # "1: FLOCK  ADVISORY  WRITE 2553 fe:00:2146343 0 EOF" ("->" when waiting)
        fields = line.split()
        at = fields.index("FLOCK") if "FLOCK" in fields and "->" not in fields else -1
        if at >= 0 and fields[at + 4:at + 5] == [device]:
            return f"ingest pid {fields[at + 3]}"
    return None


def text(info: dict[str, Any]) -> str:
    """The status for a terminal: a few short lines, each failed file on one line (cut to a terminal's width)."""
    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
    lines = [f"store      {info['store']}  collection {info['collection']}"]
    if info["in_use_by"]:
        lines.append(f"           in use by {info['in_use_by']}: counts as of its last flush")
    lines.append(f"model      {info['model'] or '-'}  backend {info['backend'] or '-'}  dim {info['dim'] or '-'}")
    if info["chunking"]:
        lines.append("chunking   " + ", ".join(f"{k} {json.dumps(v)}" for k, v in info["chunking"].items()))
    lines.append(f"holds      {info['files']} files, {info['chunks']} chunks")
    for title, table in (("format", info["by_format"]), ("status", info["by_status"])):
        if table:
            lines.append(f"  {title:<12}{'files':>8}{'chunks':>10}")
            lines += [f"  {key:<12}{row['files']:>8}{row['chunks']:>10}" for key, row in table.items()]
    last = info["last_run"]
    if not last:
        return "\n".join([*lines, "last run   none recorded"])
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(last["started"]))
    ended = time.strftime("%H:%M:%S", time.localtime(last["ended"]))
    counts = ", ".join(f"{n} {s}" for s, n in sorted(last["by_status"].items())) or "no files"
    lines.append(f"last run   {when} to {ended} ({last['seconds']:g} s), exit {last['exit_code']}: {counts}")
    if last["signal"] or last["stopped_by"]:
        lines.append(_cut(f"           stopped by {last['stopped_by'] or last['signal']}", width))
    lines.append(f"           report {last['report']}")
    for n, f in enumerate(last["failed"]):
        lines.append(_cut(f"{'failed' if n == 0 else '':<11}{f['path']}: {f['error']}", width))
    if last["failed_more"]:
        lines.append(f"           ... and {last['failed_more']} more failed (the report lists them)")
    return "\n".join(lines)


def _cut(line: str, width: int | None) -> str:
    return line if width is None or len(line) <= width else line[:width - 1] + "…"
