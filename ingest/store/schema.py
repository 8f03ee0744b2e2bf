"""The collection's fields: their sizes, the rows to upsert (`Columns`), the schema-2 collection
(`collection_schema`) and the upsert request built column by column (`upsert_request`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

TEXT_MAX = 65535          # bytes of UTF-8 in a chunk's text
SOURCE_MAX = 4096         # bytes of UTF-8 in a file's source path
FORMAT_MAX = 16           # bytes in a format name
TITLE_MAX = 1024          # bytes of UTF-8 in a document's title
HEADINGS_MAX = 2048       # bytes of UTF-8 in a chunk's heading path
ELEMENT_MAX = 16          # bytes in an element kind ("text", "table")
BBOX_MAX = 128            # bytes in a "x0,y0,x1,y1" box


@dataclass(frozen=True, eq=False)
class Columns:
    """Rows to upsert, one sequence per field of the collection (see `ensure_collection`; `sparse` is
    not sent: Milvus computes it from search_text). The chunker and the scan keep every string within
    its field's *_MAX bytes."""
    ids: Sequence[str]
    vectors: np.ndarray              # float32, (rows, dim)
    texts: Sequence[str]
    sources: Sequence[str]
    pages: Sequence[int]             # 0 when the format has no pages
    chunks: Sequence[int]
    formats: Sequence[str]
    file_hashes: Sequence[str]
    titles: Sequence[str]            # the document's title (<= TITLE_MAX bytes)
    headings: Sequence[str]          # the chunk's heading path joined with " > " ("" if none; <= HEADINGS_MAX)
    elements: Sequence[str]          # "text" | "table" (<= ELEMENT_MAX bytes)
    bboxes: Sequence[str]            # "x0,y0,x1,y1" in PDF points ("" when none; <= BBOX_MAX bytes)
    search_texts: Sequence[str]      # what BM25 indexes: the context line, "\n", the text (<= TEXT_MAX bytes)


def collection_schema(dim: int, local: bool, bm25: bool) -> tuple[Any, Any]:
    """(schema, index params) of a schema-2 collection; with `bm25`, a sparse field that Milvus fills
    from search_text (a BM25 function) and its index. `local`: Milvus Lite (FLAT index)."""
    from pymilvus import DataType, Function, FunctionType, MilvusClient

    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=64)
    schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
    schema.add_field("page", DataType.INT64)          # 0 when the format has no pages
    schema.add_field("chunk", DataType.INT64)
    for name, size in (("text", TEXT_MAX), ("source", SOURCE_MAX), ("format", FORMAT_MAX), ("file_hash", 64),
                       ("title", TITLE_MAX), ("headings", HEADINGS_MAX), ("element", ELEMENT_MAX), ("bbox", BBOX_MAX)):
        schema.add_field(name, DataType.VARCHAR, max_length=size)
    schema.add_field("search_text", DataType.VARCHAR, max_length=TEXT_MAX, enable_analyzer=bm25,
                     **({"analyzer_params": {"type": "standard"}} if bm25 else {}))
    index = MilvusClient.prepare_index_params()
    # Milvus Lite: FLAT (exact search), as Milvus Lite 2.x always used. Lite 3.x builds HNSW (faiss) for
    # AUTOINDEX on every flush and compaction, in Python: 2.7x the rest of its write cost here, for
    # collections small enough to search exactly in milliseconds. Servers keep AUTOINDEX.
    index.add_index("vector", index_type="FLAT" if local else "AUTOINDEX", metric_type="COSINE")
    if bm25:
        schema.add_field("sparse", DataType.SPARSE_FLOAT_VECTOR)
        schema.add_function(Function(name="search_text_bm25", function_type=FunctionType.BM25,
                                     input_field_names=["search_text"], output_field_names=["sparse"]))
        index.add_index("sparse", index_type="SPARSE_INVERTED_INDEX", metric_type="BM25")
    return schema, index


def upsert_request(collection: str, c: Columns):
    """The UpsertRequest pymilvus would send for these rows. A packed repeated float on the wire is the
    floats' little-endian bytes, so the vector field is parsed from `tobytes()` (a copy, not a conversion)."""
    from pymilvus.grpc_gen import milvus_pb2, schema_pb2

    request = milvus_pb2.UpsertRequest(collection_name=collection, num_rows=len(c.ids))
    for name, values in (("id", c.ids), ("text", c.texts), ("source", c.sources), ("format", c.formats),
                         ("file_hash", c.file_hashes), ("title", c.titles), ("headings", c.headings),
                         ("element", c.elements), ("bbox", c.bboxes), ("search_text", c.search_texts)):
        request.fields_data.add(field_name=name, type=schema_pb2.VarChar).scalars.string_data.data.extend(values)
    for name, values in (("page", c.pages), ("chunk", c.chunks)):
        request.fields_data.add(field_name=name, type=schema_pb2.Int64).scalars.long_data.data.extend(values)
    vectors = np.ascontiguousarray(c.vectors, dtype="<f4")
    if vectors.ndim != 2 or vectors.shape[0] != len(c.ids):
        raise ValueError(f"vectors of shape {vectors.shape} for {len(c.ids)} rows")
    field = request.fields_data.add(field_name="vector", type=schema_pb2.FloatVector)
    field.vectors.dim = vectors.shape[1]
    data = vectors.tobytes()
    field.vectors.float_vector.MergeFromString(b"\x0a" + _varint(len(data)) + data)   # FloatArray.data: field 1, packed
    return request


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)
