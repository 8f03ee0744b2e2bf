"""A server store's manifest and lease, kept in the companion collection `<collection>__files`.

On a Milvus server (http://…) every machine and directory must see the same manifest, so it
lives in the same Milvus as the rows, one row per key:

    file:<blake2b of the source>   one file's `Entry` (the source itself is a field)
    meta:<name>                    a meta value, e.g. the run settings
    lease                          the run that owns the collection now

Keys are hashes and fixed names, never paths: pymilvus's query_iterator pages on
`key > "<last key>"` without escaping it, which a path with a quote or newline would break.
Milvus needs a vector field; `vector` is a dummy of dim 2, always [0, 0].

NOTE (lease protocol): a run writes its lease row (host, pid, run id, expiry, and the boot id
and pid namespace its pid belongs to) on open and renews it every RENEW_EVERY_S with expiry now
+ LEASE_TTL_S from a daemon thread (a heartbeat: a holder that stops renewing is stale after
LEASE_TTL_S); close deletes it. A lease is stale once expired, or at once when its holder's pid
is gone and that pid is one this process can judge: same host name, same boot id
(/proc/sys/kernel/random/boot_id) and same pid namespace, so a killed run does not block the
rerun, while a holder in another container that shares the host name (another pid namespace) or
on another boot is trusted until its heartbeat is stale. Milvus has no compare-and-swap: two
runs that read "free" before either writes could both write. After writing, a run waits
CONFIRM_AFTER_S (far longer than a read-then-write takes) and re-reads; the later writer wins
and the other gives up. If both still passed, the overwritten run finds the other holder at its
next renewal, within RENEW_EVERY_S, and its lease is lost. A lost lease (taken over, or not
renewed in time) is kept in `Lease.lost`; every later manifest write raises `LeaseLost` with
it, and the run checks it to stop. Fencing: before the run deletes rows or writes entries it
re-reads the lease row (`Lease.confirm`, through `ServerManifest.fence`), so a run whose lease
was taken over deletes nothing after the takeover is visible in the server. Expiry compares
wall clocks, so hosts sharing a server need them roughly in sync (well under LEASE_TTL_S).
Lease writes are not flushed (the collection is Strong: every reader sees them at once), which
spares the server's flush budget; a lease row lost to a server crash makes its holder stop at
its next renewal.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, fields
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from ingest.store.manifest import Entry, Summary
from ingest.store.base import StoreError, one_line
from ingest.store.schema import SOURCE_MAX
from ingest.store.lease import LEASE_TTL_S, Holder, LeasedManifest, LeaseRow, companion_name

if TYPE_CHECKING:
    from ingest.store.milvus import Store

PROPS_ROLE = "ingest.role"          # property that marks a companion collection made by ingest
LEASE_KEY, META_PREFIX, FILE_PREFIX = "lease", "meta:", "file:"
CONFIRM_AFTER_S = 0.5
_DUMMY = [0.0, 0.0]
_FIELDS = ["source", "size", "mtime_ns", "file_hash", "status", "chunks", "format", "settings"]


def _file_key(source: str) -> str:
    return FILE_PREFIX + hashlib.blake2b(source.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def _row(key: str, **fields: Any) -> dict[str, Any]:
    """A full row: every field present (Milvus upserts whole rows), the unused ones empty."""
    row = {"key": key, "vector": _DUMMY, "source": "", "size": 0, "mtime_ns": 0, "file_hash": "", "status": "",
           "chunks": 0, "format": "", "settings": "", "value": "", "updated": time.time()}
    row.update(fields)
    return row


def ensure_companion(store: Store) -> str:
    """Create `<collection>__files` on first use (refusing a foreign one of that name); return its name."""
    name = companion_name(store.collection)
    if not store.call("look up the manifest collection", "has_collection", name):
        from pymilvus import DataType, MilvusClient

        schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("key", DataType.VARCHAR, is_primary=True, max_length=64)
        schema.add_field("vector", DataType.FLOAT_VECTOR, dim=len(_DUMMY))
        schema.add_field("source", DataType.VARCHAR, max_length=SOURCE_MAX)
        schema.add_field("size", DataType.INT64)
        schema.add_field("mtime_ns", DataType.INT64)
        schema.add_field("file_hash", DataType.VARCHAR, max_length=128)
        schema.add_field("status", DataType.VARCHAR, max_length=32)
        schema.add_field("chunks", DataType.INT64)
        schema.add_field("format", DataType.VARCHAR, max_length=256)
        schema.add_field("settings", DataType.VARCHAR, max_length=65535)
        schema.add_field("value", DataType.VARCHAR, max_length=65535)      # a meta value or the lease
        schema.add_field("updated", DataType.DOUBLE)
        index = store.client.prepare_index_params()
        index.add_index("vector", index_type="AUTOINDEX", metric_type="L2")
        try:
            store.call("create the manifest collection", "create_collection", name, schema=schema,
                       index_params=index, consistency_level="Strong", properties={PROPS_ROLE: "manifest"})
        except StoreError:
            if not store.call("look up the manifest collection", "has_collection", name):
                raise                                           # else another run created it meanwhile
    props = store.call("describe the manifest collection", "describe_collection", name).get("properties") or {}
    if props.get(PROPS_ROLE) != "manifest":
        raise StoreError(f"collection {name!r} in {store.uri} was not made by ingest; choose another --collection")
    store.call("load the manifest collection", "load_collection", name)
    return name


def read_lease(store: Store) -> Holder | None:
    """The lease row of `store`'s collection, if any (the companion collection must exist)."""
    rows = store.call("read the lease", "get", companion_name(store.collection), ids=[LEASE_KEY],
                      output_fields=["value"])
    if not rows:
        return None
    value = json.loads(rows[0]["value"])
    return Holder(**{f.name: value[f.name] for f in fields(Holder) if f.name in value})


class Lease(LeaseRow):
    """This run's hold on a server collection; `acquire` takes it, `release` gives it back (NOTE: lease protocol)."""
    confirm_after_s = CONFIRM_AFTER_S

    def _prepare(self) -> None:
        ensure_companion(self.store)

    def _read(self) -> Holder | None:
        return read_lease(self.store)

    def _write(self, stale: Holder | None = None) -> None:
        """Milvus has no conditional write: the write-then-confirm of `acquire` and the renewal's re-read stand in."""
        self.me = Holder(**{**asdict(self.me), "expires": time.time() + LEASE_TTL_S})
        self.store.call("write the lease", "upsert", self.name,
                        [_row(LEASE_KEY, value=json.dumps(asdict(self.me)))])

    def _delete(self) -> None:
        holder = read_lease(self.store)
        if holder is not None and holder.run == self.me.run:
            self.store.call("release the lease", "delete", self.name, ids=[LEASE_KEY])


def _files(store: Store, output_fields: list[str]) -> Iterator[dict[str, Any]]:
    """Every file entry of `store`'s companion collection, those fields of it, a batch at a time."""
    name = companion_name(store.collection)
    it = store.call("read the manifest", "query_iterator", name, batch_size=1000,
                    filter=f'key like "{FILE_PREFIX}%"', output_fields=output_fields)
    try:
        while batch := it.next():
            yield from batch
    except Exception as exc:
        raise StoreError(f"cannot read the manifest {name!r} on {store.uri}: {one_line(exc)}; "
                         "check the server, then rerun") from None
    finally:
        it.close()


def read_summary(store: Store) -> Summary | None:
    """The Summary of `store`'s companion collection (`ingest status`), None if it has none; it reads
    only (no lease, nothing created)."""
    name = companion_name(store.collection)
    if not store.call("look up the manifest collection", "has_collection", name):
        return None
    store.call("load the manifest collection", "load_collection", name)
    rows = store.call("read the manifest", "query", name, filter=f'key like "{META_PREFIX}%"',
                      output_fields=["key", "value"])
    counts: dict[tuple[str, str], list[int]] = {}
    for r in _files(store, ["format", "status", "chunks"]):
        n = counts.setdefault((r["format"], r["status"]), [0, 0])
        n[0], n[1] = n[0] + 1, n[1] + r["chunks"]
    return Summary({r["key"][len(META_PREFIX):]: r["value"] for r in rows},
                   [(f, s, n, c) for (f, s), (n, c) in sorted(counts.items())])


class ServerManifest(LeasedManifest):
    """The manifest of a server collection (same interface as `SqliteManifest`); writes need the lease."""

    def get_meta(self, key: str) -> str | None:
        rows = self.store.call("read the manifest", "get", self.name, ids=[META_PREFIX + key],
                               output_fields=["value"])
        return rows[0]["value"] if rows else None

    def set_meta(self, key: str, value: str) -> None:
        self._write([_row(META_PREFIX + key, value=value)])

    def all(self) -> dict[str, Entry]:
        return {r["source"]: Entry(**{f: r[f] for f in _FIELDS}) for r in _files(self.store, _FIELDS)}

    def record(self, entries: Iterable[Entry]) -> None:
        """Upsert entries and flush: durable before it returns (call only after their rows are flushed)."""
        self._write([_row(_file_key(e.source), **e._asdict()) for e in entries])

    def remove(self, sources: Iterable[str]) -> None:
        keys = [_file_key(s) for s in sources]
        if keys:
            self.lease.check()
            self.store.call("delete manifest entries", "delete", self.name, ids=keys)
            self.store.call("flush the manifest", "flush", self.name)

    def clear(self) -> None:
        """Delete every entry and meta value; the lease stays."""
        self.lease.check()
        self.store.call("clear the manifest", "delete", self.name, filter=f'key != "{LEASE_KEY}"')
        self.store.call("flush the manifest", "flush", self.name)

    def _write(self, rows: list[dict[str, Any]]) -> None:
        if rows:
            self.lease.check()
            self.store.call(f"record {len(rows)} manifest entries", "upsert", self.name, rows)
            self.store.call("flush the manifest", "flush", self.name)
