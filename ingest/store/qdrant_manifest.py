"""A Qdrant server's manifest and lease, in the companion collection `<collection>__files` (no vectors),
one point per key, its id a UUID of a hash of the key, its `kind` in the payload:

    file   one file's `Entry` (the source itself is a payload field)
    meta   a meta value (`key`, `value`), e.g. the run settings
    lease  the run that owns the collection now (`Holder`'s fields)

The collection's metadata {"ingest": {"role": "manifest"}} marks it as ingest's; one without it is refused.

NOTE (lease protocol): as for a Milvus server (`ingest.store.server_manifest` NOTE: the Holder, its
staleness, TTL LEASE_TTL_S = 60 s, renewed every RENEW_EVERY_S = 10 s from a daemon thread, released on
close), except that Qdrant has a conditional upsert, so taking the lease is a compare-and-swap and needs no
confirmation wait: a run writes the lease point with `update_filter` "run is mine, or expires < now, or
run is the stale holder I read", which the server applies atomically to an existing point (a missing
point is written as is). It then re-reads the point: if another run's write won, that run holds it. A
renewal re-reads the point (not ours: lost), refuses to write once its own expiry has passed (lost: another
run may have taken it), then writes with `update_filter` "run is mine". Fencing: `QdrantManifest.fence`
re-reads the lease point before the run deletes rows or writes entries; a lost lease is kept in
`QdrantLease.lost` and every later manifest write raises LeaseLost. Release deletes the point only while it
is still ours (a filtered delete). Every write waits until it is applied (wait=True). Expiry compares wall
clocks, so hosts sharing a server need them roughly in sync. Tested against Qdrant's local mode only (whose
conditional upsert behaves the same), never a Qdrant server here.
"""
from __future__ import annotations

import hashlib
import time
import uuid
from dataclasses import asdict, fields, replace
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from ingest.store.base import StoreError, StoreRejected
from ingest.store.manifest import Entry, Summary
from ingest.store.lease import LEASE_TTL_S, Holder, LeasedManifest, LeaseRow, companion_name

if TYPE_CHECKING:
    from ingest.store.qdrant import QdrantStore

WRITE_POINTS = 1000       # manifest points of one upsert (a server caps a request's size)
_FIELDS = list(Entry._fields)



def key_id(key: str) -> str:
    """The point id of a manifest key ("lease", "meta:<name>", "file:<source>")."""
    return str(uuid.UUID(bytes=hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).digest()))


LEASE_ID = key_id("lease")


def _kind(kind: str) -> Any:
    from qdrant_client import models as m

    return m.Filter(must=[m.FieldCondition(key="kind", match=m.MatchValue(value=kind))])


def ensure_companion(store: QdrantStore) -> str:
    """Create `<collection>__files` on first use (refusing a foreign one of that name); return its name."""
    from qdrant_client import models as m

    name = companion_name(store.collection)
    if not store.has(name):
        try:
            store.call("create the manifest collection", "create_collection", name, vectors_config={},
                       metadata={"ingest": {"role": "manifest"}})
            if not store.local:
                store.call("index the manifest", "create_payload_index", name, "kind",
                           field_schema=m.PayloadSchemaType.KEYWORD, wait=True)
        except StoreRejected:
            if not store.has(name):
                raise                                           # else another run created it meanwhile
    if (store.marks(name) or {}).get("role") != "manifest":
        raise StoreError(f"collection {name!r} in {store.uri} was not made by ingest; choose another --collection")
    return name


def read_lease(store: QdrantStore) -> Holder | None:
    """The lease point of `store`'s collection, if any (the companion collection must exist)."""
    points = store.call("read the lease", "retrieve", companion_name(store.collection), ids=[LEASE_ID],
                        with_payload=True)
    if not points:
        return None
    value = points[0].payload or {}
    return Holder(**{f.name: value[f.name] for f in fields(Holder) if f.name in value})


def read_holder(store: QdrantStore) -> str | None:
    """Who holds `store`'s collection now, None if nobody (or no manifest); reads only."""
    if not store.has(companion_name(store.collection)):
        return None
    holder = read_lease(store)
    return holder.describe() if holder is not None and not holder.stale(time.time()) else None


class QdrantLease(LeaseRow):
    """This run's hold on a server collection; `acquire` takes it, `release` gives it back (NOTE: lease protocol)."""
    row = "point"

    def _prepare(self) -> None:
        ensure_companion(self.store)

    def _read(self) -> Holder | None:
        return read_lease(self.store)

    def _write(self, stale: Holder | None = None) -> None:
        """Write this run's lease point, renewed, where it is ours, expired, or still `stale`'s (update_filter)."""
        from qdrant_client import models as m

        now = time.time()
        self.me = replace(self.me, expires=now + LEASE_TTL_S)
        mine = [m.FieldCondition(key="run", match=m.MatchValue(value=self.me.run))]
        if stale is not None:
            mine += [m.FieldCondition(key="expires", range=m.Range(lt=now)),
                     m.FieldCondition(key="run", match=m.MatchValue(value=stale.run))]
        point = m.PointStruct(id=LEASE_ID, vector={}, payload={"kind": "lease", **asdict(self.me)})
        self.store.call("write the lease", "upsert", self.name, points=[point], update_filter=m.Filter(should=mine),
                        wait=True)

    def _delete(self) -> None:
        from qdrant_client import models as m

        mine = m.Filter(must=[m.HasIdCondition(has_id=[LEASE_ID]),
                              m.FieldCondition(key="run", match=m.MatchValue(value=self.me.run))])
        self.store.call("release the lease", "delete", self.name, points_selector=m.FilterSelector(filter=mine),
                        wait=True)


def _scroll(store: QdrantStore, kind: str, payload: list[str]) -> Iterator[dict[str, Any]]:
    """The payloads of every point of `kind` in the companion collection, a page at a time."""
    name, offset = companion_name(store.collection), None
    while True:
        points, offset = store.call("read the manifest", "scroll", name, scroll_filter=_kind(kind), limit=1000,
                                    offset=offset, with_payload=payload)
        yield from (p.payload or {} for p in points)
        if offset is None:
            return


def read_summary(store: QdrantStore) -> Summary | None:
    """The Summary of `store`'s companion collection (`ingest status`), None if it has none; it reads
    only (no lease, nothing created)."""
    if not store.has(companion_name(store.collection)):
        return None
    meta = {p["key"]: p["value"] for p in _scroll(store, "meta", ["key", "value"])}
    counts: dict[tuple[str, str], list[int]] = {}
    for p in _scroll(store, "file", ["format", "status", "chunks"]):
        n = counts.setdefault((p["format"], p["status"]), [0, 0])
        n[0], n[1] = n[0] + 1, n[1] + p["chunks"]
    return Summary(meta, [(f, s, n, c) for (f, s), (n, c) in sorted(counts.items())])


class QdrantManifest(LeasedManifest):
    """The manifest of a Qdrant server collection (same interface as `SqliteManifest`); writes need the lease."""

    def get_meta(self, key: str) -> str | None:
        points = self.store.call("read the manifest", "retrieve", self.name, ids=[key_id("meta:" + key)],
                                 with_payload=["value"])
        return points[0].payload["value"] if points else None

    def set_meta(self, key: str, value: str) -> None:
        self._write([("meta:" + key, {"kind": "meta", "key": key, "value": value})])

    def all(self) -> dict[str, Entry]:
        return {p["source"]: Entry(**{f: p[f] for f in _FIELDS}) for p in _scroll(self.store, "file", _FIELDS)}

    def record(self, entries: Iterable[Entry]) -> None:
        """Write entries, applied before it returns (call only after their rows are in the store)."""
        now = time.time()
        self._write([("file:" + e.source, {"kind": "file", **e._asdict(), "updated": now}) for e in entries])

    def remove(self, sources: Iterable[str]) -> None:
        ids = [key_id("file:" + s) for s in sources]
        for i in range(0, len(ids), WRITE_POINTS):
            self.lease.check()
            self.store.call("delete manifest entries", "delete", self.name, points_selector=ids[i:i + WRITE_POINTS],
                            wait=True)

    def clear(self) -> None:
        """Delete every entry and meta value; the lease stays."""
        from qdrant_client import models as m

        self.lease.check()
        others = m.Filter(must_not=[m.HasIdCondition(has_id=[LEASE_ID])])
        self.store.call("clear the manifest", "delete", self.name, points_selector=m.FilterSelector(filter=others),
                        wait=True)

    def _write(self, items: list[tuple[str, dict[str, Any]]]) -> None:
        from qdrant_client import models as m

        for i in range(0, len(items), WRITE_POINTS):
            self.lease.check()
            points = [m.PointStruct(id=key_id(k), vector={}, payload=p) for k, p in items[i:i + WRITE_POINTS]]
            self.store.call(f"record {len(points)} manifest entries", "upsert", self.name, points=points, wait=True)
