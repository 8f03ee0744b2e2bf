"""The Ray engine's stages, as Ray runs them on any node: load tasks, encode actors, writer actors.

Each stage is the local engine's code in another host process: a load task sniffs and plans its
files (it opens them; the driver only stats) and runs each file's whole journey through loader
pools of its own (`load_streamed`: per-file timeouts and crash isolation as in the local engine), an
encode actor runs an EncodePool (its worker process on the actor's GPU, or the CPU) and a writer
actor upserts with its own store client. Only the encode actor touches ray (its node id).

What travels between them: a load task (a Ray generator) turns each file into `Part`s (up to
GROUP_CHUNKS chunks of one file with their token ids; a file without chunks is one empty part
carrying its outcome) and yields consecutive parts as packs of about PACK_CHUNKS chunks, as they
fill; the encoder returns the pack with each part's vectors, or the error that fails its file; the
writer answers one `PartAck` per part, which the driver counts per file.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import tempfile
import time
from collections import Counter, deque
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any, Iterable, Iterator

import numpy as np

from ingest import load, ocr, remote
from ingest.chunk import ChunkSpec
from ingest.encode import chunk_failure_text, file_parts, make_pool
from ingest.files import FileRef, Finished
from ingest.load import Job, import_plugins, init_loader_process
from ingest.loaders import LoaderOptions, OcrOptions
from ingest.model_ref import ModelRef
from ingest.store import Endpoint, StoreBase
from ingest.store.factory import store_at
from ingest.store.manifest import Entry
from ingest.store.rows import Rows
from ingest.timeline import Meter, shares
from ingest.workers.encode import Pretokenized
from ingest.workers.failure import Failure
from ingest.workers.pool import Pools
from ingest.workers.spawn import pid_alive
from ingest.store.writers import Ack, Batch, Batcher, Refused, Segment, Unreachable, upsert

RANGES_AHEAD = 2             # a big file's ranges loading ahead of the one its load task waits for
PACK_CHUNKS = 512            # chunks per pack, one encode call each (many small files share a pack)


@dataclass(frozen=True, eq=False)
class Part:
    """Chunks [start, start + len(chunks)) of a file, its part `index`. Only its last part knows the file's
    parts (`count`; 0 on the others) and outcome (`file`; an earlier part's is its piece's)."""
    file: Finished                                   # without its pages (they are in the parts)
    index: int
    count: int
    start: int
    chunks: Rows
    tokens: Pretokenized | None
    vectors: np.ndarray | None = None
    error: str | None = None                         # its chunks could not be encoded: the file fails
    encoder: str = ""                                # the Ray node that encoded it
    encode_s: float = 0.0                            # its share of the encode pool's busy seconds


@dataclass(frozen=True)
class PartAck:
    """The writer's answer for one part (`index`, `count` and `file` as in its Part): its rows the store
    acknowledged (also when its file fails: the driver then removes them), and the error that fails the
    file, if any."""
    file: Finished
    index: int
    count: int
    rows: int
    error: str | None = None
    unreachable: bool = False                        # the store did not answer: the run stops
    encoder: str = ""
    encode_s: float = 0.0                            # its share of the seconds its batches took to encode
    write_s: float = 0.0                             # and to upsert


@dataclass(frozen=True)
class LoadSettings:
    """What a load task needs: the loader and OCR options, the chunking, the pools' sizes and limits."""
    options: LoaderOptions
    ocr_options: OcrOptions
    spec: ChunkSpec
    plugins: tuple[str, ...]
    memory_mb: int
    timeouts: tuple[tuple[str, float], ...]          # (pool, seconds per task)
    manifest_settings: str                           # what the manifest records a file's settings as
    max_file_mb: float


def packs(parts: Iterable[Part]) -> Iterator[tuple[Part, ...]]:
    """Consecutive parts in packs of about PACK_CHUNKS chunks, each yielded once full (the last when they end)."""
    pack: list[Part] = []
    size = 0
    for part in parts:
        if pack and size + len(part.chunks) > PACK_CHUNKS:
            yield tuple(pack)
            pack, size = [], 0
        pack.append(part)
        size += len(part.chunks)
    if pack:
        yield tuple(pack)


# -- load tasks ------------------------------------------------------------------------------
_pools: dict[tuple[LoadSettings, bool], Pools] = {}        # (settings, whether its files are fetched)
_locks: list[int] = []                                        # this process's fetch dir, locked while it lives
_FETCH_DIR = re.compile(re.escape(remote.FETCH_PREFIX) + r"([0-9]+)-[a-z0-9_]+")   # a Ray worker's own


def _fetch_dir() -> None:
    """Where this process's loader pools fetch objects (ingest/remote.py NOTE): the run's own if this process
    inherited it (a Ray the driver started: the driver removes it), else its own, locked while it lives."""
    inherited = os.environ.get(remote.FETCH_ENV)
    if inherited and os.path.isdir(inherited):
        return
    fd = os.open(remote.private_fetch_dir(), os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    _locks.append(fd)


def _sweep_fetch_dirs() -> None:
    """Remove the fetch dirs of Ray workers that died without removing theirs (killed): this user's, named by a
    pid no process has, and not locked (a live owner in another pid namespace holds its lock)."""
    tmp = tempfile.gettempdir()
    for name in os.listdir(tmp):
        match = _FETCH_DIR.fullmatch(name)
        if match is None or pid_alive(int(match[1])):
            continue
        path = os.path.join(tmp, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            if os.fstat(fd).st_uid == os.getuid():
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            pass                                     # locked: its owner lives
        finally:
            os.close(fd)


def load_files(files: tuple[tuple[FileRef, Entry | None], ...], settings: LoadSettings) -> Iterator[tuple[Part, ...]]:
    """A Ray generator task: sniff, plan, load, OCR and chunk each file (with its manifest entry) in loader
    pools that live as long as this Ray worker process (one process per pool, started on first use);
    packs of parts as they fill."""
    _sweep_fetch_dirs()
    fetching = any(remote.is_url(ref.path) for ref, _ in files)
    pools = _pools.get((settings, fetching))
    if pools is None:
        import_plugins(settings.plugins)             # formats resolve to their pools here too
        if fetching:
            _fetch_dir()                             # before its pools' workers start: they inherit it
        timeouts = dict(settings.timeouts)
        pools = _pools[settings, fetching] = Pools({name: 1 for name in timeouts}, timeouts, init_loader_process,
                                                   (settings.plugins, settings.memory_mb))
    planned = [load.plan(ref, None, entry, settings.manifest_settings, settings.max_file_mb) for ref, entry in files]
    # Every file's first load is queued at once, so the pools' workers go from file to file with no round
    # trip between (a pool's timeout counts from when its worker takes a task: workers/pool.py NOTE).
    firsts = [None if isinstance(job, Finished) else load.submit(pools, job.ref, settings.options, settings.spec,
                                                                 job.known_hash) for job in planned]
    yield from packs(part for (_, entry), job, first in zip(files, planned, firsts)
                     for part in _parts(_pieces(pools, job, entry, first, settings)))


def _parts(pieces: Iterator[Finished]) -> Iterator[Part]:
    """A file's pieces (its parts as they are ready, the last with its outcome) as Parts of up to GROUP_CHUNKS
    chunks, numbered; the last Part carries the file's count of Parts."""
    held, index = None, 0
    for piece in pieces:
        meta = replace(piece, pages=())
        for start, chunks, tokens, _, _ in file_parts(piece):
            if held is not None:
                yield held
            held = Part(meta, index, 0, start, chunks, tokens if len(chunks) else None)
            index += 1
    yield replace(held, count=index)


def _pieces(pools: Pools, job: Job | Finished, entry: Entry | None, first: Future | None,
            settings: LoadSettings) -> Iterator[Finished]:
    if isinstance(job, Finished):                    # skipped or failed by its sniff
        yield load.drop_if_skipped(job, {job.ref.source: entry} if entry else {})
        return
    try:
        yield from load_streamed(pools, job, settings.options, settings.ocr_options, settings.spec,
                                 dict(settings.timeouts)["ocr"], first)
    finally:
        remote.discard(job.ref.path)


def load_streamed(pools: Pools, job: load.Job, options: LoaderOptions, ocr_options: OcrOptions, spec: ChunkSpec,
                  ocr_timeout_s: float, submitted: Future | None = None) -> Iterator[Finished]:
    """Load, OCR and chunk one file in `pools` (whose OCR pages have `ocr_timeout_s`) in the caller's thread (the
    Ray engine's load tasks): its pieces in order as they are ready (`load.Pages.ready`; a big file's ranges,
    RANGES_AHEAD loading at a time, so a 1 GB file is never held whole), the last with the file's outcome;
    `submitted`: its first load, if already queued. Every wait is bounded by the pools' time limits."""
    submitted = submitted or load.submit(pools, job.ref, options, spec, job.known_hash)
    ref, first = job.ref, submitted.result()
    state = load.after_load(ref, first, job.old_hash, job.known_chunks)
    if isinstance(state, Finished):
        yield state
        return
    loading: deque[tuple[int, load.Loaded | Future]] = deque([(0, first)])
    while loading:
        while state.todo and len(loading) <= RANGES_AHEAD:
            loading.append(load.submit_range(pools, state, options, spec))
        part, result = loading.popleft()
        result = result if isinstance(result, (load.Loaded, Failure)) else result.result()
        if part:
            state.add_part(part, result)
        if isinstance(result, load.Loaded):
            for page, future in ocr.fan_out(pools, ref.path, result.ocr_pages, ocr_options, spec, state.doc,
                                            ocr_timeout_s):
                state.add_ocr(part, page, future.result())
        yield from state.ready()
        if state.ended:
            return
    yield state.fail("its parts did not all load")        # not expected: every part's result was taken


# -- encode actors ---------------------------------------------------------------------------
class EncodeParts:
    """A Ray actor: an EncodePool (the model loaded once, in its worker process) on the actor's device."""

    def __init__(self, model: ModelRef, settings: dict[str, Any]):
        import ray                                   # this runs in a Ray actor

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        self.node = ray.get_runtime_context().get_node_id()
        self.pool = make_pool(model, settings)
        self.meter = Meter(None, "encode")

    def encode(self, parts: tuple[Part, ...]) -> tuple[Part, ...]:
        _actor_fault(parts)
        groups = [(p, p.tokens) for p in parts if p.chunks]
        failures: list[tuple[int, int, BaseException]] = []         # appended by the pool's thread
        done: dict[int, Part] = {}
        offset = 0
        for p, vectors in self.pool.encode_groups(groups, on_failed=lambda *f: failures.append(f)):
            error = chunk_failure_text(failures, offset, p.start, len(p.chunks)) \
                if failures and np.isnan(vectors).any() else None
            offset += len(p.chunks)
            stats = self.pool.stats
            done[id(p)] = replace(p, tokens=None, vectors=None if error else vectors, error=error, encoder=self.node,
                                  encode_s=self.meter.charge(stats["encode_s"], stats["chunks"], len(p.chunks)))
        return tuple(done.get(id(p), p) for p in parts)

    def __del__(self) -> None:
        """The actor's object goes with the run: stop the encode worker with it."""
        pool = getattr(self, "pool", None)
        if pool is not None:
            pool.close()


def _actor_fault(parts: tuple[Part, ...]) -> None:
    """Test hook, off unless INGEST_FAULT (workers/encode/_worker.py's rules, which ignore these actions) holds a
    rule {"match": M, "action": "exit-actor" or "hang-actor"}: a pack with M in a chunk ends or hangs this actor."""
    value = os.environ.get("INGEST_FAULT")
    rules = json.loads(value) if value else []
    for rule in [rules] if isinstance(rules, dict) else rules:
        if rule.get("action") in ("exit-actor", "hang-actor") and any(rule["match"] in c.text
                                                                       for p in parts for c in p.chunks):
            if rule["action"] == "exit-actor":
                os._exit(3)
            while True:
                time.sleep(3600)


# -- writer actors ---------------------------------------------------------------------------
class WriteParts:
    """A Ray actor: upserts parts' rows in batches of `batch_rows` with a store client of its own;
    a batch the store refuses is retried file by file, so a refusal fails only its own file."""

    def __init__(self, endpoint: Endpoint, batch_rows: int):
        self.endpoint, self.batch_rows = endpoint, batch_rows
        self.store: StoreBase | None = None

    def write(self, parts: tuple[Part, ...]) -> tuple[PartAck, ...]:
        self.store = self.store or store_at(self.endpoint)
        errors: dict[str, tuple[str, bool]] = {}            # source -> (error, unreachable)
        stored: dict[str, set[int]] = {}                    # source -> chunks in acknowledged batches
        spent: dict[str, float] = {}                        # source -> seconds its rows' upserts took
        sent = [p for p in parts if p.vectors is not None]
        sizes: Counter[str] = Counter()                     # source -> its chunks sent
        for p in sent:
            sizes[p.file.ref.source] += len(p.chunks)
        for rows in self._batches(sent):
            for retry in self._answered(rows, errors, stored, spent):
                self._answered(retry, errors, stored, spent)
        acks = []
        for p in parts:
            source = p.file.ref.source
            error, unreachable = errors.get(source, (p.error, False))
            mine = stored.get(source, set()).intersection(range(p.start, p.start + len(p.chunks)))
            write_s = spent.get(source, 0.0) * len(p.chunks) / sizes[source] if sizes[source] else 0.0
            acks.append(PartAck(p.file, p.index, p.count, len(mine), error, unreachable, p.encoder, p.encode_s, write_s))
        return tuple(acks)

    def _batches(self, parts: list[Part]) -> list[Batch]:
        batcher, batches = Batcher(self.batch_rows), []
        for p in parts:
            ref = p.file.ref
            batches += batcher.add(Segment(ref.source, ref.fmt, ref.file_hash, p.start, p.chunks, p.vectors))
        rest = batcher.rest()
        return batches + ([rest] if rest is not None else [])

    def _answered(self, batch: Batch, errors: dict[str, tuple[str, bool]], stored: dict[str, set[int]],
                  spent: dict[str, float]) -> list[Batch]:
        """Upsert `batch`; note the chunks stored, its files' errors and their rows' share of its seconds; the
        per-file batches to retry after a refusal."""
        started = time.perf_counter()
        answer: Ack | Refused | Unreachable = upsert(self.store, batch)
        seconds = shares(time.perf_counter() - started, [len(s.chunks) for s in batch.segments])
        for s, share in zip(batch.segments, seconds):
            spent[s.source] = spent.get(s.source, 0.0) + share
        if isinstance(answer, Ack):
            for s in batch.segments:
                stored.setdefault(s.source, set()).update(range(s.start, s.start + len(s.chunks)))
            return []
        if isinstance(answer, Refused) and len(batch.sources) > 1:
            return batch.by_source()
        for source in batch.sources:
            errors.setdefault(source, (answer.error, isinstance(answer, Unreachable)))
        return []
