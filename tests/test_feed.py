"""Feeding the encoder: batches by token budget, the chunker's token ids used as they are, the
null backend through the whole pipeline, torch.compile against eager. Real model, real store."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import cli_env, ingest, run

from ingest.api import EncodePool, Pretokenized
from ingest.chunk import ChunkSpec, page_chunks
from ingest.engines.inflight import InFlight
from ingest.model_ref import resolve_model
from ingest.workers.encode import BatchPlan, load_tokenizer
from ingest.workers.encode._shapes import bucket_by_length

WORDS = "river stone light paper garden engine winter signal harbor market violin copper".split()


def texts(n: int, seed: int = 0, most: int = 150) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(1, most)))) for _ in range(n)]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.fixture(scope="module")
def pool():
    with EncodePool(devices=["cpu"], pretokenized=True) as p:
        yield p


def test_batches_respect_the_token_budget_and_pad_to_a_multiple_of_8() -> None:
    rng = np.random.default_rng(1)
    lengths = rng.integers(3, 257, size=500).astype(np.int32)
    flat = rng.integers(1000, 2000, size=int(lengths.sum())).astype(np.int32)
    plan = BatchPlan(batch_size=64, max_tokens=4096, max_length=256, multiple=8)
    batches = bucket_by_length(flat, lengths, 0, plan)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    seen = np.concatenate([b.positions for b in batches])
    assert sorted(seen.tolist()) == list(range(500))
    for b in batches:
        rows, width = b.ids.shape
        assert rows <= 64 and (rows == 1 or rows * width <= 4096)
        assert width % 8 == 0 and width <= 256 and width >= b.lengths.max()
        for row, position in enumerate(b.positions):
            n = lengths[position]
            assert b.ids[row, :n].tolist() == flat[starts[position]:starts[position] + n].tolist()
            assert not b.ids[row, n:].any()
    shapes = {b.ids.shape[1] for b in batches}
    assert len(shapes) <= 256 // 8


@pytest.mark.parametrize("bounded", [False, True])
def test_every_row_holds_its_ids_cut_at_the_width_and_bounded_batches_repeat_their_last_row(bounded: bool) -> None:
    rng = np.random.default_rng(7)
    for _ in range(200):
        lengths = rng.integers(0, int(rng.choice([9, 70, 300])), size=int(rng.integers(0, 90))).astype(np.int32)
        flat = rng.integers(1, 30000, size=int(lengths.sum())).astype(np.int32)
        plan = BatchPlan(int(rng.integers(1, 70)), int(rng.integers(16, 5000)), int(rng.choice([16, 64, 256])),
                         32 if bounded else int(rng.choice([1, 8])), bounded)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        batches = bucket_by_length(flat, lengths, 5, plan)
        assert sorted(np.concatenate([[], *(b.positions for b in batches)]).tolist()) == list(range(len(lengths)))
        for b in batches:
            rows, width = b.ids.shape
            assert rows >= len(b.positions) and (bounded or rows == len(b.positions)) and b.ids.dtype == np.int32
            positions = b.positions.tolist() + [b.positions[-1]] * (rows - len(b.positions))
            assert b.lengths.tolist() == lengths[positions].tolist()
            for row, position in enumerate(positions):
                n = min(int(lengths[position]), width)
                expected = flat[starts[position]:starts[position] + n].tolist() + [5] * (width - n)
                assert b.ids[row].tolist() == expected


def test_the_chunkers_ids_give_the_same_vectors_as_the_texts(pool: EncodePool) -> None:
    model = resolve_model()
    spec = ChunkSpec(model.tokenizer_file, model.max_seq_length, 200, 30)
    page = page_chunks(1, "\n\n".join(texts(40, seed=2)) + "\nÉté à Zürich: naïve café, 東京 🙂.", spec)
    assert len(page.chunks) > 5 and page.lengths.sum() == len(page.ids)
    [(_, ours)] = list(pool.encode_groups([("page", Pretokenized(page.chunks, page.ids, page.lengths))]))
    assert cosines(ours, pool.encode(list(page.chunks))).min() >= 0.9999
    tok, _ = load_tokenizer(model.tokenizer_file, model.max_seq_length)
    assert [len(e.ids) for e in tok.encode_batch(list(page.chunks))] == page.lengths.tolist()


def test_pool_defaults_on_the_cpu(pool: EncodePool) -> None:
    assert pool.batch_plan == BatchPlan(batch_size=64, max_tokens=3072, max_length=256, multiple=1)
    assert pool.window_size == 512


def test_in_flight_counts_files_loading_and_chunks_waiting() -> None:
    f = InFlight(max_loading=2)
    f.dispatch(), f.dispatch()
    assert not f.may_dispatch(max_chunks=100)            # two files loading
    f.loaded(0, 30)
    assert f.may_dispatch(max_chunks=100) and not f.may_dispatch(max_chunks=30)
    f.dispatch()
    f.loaded(1, 0)                                        # an empty file still counts 1
    f.loaded(2, 80)
    assert f.chunks == 111 and not f.may_dispatch(max_chunks=100)
    f.accepted(2)
    assert f.chunks == 31 and f.may_dispatch(max_chunks=100)
    f.accepted(0), f.accepted(1)
    assert f.empty and f.chunks == 0
    assert InFlight.most_files(2, 100) >= 2 + 100


@pytest.mark.slow
def test_the_smallest_bounds_still_ingest_every_file(work) -> None:
    """One file loading at a time, one chunk ahead: a file of many chunks, an empty one and small ones
    all pass, with the same chunks as under the default bounds."""
    (work / "docs" / "big.txt").write_text("\n\n".join(texts(60, seed=9)))
    (work / "docs" / "empty.txt").write_text("")
    for i in range(8):
        (work / "docs" / f"d{i}.txt").write_text(texts(1, seed=i)[0])
    tight = run(work / "docs", work, "--backend", "null",
                config="[run]\nmax_files_in_flight = 1\nmax_chunks_in_flight = 1\n")
    assert tight.rc == 0, tight.stderr
    (work / "store.db").rename(work / "tight.db")
    default = run(work / "docs", work, "--backend", "null")
    assert default.rc == 0, default.stderr
    outcome = {f["path"]: (f["status"], f["chunks"]) for f in default.report["files"]}
    assert {f["path"]: (f["status"], f["chunks"]) for f in tight.report["files"]} == outcome
    assert outcome["big.txt"][1] > 10 and outcome["empty.txt"][0] == "skipped"


@pytest.mark.slow
def test_compiled_and_eager_outputs_are_equal_on_the_cpu(pool: EncodePool) -> None:
    sample = texts(40, seed=3, most=60)
    with EncodePool(devices=["cpu"], compile=True) as compiled:
        rows = compiled.encode(sample)
    assert cosines(rows, pool.encode(sample)).min() >= 0.9999


def test_null_backend_gives_constant_unit_rows_without_a_model() -> None:
    with EncodePool(backend="null") as null:
        assert null.wait_ready().startup_seconds[0] < 3
        rows = null.encode(["a", "b c d"] * 50)
    assert rows.shape == (100, 384)
    assert np.allclose(np.linalg.norm(rows, axis=1), 1) and np.allclose(rows, rows[0])


@pytest.mark.slow
def test_null_backend_runs_the_whole_pipeline(work) -> None:
    for i in range(6):
        (work / "docs" / f"d{i}.txt").write_text("\n\n".join(texts(6, seed=i)))
    res = run(work / "docs", work, "--backend", "null")
    assert res.rc == 0, res.stderr
    assert res.report["totals"]["backend"] == "null"
    chunks = sum(f["chunks"] for f in res.report["files"])
    assert chunks >= 6 and all(f["status"] == "ingested" for f in res.report["files"])
    dump = ("import json, sys; from ingest.store import Store; s = Store(sys.argv[1], 'documents'); "
            "rows = s.rows(['vector']); print(json.dumps([len(rows), min(r['vector'][0] for r in rows), "
            "max(r['vector'][0] for r in rows)]))")
    proc = subprocess.run([sys.executable, "-c", dump, str(work / "store.db")], capture_output=True, text=True,
                          env=cli_env(), timeout=120)
    count, low, high = json.loads(proc.stdout.strip().splitlines()[-1])
    assert count == chunks and low == pytest.approx(384 ** -0.5) and high == pytest.approx(low)
    searched = ingest("search", "river", "--store", str(work / "store.db"), cwd=work)
    assert searched.rc == 2 and "null backend" in searched.stderr and len(searched.stderr.strip().splitlines()) == 1
