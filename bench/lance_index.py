"""LanceDB's vector index kinds on clustered rows like embeddings: build seconds, query ms, recall@10 against an
exact scan (issue 39: which index `finish` builds past INDEX_ROWS).

    python bench/lance_index.py --rows 150000

Rows: 384-dim unit vectors around 2,000 centres (noise 0.5), queries: 50 rows with a little noise. Each kind is
built on a fresh table in a temporary folder, with lancedb's default parameters for it."""
from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=150_000)
    ap.add_argument("--dim", type=int, default=384)
    a = ap.parse_args()
    import lancedb
    import pyarrow as pa
    from lancedb.index import IvfFlat, IvfHnswSq, IvfPq

    rng = np.random.default_rng(0)
    centres = rng.normal(size=(2000, a.dim)).astype(np.float32)
    v = centres[rng.integers(0, 2000, a.rows)] + 0.5 * rng.normal(size=(a.rows, a.dim)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    rows = pa.table({"id": [str(i) for i in range(a.rows)],
                     "vector": pa.FixedSizeListArray.from_arrays(pa.array(v.ravel()), a.dim)})
    queries = v[rng.integers(0, a.rows, 50)] + 0.05 * rng.normal(size=(50, a.dim)).astype(np.float32)

    def top(table, q, exact: bool) -> set[str]:
        search = table.search(q).distance_type("cosine").limit(10)
        return {r["id"] for r in (search.bypass_vector_index() if exact else search).to_list()}

    print(f"{a.rows:,} rows of {a.dim} dimensions, 50 queries")
    for name, config in [("exact scan", None), ("IVF-Flat", IvfFlat(distance_type="cosine")),
                         ("IVF-PQ", IvfPq(distance_type="cosine")), ("IVF-HNSW-SQ", IvfHnswSq(distance_type="cosine"))]:
        with tempfile.TemporaryDirectory() as folder:
            table = lancedb.connect(folder).create_table("t", rows)
            started = time.perf_counter()
            if config is not None:
                table.create_index("vector", config=config)
            build = time.perf_counter() - started
            truth = [top(table, q, True) for q in queries]
            started = time.perf_counter()
            got = [top(table, q, False) for q in queries]
            ms = (time.perf_counter() - started) / len(queries) * 1000
            recall = np.mean([len(g & t) / 10 for g, t in zip(got, truth)])
            print(f"{name:12s} build {build:6.1f} s   query {ms:6.1f} ms   recall@10 {recall:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
