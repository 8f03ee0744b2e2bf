"""One call's stream through the encode pool: its input feeder, its windows, its ordered output.

A run reads its (key, texts) groups in a feeder thread, since the iterable may block for long
stretches (document loaders feed it). texts may be Pretokenized (the chunker made the ids): a
window made only of such texts is batched by the coordinator without a tokenizer process. The coordinator cuts the arrived texts into windows:
a full window, or whatever is there once the oldest waiting text has waited STALL_S, or the
rest when the input ends; it never waits to fill a window. Finished windows come back to
`window_done`, a reorder buffer (workers/reorder.py) keyed by window number that releases
them in input order; the caller's thread re-cuts their rows into groups. Memory stays
bounded: at most `max_windows` windows exist between being cut and being taken by the
caller (the reorder buffer's capacity), and the feeder blocks on a bounded inbox, so an
input larger than RAM is consumed lazily.

NOTE (wake-ups): the feeder wakes the coordinator when a group arrives while the coordinator holds no
text (its wait, STALL_S, starts now), once a window's worth has arrived since the last wake-up, and at the
end of the input; not for every group (a document pipeline's groups are files: a wake-up each cost the
coordinator a pass per file). Texts that arrive while it holds some are taken at its next pass, which
comes within STALL_S (the stall deadline), and a pass that finds texts waiting in the inbox with room for
them takes them at once (`stall_deadline`), so a read of `_pending_texts` that is stale costs nothing.

NOTE (stop): a run given a `stop` Event is cut short once it is set (the coordinator notices within
its ~0.5 s sleep): what is not yet on a worker (the inbox, texts not yet cut, windows tokenizing,
batches queued) is dropped, and only the batches a worker is running that complete their window
are waited for (a window's rows come back whole or not at all, so the others' work is lost anyway).
Once none is left (`drain`), the caller gets the groups whose rows all came back, then None for
every other group: those it already handed over and those still to come, which the feeder reads to
the end of the input without encoding them. A stop costs at most one batch, not the windows read ahead.
"""
from __future__ import annotations

import queue
import threading
import time
from collections import deque
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from ..reorder import Reorder
from ._messages import Pretokenized

STALL_S = 0.05
_END = object()
_DRAINED = object()                          # on the results queue: no more rows come (NOTE: stop)


class EncodeRun:
    def __init__(self, groups: Iterable[tuple[Any, Any]], window_size: int, max_windows: int,
                 wake: Callable[[], None], on_failed: Callable[[int, int, BaseException], None] | None = None,
                 stop: threading.Event | None = None):
        self.window_size = window_size
        self.on_failed = on_failed           # set: chunks that cannot be encoded get NaN rows, the run goes on
        self.stop = stop                     # once set, the run is cut short (NOTE: stop)
        self.stopped = False                 # failed or abandoned: the coordinator drops it
        self.cut = False                     # cut short: nothing more is cut into windows or dispatched
        self.drained = False                 # cut short and no batch of it running: the coordinator drops it
        self._wake = wake
        self._inbox: queue.Queue = queue.Queue(maxsize=window_size)
        self._layout: deque[tuple[Any, int]] = deque()    # (key, rows) in input order
        self._results: queue.SimpleQueue = queue.SimpleQueue()    # windows' rows in order, None, or an error
        self._error: BaseException | None = None
        self._input_done = threading.Event()
        self._unannounced = 0                # feeder-only: texts put since the coordinator was last woken
        self._slots_lock = threading.Lock()
        self._free_slots = max_windows
        # coordinator-only state
        self._pending: deque[_Segment] = deque()    # texts not yet cut into windows, a group's at a time
        self._pending_texts = 0
        self._oldest = 0.0                   # arrival time of the oldest pending text
        self._input_ended = False
        self._cut = 0                        # texts cut into windows so far
        self._windows = 0
        self._reorder: Reorder[np.ndarray] = Reorder(max_windows)
        threading.Thread(target=self._feed, args=(groups,), name="ingest-encode-feeder", daemon=True).start()

    # -- feeder thread ---------------------------------------------------------------
    def _feed(self, groups: Iterable[tuple[Any, Any]]) -> None:
        seen = 0
        try:
            for key, texts in groups:
                if self.stopped:
                    return
                if isinstance(texts, Pretokenized):
                    lengths = np.asarray(texts.lengths, dtype=np.int32)
                    total = int(lengths.sum()) if len(lengths) else 0
                    if len(lengths) != len(texts.texts) or total != len(texts.ids):
                        raise ValueError(f"group {key!r}: Pretokenized lengths do not match its texts and ids")
                    segment = _Segment(list(texts.texts), np.asarray(texts.ids, dtype=np.int32), lengths)
                else:
                    texts = texts if isinstance(texts, (list, tuple)) else list(texts)
                    for i, text in enumerate(texts):
                        if not isinstance(text, str):
                            where = f"text {seen + i}" if key is None else f"text {i} of group {key!r}"
                            raise TypeError(f"{where} is {type(text).__name__}, not str")
                    segment = _Segment(list(texts), None, None)
                n = len(segment.texts)
                seen += n
                self._layout.append((key, n))
                if n and not self.cut:
                    self._put((time.monotonic(), segment))
                else:
                    self._results.put(None)          # lets the caller yield the group now
            self._put(_END)
        except BaseException as exc:                 # the input's own error, raised to the caller
            self.fail(exc)
        finally:
            self._input_done.set()
            self._results.put(None)

    def _put(self, item: Any) -> None:
        """Into the inbox; the coordinator is woken only when it has something to do (NOTE: wake-ups)."""
        texts = 0 if item is _END else len(item[1].texts)
        while not (self.stopped or self.cut):
            try:
                self._inbox.put(item, timeout=0.25)
            except queue.Full:
                continue
            self._unannounced += texts
            if item is _END or self._unannounced >= self.window_size or not self._pending_texts:
                self._unannounced = 0
                self._wake()
            return

    # -- coordinator thread ----------------------------------------------------------
    def cut_short(self) -> None:
        """The stop is set: cut nothing more; the texts not yet in a window are dropped (NOTE: stop)."""
        self.cut = True
        self._pending.clear()
        self._pending_texts = 0

    def drain(self) -> None:
        """Cut short, and no batch of this run is running: the caller gets None for every group left."""
        self.drained = True
        self._results.put(_DRAINED)

    def next_window(self, now: float) -> tuple[int, int, list[str], tuple[np.ndarray, np.ndarray] | None] | None:
        """(window number, run index of its first text, texts, (flat ids, lengths) if every text
        came pretokenized else None) if one is due and may be cut."""
        while self._pending_texts < self.window_size and not self._input_ended:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if item is _END:
                self._input_ended = True
            else:
                if not self._pending:
                    self._oldest = item[0]
                self._pending.append(item[1])
                self._pending_texts += len(item[1].texts)
        if not self._pending or not (self._pending_texts >= self.window_size or self._input_ended
                                     or now - self._oldest >= STALL_S):
            return None
        with self._slots_lock:
            if not self._free_slots:
                return None
            self._free_slots -= 1
        parts, need = [], min(self.window_size, self._pending_texts)
        while need:
            head = self._pending[0]
            if len(head.texts) <= need:
                parts.append(self._pending.popleft())
            else:
                part, self._pending[0] = head.cut(need)
                parts.append(part)
            need -= len(parts[-1].texts)
        self._pending_texts -= sum(len(p.texts) for p in parts)
        texts = [t for p in parts for t in p.texts] if len(parts) > 1 else parts[0].texts
        tokens = None
        if all(p.ids is not None for p in parts):
            tokens = (np.concatenate([p.ids for p in parts]) if len(parts) > 1 else parts[0].ids,
                      np.concatenate([p.lengths for p in parts]) if len(parts) > 1 else parts[0].lengths)
        cut = (self._windows, self._cut, texts, tokens)
        self._windows += 1
        self._cut += len(texts)
        return cut

    def stall_deadline(self) -> float | None:
        """When the pending texts are due as a partial window (None: nothing to wait for)."""
        with self._slots_lock:
            free = self._free_slots > 0
        if free and self._pending_texts < self.window_size and not self._input_ended and not self._inbox.empty():
            return 0.0                       # texts the feeder did not announce (NOTE: wake-ups): take them now
        return self._oldest + STALL_S if self._pending and free else None

    def window_done(self, number: int, rows: np.ndarray) -> None:
        for released in self._reorder.put(number, rows):
            self._results.put(released)

    @property
    def finished(self) -> bool:
        return self._input_ended and not self._pending and self._reorder.next == self._windows

    def give_up(self, first: int, count: int, error: BaseException) -> bool:
        """Chunks [first, first+count) cannot be encoded: True when the run goes on without them
        (the caller was told through on_failed and their rows are NaN), False when it failed."""
        if self.on_failed is None:
            self.fail(error)
            return False
        self.on_failed(first, count, error)
        return True

    # -- any thread ------------------------------------------------------------------
    def fail(self, error: BaseException) -> None:
        """End the run with `error`, delivered to the caller after the rows already released."""
        if self._error is None:
            self._error = error
            self.stopped = True
            self._results.put(error)

    # -- caller's thread -------------------------------------------------------------
    def results(self, dim: int, check_alive: Callable[[], None],
                on_rows: Callable[[int], None] | None = None) -> Iterator[tuple[Any, np.ndarray | None]]:
        """(key, rows) per group in input order; rows None for a group the stop dropped (NOTE: stop)."""
        rows = _Rows(dim)
        drained = False
        try:
            while True:
                while self._layout and (self._layout[0][1] <= rows.count or drained):
                    key, n = self._layout.popleft()
                    if n <= rows.count:
                        yield key, rows.take(n)
                    else:                            # drained: its rows never come (those here are dropped)
                        rows.take(rows.count)
                        yield key, None
                if self._input_done.is_set() and self._error is None and not self._layout:
                    return
                try:
                    item = self._results.get(timeout=0.25)
                except queue.Empty:
                    check_alive()
                    continue
                if isinstance(item, BaseException):
                    raise item
                if item is _DRAINED:
                    drained = True
                    continue
                if item is not None:
                    rows.add(item)
                    with self._slots_lock:
                        self._free_slots += 1
                    self._wake()
                    if on_rows is not None:
                        on_rows(len(item))
        finally:
            self.stopped = True
            self._wake()


class _Segment:
    """Consecutive texts of one group not yet cut into a window: the texts, and their flat ids and lengths when
    they came pretokenized (the coordinator slices arrays, never a text at a time)."""
    __slots__ = ("texts", "ids", "lengths")

    def __init__(self, texts: list[str], ids: np.ndarray | None, lengths: np.ndarray | None):
        self.texts, self.ids, self.lengths = texts, ids, lengths

    def cut(self, n: int) -> tuple[_Segment, _Segment]:
        """The first n texts, and the rest."""
        if self.ids is None:
            return _Segment(self.texts[:n], None, None), _Segment(self.texts[n:], None, None)
        split = int(self.lengths[:n].sum())
        return (_Segment(self.texts[:n], self.ids[:split], self.lengths[:n]),
                _Segment(self.texts[n:], self.ids[split:], self.lengths[n:]))


class _Rows:
    """Rows of finished windows waiting to be cut into groups."""

    def __init__(self, dim: int):
        self.dim = dim
        self.count = 0
        self._parts: deque[np.ndarray] = deque()

    def add(self, part: np.ndarray) -> None:
        self._parts.append(part)
        self.count += len(part)

    def take(self, n: int) -> np.ndarray:
        out, need = [], n
        while need:
            part = self._parts[0]
            if len(part) <= need:
                out.append(self._parts.popleft())
                need -= len(part)
            else:
                out.append(part[:need])
                self._parts[0] = part[need:]
                need = 0
        self.count -= n
        if len(out) == 1:
            return out[0]
        return np.concatenate(out) if out else np.zeros((0, self.dim), dtype=np.float32)
