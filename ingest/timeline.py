"""How busy each stage of a run was over its time: the report's timeline (totals["timeline"]).

The dispatcher, the encode thread and the writer add busy stretches as they learn of them (a loader
result carries its seconds, an OCR page its own, the encode pool its running totals, the writer its
batches and commits). `Timeline` spreads each stretch's busy seconds over BUCKETS buckets of run time;
a run that outgrows them doubles the bucket width (neighbours merged), so memory stays constant
whatever the run's length. Busy seconds are summed over processes: a bucket of a stage with two
workers both busy holds twice its width.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Iterable, Mapping

from ingest.files import STAGES, Times
from ingest.loaders import formats as known_formats, pool_for

BUCKETS = 120
FIRST_BUCKET_S = 0.1


class Timeline:
    def __init__(self, started: float | None = None):
        """`started`: the run's start (perf_counter); ingesting begins now."""
        self.began = time.perf_counter()
        self.started = self.began if started is None else started
        self.bucket_s = FIRST_BUCKET_S
        self.busy = {stage: [0.0] * BUCKETS for stage in STAGES}
        self.totals = dict.fromkeys(STAGES, 0.0)
        self._lock = threading.Lock()        # the dispatcher, the encode thread and the writer's threads add

    def add(self, stage: str, start: float, end: float, busy: float | None = None) -> None:
        """`busy` seconds (default: end - start) of `stage`, spread evenly over [start, end] (perf_counter)."""
        busy = end - start if busy is None else busy
        a, b = max(0.0, start - self.started), max(0.0, end - self.started)
        with self._lock:
            while b >= self.bucket_s * BUCKETS:
                self._widen()
            self.totals[stage] += busy
            lane, width = self.busy[stage], self.bucket_s
            if b - a <= 0:
                lane[int(a / width)] += busy
                return
            for i in range(int(a / width), int(b / width) + 1):
                overlap = min(b, (i + 1) * width) - max(a, i * width)
                if overlap > 0:
                    lane[i] += busy * overlap / (b - a)

    def worked(self, times: Times) -> None:
        """A worker's result just came back: its stages' seconds, spread over the time it took until now."""
        end = time.perf_counter()
        for stage, seconds in times.items():
            if seconds:
                self.add(stage, end - times.total, end, seconds)

    def _widen(self) -> None:
        for stage, lane in self.busy.items():
            self.busy[stage] = [lane[i] + lane[i + 1] for i in range(0, BUCKETS, 2)] + [0.0] * (BUCKETS // 2)
        self.bucket_s *= 2

    def report(self, slots: Mapping[str, int]) -> dict[str, Any]:
        """The report's timeline up to now: busy seconds per bucket and in all, and the processes each stage
        may keep busy (`slots`: the chunker runs in the loader and the OCR workers)."""
        seconds = time.perf_counter() - self.started
        with self._lock:
            while seconds >= self.bucket_s * BUCKETS:
                self._widen()
            used = int(seconds / self.bucket_s) + 1
            return {"measured": True, "bucket_s": round(self.bucket_s, 6), "seconds": round(seconds, 3),
                    "began_s": round(self.began - self.started, 3),      # the start-up before ingesting
                    "stages": {s: [round(v, 3) for v in lane[:used]] for s, lane in self.busy.items()},
                    "busy_s": {s: round(v, 3) for s, v in self.totals.items()},
                    "slots": {**slots, "chunk": slots["load"] + (slots["ocr"] if self.totals["ocr"] else 0)}}


def unmeasured(why: str) -> dict[str, Any]:
    """The timeline of an engine that does not measure one."""
    return {"measured": False, "why": why}


def slots(loaders: Mapping[str, Any], formats: Iterable[str], encoders: int, writers: int) -> dict[str, int]:
    """Processes per stage: the workers of the loader pools (config [loaders]) that `formats` use, the OCR
    pool's, the encode workers and the writer processes."""
    pools = {pool_for(f) for f in formats if f in known_formats()}
    return {"load": sum(loaders[p]["workers"] for p in pools), "ocr": loaders["ocr"]["workers"], "encode": encoders,
            "write": writers}


class Meter:
    """The busy seconds of a pool that works ahead, from its running totals (busy seconds, chunks done) read
    as it returns each group: recorded on the timeline (if any), and charged to the groups by their chunks (a group
    gets the average of what was done since the last charge, its share of the batches it was in)."""

    def __init__(self, timeline: Timeline | None, stage: str):
        self.timeline, self.stage = timeline, stage
        self._busy, self._done, self._at = 0.0, 0, 0.0
        self._owed_s, self._owed_chunks = 0.0, 0

    def charge(self, busy_s: float, done: int, chunks: int) -> float:
        """A group of `chunks` is back, the pool's totals now `busy_s` and `done`: the group's seconds."""
        now = time.perf_counter()
        if (new := busy_s - self._busy) > 0 and self.timeline is not None:
            self.timeline.add(self.stage, max(self._at or now - new, now - new), now, new)
        self._owed_s += new
        self._owed_chunks += done - self._done
        self._busy, self._done, self._at = busy_s, done, now
        n = min(chunks, self._owed_chunks)
        if n <= 0:
            return 0.0
        share = self._owed_s * n / self._owed_chunks
        self._owed_s, self._owed_chunks = self._owed_s - share, self._owed_chunks - n
        return share


class BusyClock:
    """Seconds during which at least one task of a kind ran (they overlap: counted once), from any thread;
    each busy stretch goes on the timeline."""

    def __init__(self, timeline: Timeline, stage: str):
        self.timeline, self.stage = timeline, stage
        self.total = 0.0
        self._lock = threading.Lock()
        self._running, self._since = 0, 0.0

    def start(self) -> None:
        with self._lock:
            if self._running == 0:
                self._since = time.perf_counter()
            self._running += 1

    def end(self) -> None:
        with self._lock:
            self._running -= 1
            if self._running == 0:
                now = time.perf_counter()
                self.total += now - self._since
                self.timeline.add(self.stage, self._since, now)

    def now(self) -> float:
        """`total`, with the stretch under way."""
        with self._lock:
            return self.total + (time.perf_counter() - self._since if self._running else 0.0)


def shares(seconds: float, weights: list[int]) -> list[float]:
    """`seconds` split by `weights` (evenly if they are all 0)."""
    total = sum(weights)
    return [seconds * w / total if total else seconds / len(weights) for w in weights]


# -- the store as the run's bottleneck (the report's totals["store_bound"], the run's last line) --------------
STORE_BUSY = 0.75          # the writers busy at least this share of the run after its first row ...
ENCODER_IDLE = 0.5         # ... while the encode workers were busy at most this share, and no stage more than them
BOUND_MIN_S = 2.0          # shorter windows, or fewer rows, measure nothing
BOUND_MIN_ROWS = 1000
FASTER = {"milvus-lite": "a server store (a Milvus server, PostgreSQL) or LanceDB (lancedb://) takes more",
          "qdrant-local": "a Qdrant server, PostgreSQL or LanceDB (lancedb://) takes more"}


def store_bound(totals: Mapping[str, Any], store: str, store_kind: str) -> dict[str, Any] | None:
    """Whether the store held the run back, from a run's report `totals` (its timeline, chunks and the writers'
    rows/s): the writers busy >= STORE_BUSY of the time from their first batch to the end, the encoders
    <= ENCODER_IDLE, and no stage busier, over at least BOUND_MIN_S and BOUND_MIN_ROWS. Then the shares, the
    store's rows/s (`store`: its name) and what to use instead (by `store_kind`, a `uri.kind`), with the
    run's last line; else None."""
    tl = totals.get("timeline") or {}
    rate = (totals.get("chunks_per_s") or {}).get("write")
    if not tl.get("measured") or not rate or totals.get("chunks", 0) < BOUND_MIN_ROWS:
        return None
    width, writes = tl["bucket_s"], tl["stages"]["write"]
    first = next((i for i, busy in enumerate(writes) if busy > 0), len(writes)) * width    # the store's first batch
    window = tl["seconds"] - first
    if window < BOUND_MIN_S:
        return None
    use = {s: min(1.0, sum(lane[int(first / width):]) / (window * max(1, tl["slots"].get(s, 1))))
           for s, lane in tl["stages"].items()}
    store_busy, encoder_busy = use.get("write", 0.0), use.get("encode", 0.0)
    if store_busy < STORE_BUSY or encoder_busy > ENCODER_IDLE or max(use.values()) > store_busy:
        return None
    about = float(f"{rate:.2g}")
    instead = FASTER.get(store_kind, f"more writer processes ([store] writers, {tl['slots'].get('write', 1)} now) "
                                     "or a faster server take more")
    line = (f"the store was busy {store_busy:.0%} of the run since its first rows and the encoder {encoder_busy:.0%}: "
            f"{store} writes about {about:,.0f} rows/s; {instead} (docs/stores.md)")
    return {"stage": "write", "store": store, "store_busy": round(store_busy, 3), "encoder_busy": round(encoder_busy, 3),
            "busy": {s: round(v, 3) for s, v in use.items()}, "since_s": round(first, 3), "window_s": round(window, 3),
            "rows_per_s": round(rate, 1), "instead": instead, "line": line}

