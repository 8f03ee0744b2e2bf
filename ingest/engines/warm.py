"""The pipeline `ingest watch` keeps warm between its syncs: the collection (a Lite store locked and served by its
host all along), the loader pools, the encode pool (its workers' model loaded once) and the writer processes.

NOTE (what is whose): each sync is still a `LocalRun` of its own (ingest/engines/run.py: its scan, its report,
its stop signals, its exit code), with its own dispatcher, events, encode thread (`SyncEncode`), writer and
ledger (`SyncWriter`): only the processes and the open collection are the pipeline's. A sync refreshes what
the collection knows (the manifest) at its start, never closes what is the pipeline's (the sync's view of the
encode pool has a no-op `close` and counts its stats from the sync's start) and leaves the writer processes up.
A store only this process may open (Qdrant's local mode: no host) is opened and closed by each sync, as a run
does, so that `ingest search` reads it between syncs; its writer is then the sync's own thread. A worker that
dies is replaced as in a run (the loader and writer pools, the encode pool's fault protocol). A stop signal
during a sync stops the loader pools (the run's `_interrupt`); watch then ends and `close` stops the rest. The
encode workers are started right after the first sync (`warm`); unused for IDLE_S they are stopped (`rest`)
and started again by the next sync that has something to encode (docs/operations.md).
"""
from __future__ import annotations

import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from ingest import load
from ingest.config import FORMAT_POOLS
from ingest.encode import EncodeStage, start_pool
from ingest.reuse import Reuse
from ingest.store.collection import Collection, open_collection
from ingest.store.writers import WriterPool
from ingest.workers.pool import Pools
from ingest.write import Writer

if TYPE_CHECKING:
    from ingest.encode_pool import EncodePool
    from ingest.model_ref import ModelRef

IDLE_S = 3600.0         # encode workers unused this long are stopped (started again on demand)


def loader_pools(cfg: dict[str, Any]) -> Pools:
    """The loader pools of a run (one per FORMAT_POOLS entry; processes started on first use)."""
    plugins = tuple(cfg["loaders"]["plugins"])
    return Pools({p: cfg["loaders"][p]["workers"] for p in FORMAT_POOLS},
                 {p: cfg["loaders"][p]["timeout_s"] for p in FORMAT_POOLS},
                 load.init_loader_process, (plugins, cfg["limits"]["worker_memory_mb"]))


class Pipeline:
    """What watch keeps between syncs (NOTE); made empty, filled by the first sync, stopped by `close`."""

    def __init__(self, cfg: dict[str, Any]):
        self.cfg = cfg
        self.col: Collection | None = None
        self._pools: Pools | None = None
        self._encoder: tuple[Future, Future] | None = None      # (the EncodePool, its first worker up)
        self._writers: WriterPool | None = None
        self._used = time.monotonic()

    def collection(self, reembed: bool) -> Collection:
        """The collection, opened (and a Lite store served) by the first sync and kept (`col`); later syncs see its
        manifest anew. A store that only this process may open (Qdrant's local mode: no host for `ingest search`
        to go through) is opened anew by each sync, which closes it as a run does: search reads between syncs."""
        self._used = time.monotonic()
        if self.col is not None:
            self.col.known = self.col.manifest.all()
            return self.col
        col = Reuse.attach(open_collection(self.cfg, reembed), self.cfg, reembed)
        if not col.store.caps.hosted:
            return col
        try:
            col.store.serve()                 # Lite: its host up now, for ingest search too (lite_host NOTE)
        except BaseException:
            col.close(release=False)
            raise
        self.col = col
        return col

    def loader_pools(self) -> Pools:
        if self._pools is None:
            self._pools = loader_pools(self.cfg)
        return self._pools

    def encode_stage(self, *args: Any, **kwargs: Any) -> SyncEncode:
        """A sync's encode step (EncodeStage's arguments) on the pipeline's encode pool."""
        return SyncEncode(self, *args, **kwargs)

    def writer(self, *args: Any, **kwargs: Any) -> SyncWriter:
        """A sync's writer (Writer's arguments) on the pipeline's writer processes."""
        return SyncWriter(self, *args, **kwargs)

    def encode_pool(self, model: ModelRef, settings: dict[str, Any]) -> tuple[Future, Future]:
        """(a Future of the sync's view of the EncodePool, a Future done once its first worker is up); the pool is
        made in the background by the first sync that asks (after `rest`, by the next)."""
        self._used = time.monotonic()
        if self._encoder is None:
            self._encoder = start_pool(model, settings)
        made, up = self._encoder
        view: Future = Future()
        made.add_done_callback(lambda f: view.set_exception(f.exception()) if f.exception()
                               else view.set_result(_SyncView(f.result())))
        return view, up

    def warm(self) -> None:
        """Start the encode workers now (watch, after its first sync): the first change need not wait for the model."""
        if self.col is not None:
            self.encode_pool(self.col.model, {**self.cfg["model"], "backend": self.col.backend})

    def writer_pool(self, writer: Writer) -> WriterPool | None:
        """The writer processes (None for a store no other process may open: the sync's writer has its own thread)."""
        if self._writers is None and writer.store.caps.hosted:
            self._writers = WriterPool(writer.store.endpoint(), writer.processes)
        return self._writers

    def rest(self) -> None:
        """Between syncs: stop the encode workers if unused for IDLE_S (the next sync starts them again)."""
        if self._encoder is not None and time.monotonic() - self._used > IDLE_S:
            self._stop_encoder()

    def close(self, release: bool = True) -> None:
        """Stop every process and close the collection (`release`: as Collection.close)."""
        self._stop_encoder()
        for stop in (self._writers, self._pools):
            if stop is not None:
                stop.stop()
        self._writers = self._pools = None
        if self.col is not None:
            self.col.close(release=release)
            self.col = None

    def _stop_encoder(self) -> None:
        encoder, self._encoder = self._encoder, None
        if encoder is not None:             # now if made, else as soon as it is
            encoder[0].add_done_callback(lambda made: made.exception() or made.result().close())


class _SyncView:
    """A sync's view of the pipeline's EncodePool: stats counted from the sync's start; `close` leaves it up."""

    def __init__(self, pool: EncodePool):
        self._pool, self._base = pool, dict(pool.stats)

    @property
    def stats(self) -> dict[str, Any]:
        now = self._pool.stats
        return {k: v - self._base.get(k, 0) if isinstance(v, (int, float)) else v for k, v in now.items()}

    def close(self) -> None:
        """The pipeline's to close."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)


class SyncEncode(EncodeStage):
    """A sync's encode step (EncodeStage) on the pipeline's encode pool, which it never closes."""

    def __init__(self, pipeline: Pipeline, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._pipeline = pipeline

    def start_pool(self) -> None:
        if self._pool is None:
            self._pool, self._up = self._pipeline.encode_pool(self.model, self.settings)


class SyncWriter(Writer):
    """A sync's writer (its ledger, committer and callbacks) on the pipeline's writer processes, left up."""

    def __init__(self, pipeline: Pipeline, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._pool = self._warm = pipeline.writer_pool(self)

    def _stop_pool(self) -> None:
        if self._warm is None:
            super()._stop_pool()
        self._pool = self._warm             # the pipeline's: it stops them
