"""The encode step, in its own thread: finished files in file order -> EncodePool -> the writer.

Files arrive on `feed` in file order (None ends it). Files without chunks go straight to the
writer; the rest go through the encode pool with the token ids the chunker already made
(Pretokenized: no tokenizer process runs), and the pool returns groups in input order, so rows
are written in file order, then chunk order. The pool is started in the background when the
first file is sent to a loader, so its start-up overlaps loading, and never on a rerun that
has nothing to encode. A file is encoded in groups of GROUP_CHUNKS, so memory stays flat; a big
file comes in parts (ingest/files.py), and once every group of a part but the file's last is with
the writer, `on_part` tells the dispatcher (the writer's own `on_accepted` tells of the last). The
pool's busy seconds go on the run's timeline, and each file's share into its outcome's times.
Each group is planned first (ingest/reuse.py NOTE): chunks whose vector was made before (this run, the
store's rows of a changed file, the local cache) skip the pool, equal chunks go to it once, and a file
none of whose chunks need the encoder never waits for it; its outcome counts chunks encoded and reused.

NOTE (merged groups): whole files of fewer than GROUP_CHUNKS chunks that follow each other on `feed` go to
the pool as one group (`Merged`), up to GROUP_CHUNKS chunks: those already there, never waiting for the
next. Planning, the pool's per-group work and the vectors' assembly are then paid once a group, not once
a file (~16 chunks a small file); the writer still gets each file alone, in order. A file whose earlier
version's rows reuse reads from the store (a changed file) goes alone, and so does a big file's part.

NOTE (stopping): once the run stops (`stopping`), every file that comes next passes to the writer as
failed "interrupted", and so does every file the pool took but had not encoded: the pool finishes
at most the batch a worker is running and drops the windows it read ahead (up to
max_chunks_in_flight chunks: 25-50 s of torch on a busy 2-core CPU), and a file with any chunk
not encoded fails whole (rows of its earlier parts already sent are removed: write.py NOTE). A group
whose vectors are all reused (ingest/reuse.py) counts as not encoded once the run stops. Files
whose rows all came back are written. A file with chunks also waits in `_groups` until the pool's
first worker is up, and that wait ends when the run stops, so a Ctrl-C while the model is still
loading ends the run at once instead of after the load. close() never waits for a pool still being
made: it is closed as soon as it exists.
"""
from __future__ import annotations

import queue
import threading
from concurrent.futures import Future, TimeoutError as FutureTimeout
from dataclasses import dataclass, replace
from itertools import chain
from typing import TYPE_CHECKING, Any, Callable, Iterator

import numpy as np

from ingest.files import INTERRUPTED, Finished, evolve, token_ids
from ingest.model_ref import ModelRef
from ingest.reuse import Plan, Reuse, fingerprint
from ingest.store.rows import Rows
from ingest.timeline import Meter, Timeline
from ingest.workers.encode import GPU_BATCH, GPU_TOKENS, WINDOW_MAX, WINDOW_MIN, Pretokenized
from ingest.write import Writer

if TYPE_CHECKING:
    from ingest.encode_pool import EncodePool

GROUP_CHUNKS = 256
WINDOWS_AHEAD = 3       # "auto" [run] max_chunks_in_flight: encode windows' worth of chunks loaded ahead


@dataclass(frozen=True, eq=False)
class Part:
    """Chunks [start, start + len(chunks)) of a file: the key of one group in the encode pool."""
    file: Finished
    start: int
    chunks: Rows
    end: bool                                 # the last group of `file` (a part of a big file, or all of a file)

    @property
    def last(self) -> bool:                   # the file's final group
        return self.end and self.file.last


@dataclass(frozen=True, eq=False)
class Merged:
    """Whole small files in one group (NOTE: merged groups): each member's Part and the span of its rows in the
    group. What Reuse.plan reads of a part: `file` (the first member: no store rows to read), `chunks`, `last`."""
    members: tuple[tuple[Part, int, int], ...]
    chunks: Rows
    file: Finished
    last: bool = False                        # no member's previous rows are held by Reuse (none were read)


_HELD = object()                              # _groups: no file held back from the last merge


class EncodeStage:
    def __init__(self, model: ModelRef, settings: dict[str, Any], writer: Writer,
                 on_error: Callable[[BaseException], None], stopping: threading.Event,
                 on_part: Callable[[Finished], None] = lambda part: None, timeline: Timeline | None = None,
                 reuse: Reuse | None = None):
        self.model, self.settings, self.writer = model, settings, writer
        self.reuse = reuse or Reuse(fingerprint(model, settings["backend"], settings), model.dim, None, None)
        if self.reuse.cache is not None:        # the writer processes fill the cache (ingest/write.py NOTE: cache)
            self.reuse.by_writer = True
            writer.cache_into(self.reuse.cache)
        self.on_error, self.stopping, self.on_part = on_error, stopping, on_part
        self.feed: queue.SimpleQueue[Finished | None] = queue.SimpleQueue()
        self.closed = threading.Event()
        self.stats: dict[str, float] = {}
        self._meter = Meter(timeline or Timeline(), "encode")
        self._encode_s: dict[int, float] = {}    # file seq -> its groups' seconds so far
        self._counts: dict[int, tuple[int, int]] = {}    # file seq -> (chunks encoded, reused) so far
        self._pool: Future | None = None     # the EncodePool, once made
        self._up: Future | None = None       # done once its first worker is up (or it cannot start)
        self._window: int | None = None      # the pool's, once its first worker is up

    def start_pool(self) -> None:
        """Start the EncodePool in the background (idempotent)."""
        if self._pool is None:
            self._pool, self._up = start_pool(self.model, self.settings)

    def chunks_ahead(self, setting: int | str) -> int:
        """[run] max_chunks_in_flight: chunks loaded and not yet written. "auto" is WINDOWS_AHEAD encode
        windows (the CPU's until the pool's first worker is up), so a sorted window waits for the encoder
        while the next is loaded: with fewer, the window being encoded holds every file in flight and
        the encoder idles while their successors load."""
        if setting != "auto":
            return int(setting)
        if self._window is None and self._pool is not None and self._pool.done() and not self._pool.exception():
            self._window = self._pool.result().window_size
        return WINDOWS_AHEAD * (self._window or WINDOW_MIN)

    @staticmethod
    def most_chunks_ahead(setting: int | str) -> int:
        """The largest chunks_ahead(setting) can be."""
        return int(setting) if setting != "auto" else WINDOWS_AHEAD * WINDOW_MAX

    def run(self) -> None:
        """Thread target. Any error reaches the dispatcher through on_error."""
        empty = np.zeros((0, 0), dtype=np.float32)
        try:
            groups = self._groups()
            for plan in groups:
                if plan.encoded:
                    pool = self._pool.result()
                    failures: list[tuple[int, int, BaseException]] = []     # appended by the pool's thread
                    offset = 0
                    for pl, encoded in pool.encode_groups(((g, g.tokens) for g in chain([plan], groups)),
                                                          on_failed=lambda *f: failures.append(f), stop=self.stopping):
                        vectors = self.reuse.assemble(pl, encoded)
                        if vectors is None or self._stopped(pl):    # dropped by the stop (NOTE: stopping)
                            offset += pl.encoded
                            for p, _, _ in members(pl):
                                self._drop(p)
                            continue
                        stats = pool.stats
                        self._deliver(pl, vectors, self._meter.charge(stats["encode_s"], stats["chunks"], pl.encoded),
                                      failures, offset)
                        offset += pl.encoded
                    self.stats = dict(pool.stats)
                    break
                if self._stopped(plan):
                    for p, _, _ in members(plan):
                        self._drop(p)
                    continue
                self._deliver(plan, self.reuse.assemble(plan, empty) if plan.keys else empty, 0.0, [], 0)
            self.writer.flush()
        except BaseException as exc:
            self.on_error(exc)

    def _deliver(self, plan: Plan, vectors: np.ndarray, seconds: float, failures: list[tuple[int, int, BaseException]],
                 offset: int) -> None:
        """Each file (or part) of a planned group to the writer with its vectors; one with a chunk that could not be
        encoded (a NaN row) fails, named by `failures` (the encode call's; the group's misses from `offset` on)."""
        misses, spans = np.asarray(plan.misses, dtype=np.int64), members(plan)     # per group, not per file:
        cuts = np.searchsorted(misses, [x for _, lo, hi in spans for x in (lo, hi)]).tolist()
        nan = np.isnan(vectors).any(axis=1) if len(vectors) else None
        failed = nan is not None and bool(nan.any())
        for (p, lo, hi), first, stop in zip(spans, cuts[::2], cuts[1::2]):
            mine = vectors[lo:hi]
            if failed and nan[lo:hi].any():            # its chunks (or the equal ones it waited for) failed
                sent = (misses[first:stop] - lo).tolist()
                self.writer.fail(p.file, chunk_failure_text(failures, offset + first, p.start, sent))
            encoded = stop - first
            share = seconds * encoded / plan.encoded if plan.encoded else 0.0
            self._add(p, mine, share, (encoded, hi - lo - encoded) if hi > lo else None, notify=False,
                      keys=plan.cache_keys[16 * lo:16 * hi])
        self.writer.notify()                            # the group's files accepted, at once

    def _stopped(self, plan: Plan) -> bool:
        """A group of chunks none of which the pool encoded, once the run stops: dropped like the pool's (NOTE:
        stopping), or a file whose vectors are all reused would go on being written after the stop."""
        return bool(plan.keys) and not plan.encoded and self.stopping.is_set()

    def _drop(self, part: Part) -> None:
        """The group's file fails "interrupted" (rows of its earlier groups removed: write.py NOTE)."""
        self.writer.fail(part.file, INTERRUPTED)
        self._add(replace(part, file=interrupted(part.file), chunks=Rows()), np.zeros((0, 0), dtype=np.float32))

    def _add(self, part: Part, vectors: np.ndarray, seconds: float = 0.0,
             counts: tuple[int, int] | None = None, notify: bool = True, keys: bytes = b"") -> None:
        """Hand a group to the writer (`keys`: its rows' cache keys); the file's last carries the seconds its
        groups took to encode, and how many of its chunks were encoded and reused (`counts`: this group's)."""
        file, seq = part.file, part.file.ref.seq
        self._encode_s[seq] = self._encode_s.get(seq, 0.0) + seconds
        encoded, reused = self._counts.get(seq, (0, 0))
        if counts is not None and part.chunks:
            self._counts[seq] = encoded, reused = encoded + counts[0], reused + counts[1]
        if part.last:
            self._counts.pop(seq, None)
            outcome = evolve(file.outcome, encoded=encoded, reused=reused)
            file = evolve(file, outcome=outcome.plus(encode=self._encode_s.pop(seq)))
        self.writer.add(file, part.start, part.chunks, vectors, part.last, notify, keys)
        if part.end and not part.file.last:
            self.on_part(part.file)

    @property
    def workers(self) -> int:
        """The encode pool's workers (0 if it was never made)."""
        made = self._pool is not None and self._pool.done() and not self._pool.exception()
        return len(self._pool.result().worker_pids) if made else 0

    def close(self) -> None:
        self.closed.set()
        if self._pool is not None:              # now if made, else as soon as it is
            self._pool.add_done_callback(lambda made: made.exception() or made.result().close())

    def _wait_up(self) -> bool:
        """Wait until the pool's first worker is up: True; False if the run stops or closes first. A pool
        that cannot start raises its error."""
        self.start_pool()
        while not (self.stopping.is_set() or self.closed.is_set()):
            try:
                return self._up.result(timeout=0.25)
            except FutureTimeout:
                pass
        return False

    def _groups(self) -> Iterator[Plan]:
        """A Plan (ingest/reuse.py: what is reused, what goes to the encoder) for each group of each file, in file
        order; a file with chunks to encode first waits for the pool's first worker. The get times out to
        notice a closed run."""
        held: Any = _HELD
        while not self.closed.is_set():
            if held is not _HELD:
                file, held = held, _HELD
            else:
                try:
                    file = self.feed.get(timeout=0.5)
                except queue.Empty:
                    continue
            if file is None:
                return
            file = self._arrived(file)
            batch = [file]
            if self._mergeable(file):           # NOTE: merged groups
                chunks = file.chunk_count
                while chunks < GROUP_CHUNKS:
                    try:
                        nxt = self.feed.get_nowait()
                    except queue.Empty:
                        break
                    nxt = nxt if nxt is None else self._arrived(nxt)
                    if nxt is None or not self._mergeable(nxt) or chunks + nxt.chunk_count > GROUP_CHUNKS:
                        held = nxt
                        break
                    batch.append(nxt)
                    chunks += nxt.chunk_count
            if len(batch) == 1:
                yield from self._file_plans(file)
                continue
            plan = self.reuse.plan(*merged_group(batch))
            if plan.encoded and not self._wait_up():
                self.reuse.cancel(plan)
                for f in batch:
                    yield from self._file_plans(interrupted(f))
                continue
            yield plan

    def _arrived(self, file: Finished) -> Finished:
        """A file off the feed: failed "interrupted" if it comes once the run stops (NOTE: stopping)."""
        return interrupted(file) if file.outcome.status == "ingested" and self.stopping.is_set() else file

    def _mergeable(self, file: Finished) -> bool:
        """A whole file of one group whose previous rows reuse does not read from the store (NOTE: merged groups)."""
        return (file.outcome.status == "ingested" and file.last and not file.start
                and 0 < file.chunk_count < GROUP_CHUNKS and not (file.old_hash and self.reuse.store is not None))

    def _file_plans(self, file: Finished) -> Iterator[Plan]:
        """The plans of one file's (or part's) groups; a file with chunks to encode first waits for the pool."""
        plans = [self.reuse.plan(Part(file, start, chunks, end), tokens, keys)
                 for start, chunks, tokens, keys, end in file_parts(file)]
        if file.outcome.status == "ingested" and any(p.encoded for p in plans) and not self._wait_up():
            for p in plans:
                self.reuse.cancel(p)
            file = interrupted(file)
            plans = [self.reuse.plan(Part(file, start, chunks, end), tokens, keys)
                     for start, chunks, tokens, keys, end in file_parts(file)]
        yield from plans


def interrupted(file: Finished) -> Finished:
    """The file (or part) failed "interrupted" by a stop, without its chunks."""
    return replace(file, outcome=replace(file.outcome, status="failed", error=INTERRUPTED), pages=(), record=False)


def members(plan: Plan) -> tuple[tuple[Part, int, int], ...]:
    """A planned group's files (or part) with the span of their rows in it."""
    part = plan.part
    return part.members if isinstance(part, Merged) else ((part, 0, len(plan.keys)),)


def merged_group(files: list[Finished]) -> tuple[Merged, Pretokenized, list[bytes] | None]:
    """Whole small files as one group (NOTE: merged groups): (the Merged part, its texts and ids, its keys if
    the loaders made every file's)."""
    members, blocks, n = [], [], 0
    for f in files:
        items = f.chunk_texts()
        members.append((Part(f, 0, items, True), n, n + len(items)))
        blocks.append(items)
        n += len(items)
    rows = Rows.join(blocks)
    tokens = Pretokenized(list(rows.texts), *token_ids(p for f in files for p in f.pages))     # joined once
    return Merged(tuple(members), rows, files[0]), tokens, loader_keys(files, n)


def loader_keys(files: list[Finished], chunks: int) -> list[bytes] | None:
    """The reuse keys the loaders made for the files' `chunks` chunks, in order (None: not made for every one)."""
    blob = b"".join(p.keys for f in files for p in f.pages)
    return [blob[i:i + 16] for i in range(0, len(blob), 16)] if len(blob) == 16 * chunks else None


def file_parts(file: Finished) -> Iterator[tuple[int, Rows, Pretokenized, list[bytes] | None, bool]]:
    """(start, chunks, their texts and ids, their keys if the loader made them, end) for each group of up to
    GROUP_CHUNKS chunks of the file (or of the part of it: `start` counts from the file's first chunk), `end` on
    its last group; a file's last part without chunks is one empty group, another part none."""
    items = file.chunk_texts()
    if not items:
        if file.last:
            yield file.start, Rows(), Pretokenized([], np.zeros(0, np.int32), np.zeros(0, np.int32)), [], True
        return
    ids, lengths = file.token_ids()
    ends = np.cumsum(lengths)
    keys = loader_keys([file], len(items))
    for start in range(0, len(items), GROUP_CHUNKS):
        chunks = items[start:start + GROUP_CHUNKS]
        stop = start + len(chunks)
        first = int(ends[start - 1]) if start else 0
        tokens = Pretokenized(list(chunks.texts), ids[first:int(ends[stop - 1])], lengths[start:stop])
        yield file.start + start, chunks, tokens, keys[start:stop] if keys is not None else None, stop >= len(items)


def start_pool(model: ModelRef, settings: dict[str, Any]) -> tuple[Future, Future]:
    """(a Future of the EncodePool, a Future done once its first worker is up, or failed with why it cannot
    start): the pool is made on a thread of its own, so the run goes on meanwhile."""
    made, up = Future(), Future()

    def make() -> None:
        try:
            pool = make_pool(model, settings)
        except BaseException as exc:
            made.set_exception(exc)
            up.set_exception(exc)
            return
        made.set_result(pool)
        try:
            pool.dim                        # waits for the first worker; raises if it cannot start
            up.set_result(True)
        except BaseException as exc:
            up.set_exception(exc)
    threading.Thread(target=make, name="ingest-encoder-start", daemon=True).start()
    return made, up


def make_pool(model: ModelRef, settings: dict[str, Any]) -> EncodePool:
    """The EncodePool for a run's chunks, from the [model] settings (with the collection's backend)."""
    from ingest.encode_pool import EncodePool

    m = settings
    gpu = m["backend"] in ("null", "stub")      # they stand for a GPU host: its batches and windows when "auto"
    return EncodePool(model, devices=m["devices"], batch_size=_auto(m["batch_size"]) or (GPU_BATCH if gpu else None),
                      max_batch_tokens=_auto(m["max_batch_tokens"]) or (GPU_TOKENS if gpu else None),
                      dtype=_auto(m["dtype"]),
                      tokenizer_workers=_auto(m["tokenizer_workers"]), timeout_s=m["timeout_s"],
                      max_attempts=m["max_attempts"], backend=m["backend"], compile=m["compile"], pretokenized=True,
                      batch_shapes=m["batch_shapes"], warm_up=m["warm_up"])


def _auto(value: Any) -> Any:
    """A config value, None for "auto" (the pool decides by device)."""
    return None if value == "auto" else value


def chunk_failure_text(failures: list[tuple[int, int, BaseException]], offset: int, start: int,
                       sent: int | list[int]) -> str:
    """The report's line for a group of a file's chunks from `start` on, whose chunks `sent` (indexes in the
    group) are chunks [offset, offset+len(sent)) of the encode call, and include chunks that could not be
    encoded (`failures`: the call's on_failed), or took the vector of an equal chunk that could not. An int
    `sent`: the group's first `sent` chunks."""
    sent = list(range(sent)) if isinstance(sent, int) else sent
    n = len(sent)
    for first, count, error in failures:
        if first < offset + n and offset < first + count:
            failure = getattr(error, "failure", None)
            what = f"{failure.where} (pid {failure.pid}): {failure.error}" if failure else str(error)
            index = start + sent[max(first - offset, 0)]
            return f"chunk {index} could not be encoded after every retry: {' '.join(what.split())[:300]}"
    return "a chunk could not be encoded after every retry"
