"""The vector store: one Milvus collection, reached through a lazily created MilvusClient.

A local path (./ingest.db) is Milvus Lite, which allows one process per file: `lock()` takes
an exclusive flock on `<db>.lock` so a second `ingest run` fails at once instead of
corrupting the store. A server URI (http://host:19530) reaches Milvus standalone or a
cluster unchanged. The client is created in the process that uses it (checked by pid) and
never carried across a fork.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import re
from pathlib import Path
from typing import Any, Sequence

PROPS_MODEL, PROPS_DIM, PROPS_BACKEND = "ingest.model", "ingest.dim", "ingest.backend"
TEXT_MAX = 65535          # bytes of UTF-8 in a chunk's text
SOURCE_MAX = 4096         # bytes of UTF-8 in a file's source path
FORMAT_MAX = 16           # bytes in a format name


class StoreError(RuntimeError):
    """A store problem the user must act on; the message is one line."""


class StoreRejected(StoreError):
    """The server answered but refused the call (bad data such as an over-long field): the
    problem belongs to the rows sent, not to the store."""


def is_local(uri: str) -> bool:
    return "://" not in uri


def quote(value: str) -> str:
    """A Milvus filter string literal (Milvus Lite has no filter_params templating). Tested safe for
    quotes, backslashes, newlines, tabs and emoji; other control characters are refused by Milvus'
    parser, and sources never hold them (the scan writes them as backslash escapes)."""
    return json.dumps(value, ensure_ascii=False)


class Store:
    """NOTE (timeouts): every call on the client goes through `call`, which passes
    timeout=timeout_s. A call that fails is classified by a short ping: if the server still
    answers, the call was refused (StoreRejected, charged to the rows' files by the writer);
    if not, the store is unreachable or stalled (StoreError: the run stops with one line,
    exit 2, and a rerun resumes from the manifest)."""

    def __init__(self, uri: str, collection: str, timeout_s: float = 60.0):
        self.uri = uri
        self.collection = collection
        self.timeout_s = timeout_s
        self._client = None
        self._pid: int | None = None
        self._lock_file = None

    # -- connection -----------------------------------------------------------------
    @property
    def client(self):
        if self._client is None or self._pid != os.getpid():
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            from pymilvus import MilvusClient

            logging.getLogger("pymilvus").setLevel(logging.CRITICAL)    # errors reach the user as StoreError

            try:
                self._client = MilvusClient(str(Path(self.uri).resolve()) if is_local(self.uri) else self.uri,
                                            timeout=self.timeout_s)
            except Exception as exc:
                raise StoreError(f"cannot open store {self.uri}: {one_line(exc)}; check that the server is "
                                 "running and reachable, then rerun") from None
            self._pid = os.getpid()
        return self._client

    def call(self, what: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """client.method(*args, **kwargs, timeout=timeout_s); a failure becomes StoreRejected or StoreError
        (`what` says what was being done, for the message)."""
        client = self.client
        try:
            return getattr(client, method)(*args, timeout=self.timeout_s, **kwargs)
        except Exception as exc:
            if self._answers():
                raise StoreRejected(f"the store refused to {what}: {one_line(exc)}") from None
            raise StoreError(f"store {self.uri} did not answer (trying to {what}, timeout {self.timeout_s:g} s): "
                             f"{one_line(exc)}; check the server, then rerun: the rerun resumes") from None

    def _answers(self) -> bool:
        try:
            self.client.has_collection(self.collection, timeout=min(5.0, self.timeout_s))
            return True
        except Exception:
            return False

    def lock(self) -> None:
        """Own a Milvus Lite store exclusively for this process (no-op for server URIs)."""
        if not is_local(self.uri) or self._lock_file is not None:
            return
        path = Path(self.uri).resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        f = open(f"{path}.lock", "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            f.close()
            raise StoreError(f"store {self.uri} is in use by {holder}; wait for that run to finish "
                             "(Milvus Lite allows one process per file)") from None
        f.seek(0)
        f.truncate()
        f.write(f"ingest pid {os.getpid()}")
        f.flush()
        self._lock_file = f

    def close(self) -> None:
        if self._client is not None and self._pid == os.getpid():
            try:
                self._client.close()
            except Exception:
                pass
        self._client = None
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    # -- collection -----------------------------------------------------------------
    def exists(self) -> bool:
        return self.call("look up the collection", "has_collection", self.collection)

    def recorded_model(self) -> tuple[str, int] | None:
        """(model, dim) of a collection ingest made; None if missing or not ingest's."""
        recorded = self.recorded()
        return None if recorded is None else recorded[:2]

    def recorded(self) -> tuple[str, int, str] | None:
        """(model, dim, backend) of a collection ingest made (backend "torch" when not recorded:
        collections made before backends existed); None if missing or not ingest's."""
        if not self.exists():
            return None
        props = self.call("describe the collection", "describe_collection", self.collection).get("properties") or {}
        if PROPS_MODEL not in props:
            return None
        return props[PROPS_MODEL], int(props.get(PROPS_DIM, 0)), props.get(PROPS_BACKEND, "torch")

    def ensure_collection(self, model: str, dim: int, backend: str) -> None:
        """Create the collection on first use; refuse one built with another model, dimension or backend."""
        recorded = self.recorded()
        if recorded is None and self.exists():
            raise StoreError(f"collection {self.collection!r} in {self.uri} was not made by ingest; "
                             "choose another --collection")
        if recorded is not None:
            if recorded != (model, dim, backend):
                raise StoreError(
                    f"collection {self.collection!r} holds {recorded[0]} vectors (dim {recorded[1]}, backend "
                    f"{recorded[2]}), not {model} (dim {dim}, backend {backend}); rerun with --reembed to "
                    "replace them, or use another --collection")
            self.call("load the collection", "load_collection", self.collection)
            return
        from pymilvus import DataType, MilvusClient

        schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=64)
        schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
        schema.add_field("text", DataType.VARCHAR, max_length=TEXT_MAX)
        schema.add_field("source", DataType.VARCHAR, max_length=SOURCE_MAX)
        schema.add_field("page", DataType.INT64)          # 0 when the format has no pages
        schema.add_field("chunk", DataType.INT64)
        schema.add_field("format", DataType.VARCHAR, max_length=FORMAT_MAX)
        schema.add_field("file_hash", DataType.VARCHAR, max_length=64)
        index = self.client.prepare_index_params()
        index.add_index("vector", index_type="AUTOINDEX", metric_type="COSINE")
        self.call("create the collection", "create_collection", self.collection, schema=schema, index_params=index,
                  properties={PROPS_MODEL: model, PROPS_DIM: str(dim), PROPS_BACKEND: backend})
        self.call("load the collection", "load_collection", self.collection)

    def drop(self) -> None:
        if self.exists():
            self.call("drop the collection", "drop_collection", self.collection)

    # -- rows -----------------------------------------------------------------------
    def upsert(self, rows: Sequence[dict[str, Any]]) -> None:
        if rows:
            self.call(f"store {len(rows)} rows", "upsert", self.collection, list(rows))

    def delete_stale(self, source: str, file_hash: str) -> None:
        """Remove rows of `source` that belong to an older version of the file."""
        self.call("delete old rows", "delete", self.collection,
                  filter=f"source == {quote(source)} and file_hash != {quote(file_hash)}")

    def delete_version(self, source: str, file_hash: str) -> None:
        """Remove the rows of one version of `source` (a version that failed part-way through)."""
        self.call("delete rows", "delete", self.collection,
                  filter=f"source == {quote(source)} and file_hash == {quote(file_hash)}")

    def delete_source(self, source: str) -> None:
        self.call("delete rows", "delete", self.collection, filter=f"source == {quote(source)}")

    def flush(self) -> None:
        self.call("flush", "flush", self.collection)

    def rows(self, fields: Sequence[str]) -> list[dict[str, Any]]:
        """`fields` of every row (for checks on small stores)."""
        self.call("load the collection", "load_collection", self.collection)
        it = self.call("read rows", "query_iterator", self.collection, filter='id != ""', output_fields=list(fields),
                       batch_size=1000)
        out: list[dict[str, Any]] = []
        while batch := it.next():
            out.extend({f: r[f] for f in fields} for r in batch)
        it.close()
        return out

    def search(self, vector: Sequence[float], k: int) -> list[dict[str, Any]]:
        self.call("load the collection", "load_collection", self.collection)
        hits = self.call("search", "search", self.collection, [list(vector)], limit=k,
                         output_fields=["text", "source", "page", "chunk", "format"])[0]
        return [{"score": float(h["distance"]), "source": h["entity"]["source"],
                 "page": h["entity"]["page"] or None, "chunk": h["entity"]["chunk"],
                 "text": h["entity"]["text"]} for h in hits]


def one_line(exc: BaseException) -> str:
    """The useful part of a pymilvus or gRPC error, on one line."""
    text = " ".join(str(exc).split())
    found = re.search(r'details = "([^"]+)"', text) or re.search(r"message=(.+?)\)>", text)
    return (found.group(1) if found else text)[:300] or type(exc).__name__
