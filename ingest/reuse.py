"""Reuse of embeddings: a chunk whose embedded text was embedded before, with the same settings, takes that
vector instead of going to the encoder.

NOTE (keys): a chunk's key is a 16-byte BLAKE2b of the token ids the encoder would get (the context
line, a newline and the chunk, as the chunker made them), keyed by the embedding settings
(`fingerprint`: model, backend, dtype, max_seq_length). Equal keys are equal encoder inputs under
equal settings, so their vectors are the same vector.

Where a vector comes from, in order (`Reuse.plan`, one group of a file's chunks at a time):
1. this run: the vectors of the last MEMO_ROWS / 2 to MEMO_ROWS distinct keys (a key found is the newest
   again; once full, the older half is let go at once), and keys an earlier group sent to the encoder and
   that are still on their way (the group waits for them: groups come back in order);
2. the store: the rows of the changed file's source (any version still there: the last good copy, or
   the rows a crashed run wrote) whose search_text and element equal the chunk's. The same source, title,
   headings, text and element make the same encoder input under the collection's chunking settings, which
   the collection enforces. Only when the collection's recorded fingerprint (manifest meta "embedding")
   is this run's: a collection that ever held vectors of other settings (dtype is not refused as a
   change) reuses nothing from the store until `--reembed`; never with the null backend (no vector worth
   reading). Read in a few calls a run, not one a file (a Milvus Lite query scans the whole collection):
   the dispatcher tells `expect` of each changed file it sends to load, and the first file whose rows are
   missing reads them with those of every changed file expected and not read yet (up to READ_SOURCES, and
   only files in flight); a file's rows are let go once its last group is planned;
3. the local cache (`ingest.vector_cache`), when on; what the encoder made and what the store gave go
   into it: with `by_writer` (a run's), the group's `cache_keys` go with its rows and the writer processes
   cache the rows they store (ingest/write.py NOTE: cache); else here;
4. else the encoder, once per distinct key (later equal chunks wait for it).
`--reembed` of an existing collection reuses nothing from the store or the cache; the null backend
(no model) has no cache. The store is never changed here: the previous version stays whole until the
new one is committed (ingest/write.py NOTE).
"""
from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from itertools import islice, repeat
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ingest.backends import cache_dir, has_nvidia_gpu
from ingest.chunk import chunk_keys
from ingest.model_ref import ModelRef
from ingest.store.base import StoreBase, StoreError
from ingest.store.rows import search_text
from ingest.store.uri import kind
from ingest.store.writers import NO_KEY
from ingest.vector_cache import VectorCache
from ingest.workers.encode import Pretokenized

if TYPE_CHECKING:
    from ingest.store.collection import Collection

READ_SOURCES = 1024          # changed files whose previous rows are read in one store call
MEMO_ROWS = 32768           # vectors of distinct keys this run keeps for later chunks (<= ~50 MB at dim 384)
META = "embedding"          # manifest meta: the fingerprint of every vector in the collection ("mixed": not one)
MIXED = "mixed"


def fingerprint(model: ModelRef, backend: str, settings: dict[str, Any]) -> str:
    """What a vector depends on besides its token ids: model, backend, dtype (as "auto" resolves it) and
    max_seq_length, as JSON."""
    dtype = settings["dtype"]
    if dtype == "auto":
        devices = [settings["devices"]] if isinstance(settings["devices"], str) else list(settings["devices"])
        cuda = [str(d).startswith("cuda") or (d == "auto" and has_nvidia_gpu()) for d in devices]
        dtype = "float32" if backend != "torch" or not any(cuda) else "float16" if all(cuda) else "mixed"
    return json.dumps({"model": model.name, "backend": backend, "dtype": dtype,
                       "max_seq_length": model.max_seq_length}, sort_keys=True)


@dataclass(eq=False)
class Plan:
    """One group of a file's chunks: which take a vector found already, which go to the encoder, which wait
    for an equal chunk an earlier group (or this one) sends."""
    part: Any                                   # the encode stage's Part
    keys: list[bytes]
    found: dict[int, np.ndarray] = field(default_factory=dict)
    misses: list[int] = field(default_factory=list)
    waits: list[int] = field(default_factory=list)
    tokens: Pretokenized | None = None          # the misses' texts and ids, for the encoder
    to_cache: list[int] = field(default_factory=list)     # found in the store: worth caching too
    cache_keys: bytes = b""                     # by_writer: 16 bytes a chunk, its key or NO_KEY (not cached)

    @property
    def encoded(self) -> int:
        return len(self.misses)

    @property
    def reused(self) -> int:
        return len(self.found) + len(self.waits)


class Reuse:
    """A run's reuse of vectors (NOTE). `plan` and `assemble` may run on two threads (the encode pool reads
    the groups on its own); groups are assembled in the order they were planned."""

    def __init__(self, fp: str, dim: int, store: StoreBase | None, cache: VectorCache | None):
        self.fp, self.dim, self.store, self.cache = fp, dim, store, cache
        self._secret = hashlib.blake2b(fp.encode(), digest_size=32).digest()
        self._lock = threading.Lock()
        self._memo: dict[bytes, np.ndarray] = {}    # oldest first (NOTE, 1)
        self._inflight: dict[bytes, int] = {}   # key sent to the encoder -> groups waiting for it
        self._held: dict[bytes, list] = {}      # key come back -> [its vector or None, waiters left]
        self._previous: dict[str, dict[tuple[str, str], np.ndarray]] = {}   # source -> its rows in the store
        self._expected: dict[str, None] = {}    # changed files on their way whose rows are not read yet
        self.reads = 0                          # store calls made to read previous rows (the report's reuse_reads)
        self.by_writer = False                  # the writer caches the rows it stores (NOTE, 3)

    @classmethod
    def open(cls, cfg: dict[str, Any], model: ModelRef, backend: str, store: StoreBase, manifest: Any,
             reembed: bool, existed: bool, fresh: bool) -> Reuse:
        """The run's Reuse; records the collection's fingerprint (META) before any row is written. `existed`:
        the collection was there before a `--reembed`; `fresh`: it holds no file now."""
        fp = fingerprint(model, backend, cfg["model"])
        recorded = manifest.get_meta(META)
        store_ok = not reembed and (fresh or recorded == fp) and backend != "null"   # fresh: every row it gets is of
        #                                                           this fingerprint; null: no vector worth reading
        manifest.set_meta(META, fp if fresh or recorded == fp else MIXED)
        cache = None
        c = cfg["cache"]
        measuring = backend == "null" or (kind(store.uri) == "null" and backend != "stub")  # null store: encodes all
        #                                   (the stub backend caches even there: it stands for a GPU run's host)
        if c["vectors_mb"] > 0 and not measuring and model.dim and not (reembed and existed):
            cache = VectorCache(cache_path(c["path"], store), c["vectors_mb"], model.dim)
        return cls(fp, model.dim, store if store_ok else None, cache if cache is not None and cache.usable else None)

    @classmethod
    def attach(cls, col: Collection, cfg: dict[str, Any], reembed: bool) -> Collection:
        """`col` (just opened by `open_collection`) with the run's Reuse, which `col.close` closes; if that fails,
        what `open_collection` took is given back (manifest, lease, store), as its own failures do."""
        try:
            col.reuse = cls.open(cfg, col.model, col.backend, col.store, col.manifest, reembed, col.rebuilt,
                                 fresh=not col.known)
        except BaseException:
            col.manifest.close()
            if col.lease is not None:
                col.lease.release()
            col.store.close()
            raise
        return col

    @property
    def secret(self) -> bytes:
        """What keys are hashed under: the loaders make each chunk's key with it (ChunkSpec.key_secret)."""
        return self._secret

    def plan(self, part: Any, tokens: Pretokenized, keys: list[bytes] | None = None) -> Plan:
        """Where each of the group's vectors comes from (NOTE); the misses' keys are marked as on their way.
        `keys`: the chunks' keys as the loader made them (None: made here)."""
        if keys is None:
            keys = chunk_keys(self._secret, tokens.ids, tokens.lengths) if len(tokens) else []
        plan = Plan(part, keys)
        inflight = self._inflight
        with self._lock:
            memo = self._memo
            if memo.keys().isdisjoint(keys) and inflight.keys().isdisjoint(keys):
                todo = list(range(len(keys)))       # none seen before (the common case): set operations in C
            else:
                todo = []
                for i, k in enumerate(keys):
                    if (v := memo.get(k)) is not None:
                        plan.found[i] = v
                    elif k in inflight:
                        plan.waits.append(i)
                        inflight[k] += 1
                    else:
                        todo.append(i)
        file = part.file
        if todo and self.store is not None and file.old_hash:
            rows = self._rows_of(file.ref.source)
            chunks = part.chunks
            for i in todo:
                row = chunks[i]
                if (v := rows.get((search_text(row), row.element))) is not None:
                    plan.found[i] = v
                    plan.to_cache.append(i)
            todo = [i for i in todo if i not in plan.found]
        if part.last:
            self._previous.pop(file.ref.source, None)
            with self._lock:
                self._expected.pop(file.ref.source, None)
        if todo and self.cache is not None:
            cached = self.cache.get([keys[i] for i in todo])
            if cached:
                for i in todo:
                    if keys[i] in cached:
                        plan.found[i] = cached[keys[i]]
                todo = [i for i in todo if i not in plan.found]
        with self._lock:
            if len(todo) == len(keys) and len(set(keys)) == len(keys) and inflight.keys().isdisjoint(keys):
                plan.misses = todo                  # every chunk to the encoder, each key once
                inflight.update(dict.fromkeys(keys, 0))
            else:
                for i in todo:
                    k = keys[i]
                    if k in inflight:                # an equal chunk earlier in this group
                        plan.waits.append(i)
                        inflight[k] += 1
                    else:
                        plan.misses.append(i)
                        inflight[k] = 0
        plan.tokens = _subset(tokens, plan.misses)
        return plan

    def assemble(self, plan: Plan, encoded: np.ndarray | None) -> np.ndarray | None:
        """The group's vectors in chunk order, from the encoder's rows for its misses (None: dropped by a stop;
        then None). NaN rows (chunks that could not be encoded) are passed on, never kept. Whole arrays a group:
        the per-chunk work is dict operations."""
        keys, misses = plan.keys, plan.misses
        miss_keys = keys if len(misses) == len(keys) else [keys[i] for i in misses]
        with self._lock:
            inflight, held, memo = self._inflight, self._held, self._memo
            waiting = list(map(inflight.pop, miss_keys, repeat(0)))
            if any(waiting):                        # equal chunks of later groups wait for these
                for k, v, w in zip(miss_keys, encoded if encoded is not None else repeat(None), waiting):
                    if w:
                        held[k] = [v, w]
            if encoded is not None and misses:
                finite = np.isfinite(encoded).all(axis=1)
                memo.update(zip(miss_keys, encoded) if finite.all() else
                            ((k, v) for k, v, ok in zip(miss_keys, encoded, finite.tolist()) if ok))
            waited = {i: self._take(keys[i]) for i in plan.waits}
            for i, v in plan.found.items():         # found: the newest again
                memo.pop(keys[i], None)
                memo[keys[i]] = v
            if len(memo) > MEMO_ROWS:               # the older half let go at once, not a key a chunk
                self._memo = dict(islice(memo.items(), len(memo) - MEMO_ROWS // 2, None))
        if encoded is None:
            return None
        if len(misses) == len(keys) and encoded.dtype == np.float32:
            out = encoded                       # every chunk was encoded (the common case): no copy
        else:
            dim = encoded.shape[1] if encoded.ndim == 2 and encoded.shape[1] else next(
                (len(v) for v in (*plan.found.values(), *waited.values()) if v is not None), self.dim)
            out = np.full((len(keys), dim), np.nan, dtype=np.float32)
            if misses:
                out[misses] = encoded
            for i, v in (*plan.found.items(), *waited.items()):
                if v is not None:
                    out[i] = v
        if self.cache is not None and (misses or plan.to_cache):
            rows = [*misses, *plan.to_cache]
            if self.by_writer:                  # 16 bytes a chunk go with its row, not its vector a second time
                self.cache.note([keys[i] for i in rows])    # another process writes them (vector_cache NOTE)
                plan.cache_keys = cache_keys(keys, rows)
            else:
                self.cache.put([keys[i] for i in rows], out if len(rows) == len(out) and not plan.to_cache
                               else out[rows])
        return out

    def cancel(self, plan: Plan) -> None:
        """Forget a plan that will not be encoded (its file stopped before the encoder was up); chunks that
        waited for its misses get NaN rows (their files fail)."""
        with self._lock:
            for i in plan.misses:
                if waiting := self._inflight.pop(plan.keys[i], 0):
                    self._held[plan.keys[i]] = [None, waiting]
            for i in plan.waits:
                k = plan.keys[i]
                if k in self._held:
                    self._take(k)
                elif k in self._inflight:
                    self._inflight[k] -= 1

    def expect(self, source: str) -> None:
        """A changed file is on its way (sent to load): its previous rows are read with others' (NOTE)."""
        if self.store is not None:
            with self._lock:
                self._expected[source] = None

    def close(self) -> None:
        if self.cache is not None:
            self.cache.close()

    # -- internals (under the lock) ------------------------------------------------------
    def _take(self, k: bytes) -> np.ndarray | None:
        """A waiter's vector of `k` (None if it never came); the last waiter lets it go."""
        entry = self._held.get(k)
        if entry is None:
            return None
        entry[1] -= 1
        if entry[1] <= 0:
            del self._held[k]
        return entry[0]

    def _rows_of(self, source: str) -> dict[tuple[str, str], np.ndarray]:
        """The rows of `source` in the store by (search_text, element): their vectors, read with those of the
        changed files expected (NOTE). A store that cannot be read gives nothing (the chunks are encoded; a
        store really gone stops the run at its next write)."""
        rows = self._previous.get(source)
        if rows is None:
            with self._lock:
                self._expected.pop(source, None)
                batch = [source, *islice(self._expected, READ_SOURCES - 1)]
                for s in batch[1:]:
                    del self._expected[s]
            got: dict[str, dict[tuple[str, str], np.ndarray]] = {s: {} for s in batch}
            self.reads += 1
            try:
                for r in self.store.rows(["source", "search_text", "element", "vector"], sources=batch):
                    got[r["source"]][(r["search_text"], r["element"])] = np.asarray(r["vector"], np.float32)
            except StoreError:
                got = {s: {} for s in batch}
            self._previous.update(got)
            rows = got[source]
        return rows


def cache_keys(keys: list[bytes], rows: list[int]) -> bytes:
    """The group's chunks' keys joined, NO_KEY for a chunk not among `rows` (distinct indexes)."""
    if len(rows) == len(keys):
        return b"".join(keys)
    out = [NO_KEY] * len(keys)
    for i in rows:
        out[i] = keys[i]
    return b"".join(out)


def _subset(tokens: Pretokenized, rows: list[int]) -> Pretokenized:
    """The texts and ids of `rows` (increasing) of `tokens`, sliced as arrays (all of them: `tokens` itself)."""
    if len(rows) == len(tokens):
        return tokens
    if not rows:
        return Pretokenized([], np.zeros(0, np.int32), np.zeros(0, np.int32))
    keep = np.zeros(len(tokens), dtype=bool)
    keep[rows] = True
    lengths = np.asarray(tokens.lengths)
    return Pretokenized([tokens.texts[i] for i in rows], np.asarray(tokens.ids)[np.repeat(keep, lengths)],
                        lengths[rows])


def cache_path(setting: str, store: StoreBase) -> Path:
    """[cache] path: "auto" is beside an embedded store (<store>.vectors.sqlite), else the user cache
    (INGEST_CACHE_DIR, else $XDG_CACHE_HOME/ingest) for a server's collections."""
    if setting != "auto":
        return Path(setting).expanduser()
    if store.local_path is not None:
        return Path(f"{store.local_path}.vectors.sqlite")
    return cache_dir() / "vectors.sqlite"
