"""`ingest serve`'s counters and histograms, written in Prometheus' text format (GET /metrics).

Requests by route and status, their latency, the embeddings batches' sizes (texts and tokens) and, with
--watch, the syncs and the files they ended by status. Routes are a fixed set (any other path counts as
"other"), so no request can grow the label sets. Every update takes one lock, for microseconds.
"""
from __future__ import annotations

import threading
from bisect import bisect_left
from typing import Any

ROUTES = {"/search": "search", "/v1/embeddings": "embeddings", "/v1/models": "models", "/status": "status",
          "/healthz": "healthz", "/metrics": "metrics"}
LATENCY_S = (0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_TEXTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
BATCH_TOKENS = (64, 256, 1024, 4096, 16384, 65536, 262144)
PREFIX = "ingest_serve_"


class Histogram:
    """Cumulative buckets (le), their sum and count."""

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)        # the last: +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def lines(self, name: str, labels: str = "") -> list[str]:
        out, total = [], 0
        sep = "," if labels else ""
        for bound, count in zip((*self.bounds, "+Inf"), self.counts):
            total += count
            out.append(f'{name}_bucket{{{labels}{sep}le="{bound}"}} {total}')
        tail = f"{{{labels}}}" if labels else ""
        return out + [f"{name}_sum{tail} {self.sum:.6f}", f"{name}_count{tail} {total}"]


class Metrics:
    """What GET /metrics shows; updated from the server's threads."""

    def __init__(self, watching: bool):
        self.watching = watching
        self._lock = threading.Lock()
        self._requests: dict[tuple[str, int], int] = {}
        self._latency = {route: Histogram(LATENCY_S) for route in (*ROUTES.values(), "other")}
        self._texts, self._tokens = Histogram(BATCH_TEXTS), Histogram(BATCH_TOKENS)
        self._syncs = 0
        self._files: dict[str, int] = {}

    def request(self, path: str, status: int, seconds: float) -> None:
        route = ROUTES.get(path, "other")
        with self._lock:
            self._requests[route, status] = self._requests.get((route, status), 0) + 1
            self._latency[route].observe(seconds)

    def batch(self, texts: int, tokens: int) -> None:
        with self._lock:
            self._texts.observe(texts)
            self._tokens.observe(tokens)

    def synced(self, totals: dict[str, Any]) -> None:
        """A sync of --watch ended: its report's totals."""
        with self._lock:
            self._syncs += 1
            for status, n in totals.get("by_status", {}).items():
                self._files[status] = self._files.get(status, 0) + n

    def text(self) -> str:
        p = PREFIX
        with self._lock:
            lines = [f"# HELP {p}requests_total HTTP requests by route and status.", f"# TYPE {p}requests_total counter"]
            lines += [f'{p}requests_total{{route="{r}",status="{s}"}} {n}' for (r, s), n in sorted(self._requests.items())]
            lines += [f"# HELP {p}request_seconds Time from a request's arrival to its response.",
                      f"# TYPE {p}request_seconds histogram"]
            for route, hist in self._latency.items():
                if hist.counts != [0] * len(hist.counts):
                    lines += hist.lines(f"{p}request_seconds", f'route="{route}"')
            lines += [f"# HELP {p}embed_batch_texts Texts per batch sent to the encode pool.",
                      f"# TYPE {p}embed_batch_texts histogram", *self._texts.lines(f"{p}embed_batch_texts"),
                      f"# HELP {p}embed_batch_tokens Tokens per batch sent to the encode pool.",
                      f"# TYPE {p}embed_batch_tokens histogram", *self._tokens.lines(f"{p}embed_batch_tokens")]
            if self.watching:
                lines += [f"# HELP {p}watch_syncs_total Syncs of the watched folder that ended.",
                          f"# TYPE {p}watch_syncs_total counter", f"{p}watch_syncs_total {self._syncs}",
                          f"# HELP {p}watch_files_total Files the syncs ended, by status.",
                          f"# TYPE {p}watch_files_total counter"]
                lines += [f'{p}watch_files_total{{status="{s}"}} {n}' for s, n in sorted(self._files.items())]
        return "\n".join(lines) + "\n"
